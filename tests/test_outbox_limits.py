"""The outbox's limits and what happens when they are reached (issue 13): bounded by messages and
by bytes, a policy when full (drop the oldest, drop the newest, or wait), every drop counted per
stream, and sequence numbers taken in the same transaction as the result they number."""

from __future__ import annotations

import logging
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.mqtt.outbox import Outbox, OutboxFull
from tests.waits import wait_until


def _put(box: Outbox, stream: str, size: int = 100) -> tuple[int, int]:
    return box.put_numbered("t", lambda seq: f"{stream}:{seq}:".encode().ljust(size, b"."), stream=stream)


def test_the_byte_limit_drops_the_oldest_and_counts_each_stream(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_bytes=1000)  # ten 100-byte results
    for i in range(12):
        _put(box, "results/a" if i % 2 == 0 else "results/b")
    assert box.pending() == 10 and box.stats()["pending_bytes"] == 1000
    assert box.dropped_by_stream() == {"results/a": 1, "results/b": 1} and box.dropped == 2
    # The survivors are the newest ten; the sequence numbers show where the losses were.
    assert [m.payload.split(b":")[:2] for m in box.peek(2)] == [[b"results/a", b"2"], [b"results/b", b"2"]]
    box.close()
    again = Outbox(tmp_path / "o.db", max_bytes=1000)  # the counts are persistent
    assert (
        again.dropped_by_stream() == {"results/a": 1, "results/b": 1}
        and again.stats()["pending_bytes"] == 1000
    )
    again.close()


def test_drop_newest_refuses_the_new_result_and_leaves_a_gap_in_its_stream(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_messages=100, when_full="drop-newest")
    for _ in range(100):
        _put(box, "results/a")
    with pytest.raises(OutboxFull, match="message 101 of results/a dropped"):
        _put(box, "results/a")
    assert box.pending() == 100 and box.dropped_by_stream() == {"results/a": 1}
    box.ack(box.peek(1)[0].id)
    assert _put(box, "results/a")[1] == 102  # 101 is the gap that shows the loss
    assert [m.payload.split(b":")[1] for m in box.peek(1)] == [b"2"]  # nothing stored was dropped
    box.close()


def test_wait_blocks_the_writer_until_an_ack_makes_room_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.mqtt.outbox")
    box = Outbox(tmp_path / "o.db", max_messages=100, when_full="wait")
    for _ in range(100):
        _put(box, "results/a")
    stored: list[int] = []
    writer = threading.Thread(target=lambda: stored.append(_put(box, "results/a")[1]))
    writer.start()
    # The writer says it waits once it found no room, just before it starts waiting: by then a writer
    # that did not block would have stored.
    waiting = "results/a waits until the broker takes some"
    wait_until(
        lambda: any(waiting in r.getMessage() for r in list(caplog.records)),
        "the writer to find the outbox full and wait",
        timeout=10,
    )
    assert stored == [] and writer.is_alive()
    box.ack(box.peek(1)[0].id)
    wait_until(lambda: stored == [101], "the waiting writer stores once there is room", timeout=10)
    writer.join(10)
    assert box.dropped == 0 and box.pending() == 100
    box.close()


def test_wait_gives_up_when_the_outbox_closes(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_messages=100, when_full="wait")
    for _ in range(100):
        _put(box, "s")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            _put(box, "s")
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    box.close()
    writer.join(10)
    assert not writer.is_alive() and isinstance(errors[0], RuntimeError)


def test_a_result_that_cannot_be_built_uses_no_sequence_number(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    assert _put(box, "results/a")[1] == 1

    def too_big(seq: int) -> bytes:
        raise ValueError(f"result {seq} is over the limit")

    with pytest.raises(ValueError, match="result 2 is over the limit"):
        box.put_numbered("t", too_big, stream="results/a")
    assert _put(box, "results/a")[1] == 2 and box.pending() == 2
    box.close()


def test_an_outbox_from_an_earlier_version_is_opened_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
            "payload BLOB NOT NULL, qos INT NOT NULL, created REAL NOT NULL);"
            "CREATE TABLE sequences (stream TEXT PRIMARY KEY, value INTEGER NOT NULL);"
            "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
            "INSERT INTO messages(topic, payload, qos, created) VALUES ('t', x'7b7d', 1, 1.0);"
            "INSERT INTO sequences VALUES ('results/a', 41);"
        )
    box = Outbox(path)
    assert [m.payload for m in box.peek(5)] == [b"{}"] and box.stats()["pending_bytes"] == 2
    assert _put(box, "results/a")[1] == 42
    box.close()


def test_power_loss_safe_groups_commits_and_a_killed_writer_loses_nothing_committed(tmp_path: Path) -> None:
    """power-loss-safe: puts are savepoints in a group transaction committed every interval (fsynced).
    A writer killed with SIGKILL after an interval has passed loses none of its results."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from agent.mqtt.outbox import Outbox\n"
        "box = Outbox(Path(sys.argv[1]), durability='power-loss-safe', commit_interval_s=0.05)\n"
        "for i in range(500):\n"
        "    box.put_numbered('t', lambda seq: str(seq).encode(), stream='s')\n"
        "time.sleep(0.5)\n"
        "print('stored', flush=True)\n"
        "time.sleep(60)\n"
    )
    path = tmp_path / "o.db"
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "stored"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    box = Outbox(path, durability="power-loss-safe")
    assert [int(m.payload) for m in box.peek(1000)] == list(range(1, 501))
    assert _put(box, "s")[1] == 501
    # A failing put inside a group undoes only itself.
    with pytest.raises(ValueError):
        box.put_numbered("t", lambda seq: (_ for _ in ()).throw(ValueError("bad")), stream="s")
    assert _put(box, "s")[1] == 502 and box.pending() == 502
    box.close()
    assert Outbox(path).pending() == 502  # close committed the open group


def test_peek_gives_part_of_the_window_to_the_newest_while_a_backlog_is_queued(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    ids = [box.put("t", str(i).encode()) for i in range(100)]
    # Just put: a burst, not a backlog: oldest first only.
    assert [m.id for m in box.peek(10, newest=4)] == ids[:10]
    box.backlog_age_s = 0.0  # as if they had waited through an outage
    # A backlog (100 queued, a window of 10): 6 of the oldest, 4 of the newest, each in order.
    assert [m.id for m in box.peek(10, newest=4)] == ids[:6] + ids[-4:]
    # In-flight rows are skipped on both ends.
    assert [m.id for m in box.peek(10, exclude={ids[0], ids[-1]}, newest=4)] == ids[1:7] + ids[-5:-1]
    # No backlog (all of it fits the window): oldest first only.
    for row in ids[:95]:
        box.ack(row)
    assert [m.id for m in box.peek(10, newest=4)] == ids[95:]
    box.close()


def test_power_loss_safe_publishes_only_committed_results(tmp_path: Path) -> None:
    """A result not yet in a committed group is not handed to the publisher: a power cut could lose
    it after it was published, and its number would be handed out again."""
    box = Outbox(tmp_path / "o.db", durability="power-loss-safe", commit_interval_s=3600)
    box.put("t", b"first")  # opens a group that commits only after an hour (or on close)
    assert box.peek(10) == []
    box.close()
    again = Outbox(tmp_path / "o.db", durability="power-loss-safe")
    assert [m.payload for m in again.peek(10)] == [b"first"]  # committed on close, visible after it
    again.close()


def test_a_killed_writer_s_numbers_are_on_file_in_the_rows_and_after_acks_in_the_table(
    tmp_path: Path,
) -> None:
    """A put writes only its row (one statement); the number is on file with it, and when rows are
    acked the `sequences` table takes it. Without the sidecar (so the file alone tells), a killed
    writer's streams continue after their last number whether their rows are queued or delivered."""
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from agent.mqtt.outbox import Outbox\n"
        "box = Outbox(Path(sys.argv[1]))\n"
        "for i in range(300):\n"
        "    box.put_numbered('t', lambda seq: str(seq).encode(), stream=('a', 'b')[i % 2])\n"
        "box.ack_many(m.id for m in box.peek(1000) if m.id % 2 == 0)\n"  # ids 2, 4, ...: every b
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    path = tmp_path / "o.db"
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    path.with_name("o.sequences.json").unlink()
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT stream, value FROM sequences")) == {"a": 150, "b": 150}
        queued = db.execute("SELECT stream, COUNT(*), MAX(seq) FROM messages GROUP BY stream").fetchall()
    assert queued == [("a", 150, 150)]
    box = Outbox(path)
    assert _put(box, "a")[1] == 151 and _put(box, "b")[1] == 151
    box.close()


def test_acks_together_remove_only_what_is_still_queued(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_messages=100)
    ids = [_put(box, "s")[0] for _ in range(10)]
    assert box.ack_many(ids[:4]) == 4
    assert box.ack_many([*ids[2:6], 10_000]) == 2  # two already gone, one never there
    assert box.ack_many([]) == 0
    stats = box.stats()
    assert stats["pending"] == 4 and stats["acked_total"] == 6
    assert stats["pending_bytes"] == sum(len(m.payload) for m in box.peek(10))
    assert [m.id for m in box.peek(10)] == ids[6:]
    box.close()
