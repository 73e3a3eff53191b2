"""The SQLite outbox: durable, bounded, thread-safe, and it survives a corrupt file."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from agent.mqtt.outbox import Outbox
from agent.mqtt.outbox_file import OutboxLocked


def test_put_peek_ack_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    ids = [box.put(f"t/{i}", f"p{i}".encode(), qos=1) for i in range(5)]
    assert ids == sorted(ids)
    assert len(box) == 5 and box.pending() == 5

    first = box.peek(3)
    assert [m.id for m in first] == ids[:3]
    assert [(m.topic, m.payload, m.qos) for m in first] == [
        ("t/0", b"p0", 1),
        ("t/1", b"p1", 1),
        ("t/2", b"p2", 1),
    ]
    assert all(m.created > 0 for m in first)

    # In-flight rows are skipped, the next oldest ones are returned instead.
    assert [m.id for m in box.peek(2, exclude={ids[0], ids[1]})] == ids[2:4]

    assert box.ack(ids[1]) is True
    assert box.ack(ids[1]) is False  # already gone
    assert [m.topic for m in box.peek(10)] == ["t/0", "t/2", "t/3", "t/4"]
    stats = box.stats()
    assert (stats["pending"], stats["dropped"], stats["acked_total"]) == (4, 0, 1)
    assert stats["pending_bytes"] == 8 and stats["dropped_by_stream"] == {}
    box.close()
    box.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        box.put("t", b"x")


def test_messages_and_sequences_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "outbox.db"  # parent dir is created
    box = Outbox(path)
    kept = box.put("edge/d/results/p", b"\x00binary\xff", qos=1)
    gone = box.put("edge/d/results/p", b"second", qos=0)
    box.ack(gone)
    assert [box.next_sequence("people") for _ in range(3)] == [1, 2, 3]
    assert box.next_sequence("cars") == 1
    box.close()

    box = Outbox(path)
    assert [(m.id, m.payload, m.qos) for m in box.peek(10)] == [(kept, b"\x00binary\xff", 1)]
    assert box.next_sequence("people") == 4
    assert box.next_sequence("cars") == 2
    # AUTOINCREMENT: a reopened outbox never reuses an id, so in-flight bookkeeping stays unambiguous.
    assert box.put("t", b"x") > gone
    box.close()


def test_cap_drops_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "outbox.db"
    box = Outbox(path, max_messages=3)
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        for i in range(5):
            box.put("t", f"m{i}".encode())
    assert [m.payload for m in box.peek(10)] == [b"m2", b"m3", b"m4"]
    stats = box.stats()
    assert (stats["pending"], stats["dropped"], stats["acked_total"]) == (3, 2, 0)
    assert any("outbox full" in r.getMessage() for r in caplog.records)
    box.close()

    # The drop count is persistent: it is data loss an operator must be able to see after a restart.
    box = Outbox(path, max_messages=3)
    assert box.dropped == 2 and len(box) == 3
    box.close()


def test_concurrent_puts_lose_nothing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.db")
    per_thread = 250
    errors: list[BaseException] = []
    ids: list[int] = []
    ids_lock = threading.Lock()
    sequences: list[int] = []

    def worker(n: int) -> None:
        try:
            for i in range(per_thread):
                row = box.put(f"t/{n}", f"{n}:{i}".encode())
                seq = box.next_sequence("shared")
                with ids_lock:
                    ids.append(row)
                    sequences.append(seq)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(set(ids)) == 4 * per_thread
    assert sorted(sequences) == list(range(1, 4 * per_thread + 1))

    payloads = [m.payload.decode() for m in box.peek(10_000)]
    assert sorted(payloads) == sorted(f"{n}:{i}" for n in range(4) for i in range(per_thread))
    # Each thread's own messages keep their order.
    for n in range(4):
        mine = [p for p in payloads if p.startswith(f"{n}:")]
        assert mine == [f"{n}:{i}" for i in range(per_thread)]
    box.close()


def test_corrupt_file_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "outbox.db"
    path.write_bytes(b"this is not a database, just garbage " * 200)
    (tmp_path / "outbox.db-wal").write_bytes(b"stale wal")

    with caplog.at_level(logging.ERROR, logger="agent.mqtt.outbox"):
        box = Outbox(path)
    aside = [p for p in tmp_path.glob("outbox.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1
    assert aside[0].read_bytes().startswith(b"this is not a database")
    # The old WAL must not be replayed into the new database (SQLite may also have discarded it).
    assert (
        not (tmp_path / "outbox.db-wal").exists()
        or b"stale wal" not in (tmp_path / "outbox.db-wal").read_bytes()
    )
    assert any("unreadable" in r.getMessage() for r in caplog.records)

    # The fresh outbox works.
    box.put("t", b"ok")
    assert [m.payload for m in box.peek(1)] == [b"ok"]
    box.close()


def test_truncated_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    box = Outbox(path)
    for i in range(200):
        box.put("t", bytes(1000) + str(i).encode())
    box.close()
    # Keep the valid header but cut the pages: "database disk image is malformed".
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])

    box = Outbox(path)
    # What the surviving pages hold is kept (tests/test_outbox_recovery.py has the details).
    assert 0 < len(box) < 200
    assert list(tmp_path.glob("outbox.db.corrupt-*"))
    box.close()


def test_locked_database_is_not_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    Outbox(path).close()
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    try:
        # A busy file is an operational problem, not corruption: it must be left alone.
        with pytest.raises(OutboxLocked, match="is locked by another process"):
            Outbox(path, busy_timeout_s=0.2).close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert not list(tmp_path.glob("outbox.db.corrupt-*"))
