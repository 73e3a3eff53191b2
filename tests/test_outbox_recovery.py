"""A damaged outbox at start: real files written by a real writer process (killed with SIGKILL, so
its WAL holds the last commits, or closed), then damaged as a disk or a person damages them. What
can be read is delivered, nothing is accepted silently, sequence numbers never go backwards; and
one daemon per state dir."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.mqtt import outbox_sequences as sequences_module
from agent.mqtt.outbox import Outbox
from agent.mqtt.outbox_file import OutboxLocked
from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.daemon_fixtures import (
    DEVICE,
    outbox_pending,
    pipeline,
    results_of,
    write_config,
)
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import free_port, wait_until

STREAMS = ("results/a", "results/b")
COUNT, ACKED, BLOCK, CHECKPOINT_AT = 600, 50, 100, 400

# Writes COUNT numbered results (every 11th one large enough to spill into overflow pages), acks
# the oldest ACKED as a broker would, then is killed or closes. Killed, its WAL keeps what came
# after a checkpoint at CHECKPOINT_AT results, as SQLite checkpoints every 1,000 pages on a long run.
WRITER = """
import json, os, signal, sys
from pathlib import Path
from agent.mqtt.outbox import Outbox
path, count, acked, block, end = Path(sys.argv[1]), *map(int, sys.argv[2:5]), sys.argv[5]
box = Outbox(path, sequence_block=block)
box._conn.execute("PRAGMA secure_delete=OFF")  # Debian's SQLite zeroes freed pages; not every build does
for i in range(count):
    if i == int(sys.argv[6]):
        box._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    stream = ("results/a", "results/b")[i % 2]
    pad = "x" * (9000 if i % 11 == 0 else 150)
    box.put_numbered("edge/box/" + stream, lambda seq: json.dumps({"seq": seq, "pad": pad}).encode(),
                     stream=stream)
for message in box.peek(acked):
    box.ack(message.id)
if end == "close":
    box.close()
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""

Row = tuple[int, str, bytes, int, float, str]


def write_outbox(path: Path, end: str = "kill", acked: int = ACKED) -> tuple[list[Row], dict[str, int]]:
    """A real outbox at `path`; returns its queued rows and the highest seq handed out per stream
    (both read from a copy, so the files themselves stay exactly as the writer left them)."""
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(path), str(COUNT), str(acked), str(BLOCK), end,
         str(CHECKPOINT_AT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == (-signal.SIGKILL if end == "kill" else 0), done.stderr
    assert path.with_name(path.name + "-wal").exists() == (end == "kill")
    copy = path.parent / f"reference-{path.name}" / path.name
    copy.parent.mkdir()
    for suffix in ("", "-wal"):
        if path.with_name(path.name + suffix).exists():
            shutil.copy(path.with_name(path.name + suffix), copy.with_name(copy.name + suffix))
    with sqlite3.connect(copy) as db:
        rows = [
            (i, t, bytes(p), q, c, s)
            for i, t, p, q, c, s in db.execute(
                "SELECT id, topic, payload, qos, created, stream FROM messages ORDER BY id"
            )
        ]
        handed = dict(db.execute("SELECT stream, value FROM sequences"))
    assert len(rows) == COUNT - acked and handed == {"results/a": COUNT // 2, "results/b": COUNT // 2}
    return rows, handed


def queued(box: Outbox) -> list[Row]:
    rows = box._conn.execute(
        "SELECT id, topic, payload, qos, created, stream FROM messages ORDER BY id"
    ).fetchall()
    return [(i, t, bytes(p), q, c, s) for i, t, p, q, c, s in rows]


def asides(path: Path, kind: str = "corrupt") -> list[Path]:
    moved = path.parent.glob(f"{path.name}.{kind}-*")
    return sorted(p for p in moved if not p.name.endswith(("-wal", "-shm")))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def assert_seq_goes_on(box: Outbox, handed: dict[str, int], gap_allowed: bool = True) -> None:
    """Each stream's next number is above every one handed out before: the next one, or, where the
    writer was killed and its outbox damaged, above its reservation (a block skipped at most)."""
    for stream, last in handed.items():
        nxt = box.next_sequence(stream)
        assert last < nxt <= (last + BLOCK if gap_allowed else last + 1), (stream, last, nxt)


# --- damage kinds ------------------------------------------------------------------------------


def test_a_garbage_first_page_loses_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first page (header and schema) overwritten after a clean close (everything is in the main
    file): the tables are read from the pages every outbox has them at. All comes back, in order."""
    path = tmp_path / "outbox.db"
    rows, handed = write_outbox(path, "close")
    garbage = (b"\xde\xad garbage " * 400)[:4096]
    with path.open("r+b") as f:
        f.write(garbage)

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    [aside] = asides(path)
    assert aside.read_bytes()[:4096] == garbage  # kept as it was, for a post-mortem
    first = errors(caplog)[0]
    assert first == (
        f"outbox {path} is unreadable (file is not a database); moving it to {aside} and starting a "
        "new outbox with what can still be read from it"
    )
    assert queued(box) == rows  # ids, topics, payloads (overflow pages too), streams: all of them
    recovered = [r for r in caplog.records if ": recovered " in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in recovered] == [
        (
            logging.WARNING,
            f"outbox {path}: recovered {len(rows)} message(s) from {aside} (read its tables at the pages "
            "every outbox has them (its schema page is unreadable)), queued for delivery in their order; "
            "nothing is missing between the oldest recovered and the newest the file records",
        )
    ]
    assert_seq_goes_on(box, handed, gap_allowed=False)  # closed cleanly: the sidecar is exact
    assert box.put("t", b"new") > rows[-1][0]  # ids are never reused either
    box.close()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        Outbox(path).close()  # the new file is a healthy outbox: opened as it is
    assert not caplog.records and asides(path) == [aside]


def test_a_damaged_outbox_that_was_delivered_in_full_brings_nothing_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its pages still hold the delivered messages (SQLite frees pages, it does not wipe them); the
    messages table, read whole, is empty: nothing is sent again."""
    path = tmp_path / "outbox.db"
    _, handed = write_outbox(path, "close", acked=COUNT)
    with path.open("r+b") as f:
        f.write(b"\x00" * 4096)
    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    assert len(box) == 0
    [aside] = asides(path)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if ": recovered " in r.getMessage()] == [
        (
            logging.WARNING,
            f"outbox {path}: recovered 0 message(s) from {aside} (read its tables at the pages every outbox "
            "has them (its schema page is unreadable)), queued for delivery in their order; it held no "
            "message",
        )
    ]
    assert_seq_goes_on(box, handed, gap_allowed=False)
    box.close()


def test_a_garbage_header_the_wal_has_a_copy_of_is_no_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a crash the WAL often holds the newest copy of page 1, and SQLite reads it from there:
    such a file opens as it is, with everything in it."""
    path = tmp_path / "outbox.db"
    rows, handed = write_outbox(path, "kill")
    with path.open("r+b") as f:
        f.write(b"\xde\xad garbage " * 9)
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    assert not caplog.records and not asides(path)
    assert queued(box) == rows
    assert_seq_goes_on(box, handed, gap_allowed=False)
    box.close()


@pytest.mark.parametrize("end", ["close", "kill"])
def test_a_truncated_file_gives_what_survives_and_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, end: str
) -> None:
    """Cut to 40%. Killed: what the WAL holds (everything after the checkpoint) comes back as well."""
    path = tmp_path / "outbox.db"
    rows, handed = write_outbox(path, end)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 5])

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    [aside] = asides(path)
    assert aside.stat().st_size == len(data) * 2 // 5
    assert "database disk image is malformed" in errors(caplog)[0] and str(aside) in errors(caplog)[0]
    got = queued(box)
    assert 0 < len(got) < len(rows)
    assert got == [r for r in rows if r in got]  # each one exact, in the original order
    if end == "kill":
        assert [r for r in rows if r[0] > CHECKPOINT_AT] == [r for r in got if r[0] > CHECKPOINT_AT]
    lost = len(rows) - len(got)
    assert (
        f"recovered {len(got)} message(s) from {aside} (read its tables, found through its schema), "
        f"queued for delivery in their order; about {lost} more could not be read and are lost"
    ) in errors(caplog)[1]
    assert_seq_goes_on(box, handed, gap_allowed=end == "kill")
    box.close()


def test_when_the_tables_roots_are_gone_every_page_is_scanned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Pages 1 and 2 (the schema and the root of `messages`) overwritten: the leaves are found by
    scanning every page. Freed pages may still hold delivered messages: they may come back (at least
    once), and the log says so."""
    path = tmp_path / "outbox.db"
    rows, handed = write_outbox(path, "close")
    with path.open("r+b") as f:
        f.write(b"\xff" * 8192)

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    got = queued(box)
    assert set(rows) <= set(got) and [r[0] for r in got] == sorted(r[0] for r in got)
    assert all(r[0] <= ACKED for r in set(got) - set(rows))  # extra: only the delivered ones
    messages = [r.getMessage() for r in caplog.records]
    assert any("(read a scan of every page (its tables' b-trees are unreadable))" in m for m in messages)
    assert any("messages delivered before the damage may be sent again" in m for m in messages)
    assert_seq_goes_on(box, handed, gap_allowed=False)
    box.close()


def test_a_zero_byte_file_is_damage_not_an_empty_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.db"
    _, handed = write_outbox(path, "close")
    path.write_bytes(b"")

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    [aside] = asides(path)
    assert aside.stat().st_size == 0
    first, second = errors(caplog)[:2]
    assert f"outbox {path} is empty (0 bytes); moving it to {aside}" in first
    assert f"recovered 0 message(s) from {aside}" in second and "none could be read" in second
    assert len(box) == 0
    # The numbers live on in the sidecar: the file took nothing with it.
    assert_seq_goes_on(box, handed, gap_allowed=False)
    box.close()


def test_a_file_with_nothing_readable_still_never_reuses_a_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.db"
    _, handed = write_outbox(path, "kill")
    size = path.stat().st_size
    path.write_bytes(os.urandom(size))
    path.with_name(path.name + "-wal").unlink()

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    assert "none could be read" in errors(caplog)[1]
    assert len(box) == 0
    assert_seq_goes_on(box, handed)
    box.close()


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE users (name TEXT, email TEXT); INSERT INTO users VALUES ('ann', 'ann@example.com');",
        "CREATE TABLE messages (sender TEXT, body TEXT); INSERT INTO messages VALUES ('bob', 'hi');",
    ],
    ids=["other-tables", "other-messages-table"],
)
def test_a_foreign_database_is_moved_aside_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, schema: str
) -> None:
    path = tmp_path / "outbox.db"
    with sqlite3.connect(path) as db:
        db.executescript(schema)
    db.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    with caplog.at_level(logging.INFO, logger="agent.mqtt.outbox"):
        box = Outbox(path)
    [aside] = asides(path, "foreign")
    assert hashlib.sha256(aside.read_bytes()).hexdigest() == digest  # never written into
    assert not asides(path, "corrupt")
    table = schema.split()[2]
    assert errors(caplog) == [
        f"outbox {path} is not an outbox but another program's database (its tables: {table}); "
        f"moving it to {aside}, unchanged, and starting a new outbox"
    ]
    assert not any(": recovered " in r.getMessage() for r in caplog.records)  # nothing of ours in it
    box.put("t", b"ok")
    assert [m.payload for m in box.peek(5)] == [b"ok"]
    box.close()


HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_file_locked_by_another_process_is_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.db"
    rows, handed = write_outbox(path, "close")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        with pytest.raises(OutboxLocked) as raised:
            Outbox(path, busy_timeout_s=0.5)
        assert time.monotonic() - started < 30
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert raised.value.message == (
        f"outbox {path} is locked by another process (database is locked); it was left as it is"
    )
    assert raised.value.hint is not None and f"fuser -v {path}" in raised.value.hint
    # A busy file may well be healthy: it is neither moved nor changed.
    assert not asides(path) and not asides(path, "foreign")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert not errors(caplog)

    box = Outbox(path, sequence_block=BLOCK)  # once the other process is gone, all is there
    assert queued(box) == rows
    assert_seq_goes_on(box, handed, gap_allowed=False)
    box.close()


# --- the sequence counters ---------------------------------------------------------------------


def test_no_number_is_skipped_after_a_crash_or_a_clean_stop_and_none_reused_after_a_power_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A healthy outbox's table is exact after a crash of the process (same boot) and after a clean
    stop; after an unclean stop across a reboot the last commits may have been lost with the
    power, so the sidecar's reservation wins: a gap, logged, never a repeat."""
    path = tmp_path / "outbox.db"
    _, handed = write_outbox(path, "kill")
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
        assert_seq_goes_on(box, handed, gap_allowed=False)  # a crash, same boot: no gap
        handed = {s: v + 1 for s, v in handed.items()}
        box.close()
    assert not caplog.records

    # A clean stop, then a reboot: still no gap (the sidecar was brought down to the exact values).
    monkeypatch.setattr(sequences_module, "_boot_id", lambda: "another-boot")
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
        assert_seq_goes_on(box, handed, gap_allowed=False)
    assert not caplog.records
    reserved = json.loads(box.sequences_path.read_text())["reserved"]
    assert reserved == {s: v + BLOCK for s, v in handed.items()}  # blocks reserved ahead
    handed = {s: v + 1 for s, v in handed.items()}
    # An unclean stop (nothing written back), then a reboot: continue above the reservation.
    box._conn.close()
    monkeypatch.setattr(sequences_module, "_boot_id", lambda: "a-third-boot")
    with caplog.at_level(logging.WARNING, logger="agent.mqtt.outbox"):
        box = Outbox(path, sequence_block=BLOCK)
    for stream, value in reserved.items():
        assert box.next_sequence(stream) == value + 1
    assert caplog.records[0].getMessage() == (
        f"outbox {path}: the machine restarted since the last clean stop (a power cut may have taken "
        f"the last commits), so sequence numbers continue above the reservation in {box.sequences_path}: "
        + ", ".join(f"{s} continues at {v + 1} (the outbox had {handed[s]})" for s, v in reserved.items())
        + "; the numbers in between are skipped, none is reused"
    )
    box.close()


GROUPED_WRITER = """
import os, signal, sys, time
from pathlib import Path
from agent.mqtt.outbox import Outbox
box = Outbox(Path(sys.argv[1]), durability="power-loss-safe", commit_interval_s=0.05, sequence_block=100)
numbers = [box.put_numbered("t", lambda seq: b"%d" % seq, stream="s")[1] for _ in range(30)]
time.sleep(0.5)  # the group is committed (fsynced)
print(max(numbers), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_power_loss_safe_outbox_skips_no_number_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its commits are fsynced, so its table is exact even after a power cut: the sidecar records
    the commit mode, and no block is skipped (a crash-safe outbox skips one: see above)."""
    path = tmp_path / "outbox.db"
    done = subprocess.run([sys.executable, "-c", GROUPED_WRITER, str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert json.loads((tmp_path / "outbox.sequences.json").read_text())["grouped_commits"] is True
    monkeypatch.setattr(sequences_module, "_boot_id", lambda: "another-boot")
    box = Outbox(path, durability="power-loss-safe", sequence_block=BLOCK)
    assert len(box) == 30
    assert box.next_sequence("s") == int(done.stdout) + 1
    box.close()


def test_the_sidecar_is_written_once_per_block_not_per_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[dict[str, Any]] = []
    real = sequences_module.atomic_write_bytes

    def counting(path: Path, data: bytes, *args: Any, **kwargs: Any) -> None:
        writes.append(json.loads(data)["reserved"])
        real(path, data, *args, **kwargs)

    monkeypatch.setattr(sequences_module, "atomic_write_bytes", counting)
    box = Outbox(tmp_path / "outbox.db", sequence_block=BLOCK)
    writes.clear()
    numbers = [box.put_numbered("t", lambda seq: str(seq).encode(), stream="s")[1] for _ in range(250)]
    assert numbers == list(range(1, 251))
    assert writes == [{"s": 100}, {"s": 200}, {"s": 300}]  # durable before 1, 101 and 201 went out
    box.close()
    assert writes[-1] == {"s": 250}  # a clean close writes the exact value back


# --- the daemon --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_daemon_delivers_what_a_damaged_outbox_held_and_seq_goes_on(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    """Results queue while the broker is unreachable; the agent is killed; the outbox's first page
    is overwritten. The restarted agent delivers every queued result to a real mosquitto, and its
    new results are numbered above all of them."""
    path, _ = video
    signs = [pipeline("signs", str(path), loop=True)]
    config = write_config(tmp_path, free_port(), registry_dir, signs)  # nothing listens there
    state = tmp_path / "state"
    outbox = state / "outbox.sqlite"
    agent = start_agent(config)

    wait_until(lambda: outbox_pending(state) >= 6, "results queued while the broker is away", timeout=180,
               interval=0.5, state=lambda: agent.log()[-3000:])  # fmt: skip
    agent.kill()
    reference = tmp_path / "reference"
    reference.mkdir()
    for suffix in ("", "-wal"):
        if outbox.with_name(outbox.name + suffix).exists():
            shutil.copy(outbox.with_name(outbox.name + suffix), reference / f"outbox.sqlite{suffix}")
    with sqlite3.connect(reference / "outbox.sqlite") as db:
        before = [json.loads(p) for (p,) in db.execute("SELECT payload FROM messages ORDER BY id")]
    before = [r for r in before if r.get("pipeline") == "signs"]
    assert [r["seq"] for r in before] == list(range(1, len(before) + 1))
    # On a long run SQLite checkpoints the WAL into the file every 1,000 pages; this short one has
    # it all in its WAL, which holds page 1 too, and SQLite would read page 1 from there. So
    # checkpoint as a long run would have, then damage the header.
    with contextlib.closing(sqlite3.connect(outbox)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with outbox.open("r+b") as f:
        f.write(b"not a database any more " * 4 + b"!!!!")  # the 100-byte header

    settings = yaml.safe_load(config.read_text())
    settings["mqtt"]["port"] = mosquitto.port
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/#")
    ids = {r["id"] for r in before}

    def delivered_all_and_more() -> bool:
        results = results_of(sub.messages)
        return ids <= {r["id"] for r in results} and any(r["seq"] > len(before) for r in results)

    log = start_agent(config).run_until(delivered_all_and_more, "the recovered results and new ones")
    results = results_of(sub.messages)
    old = [r for r in results if r["id"] in ids]
    new = [r for r in results if r["id"] not in ids]
    assert sorted(r["seq"] for r in old) == [r["seq"] for r in before]
    assert {r["id"]: r["seq"] for r in old} == {r["id"]: r["seq"] for r in before}
    # Never a number handed out before; killed, then damaged: above the reservation (1,000 ahead).
    assert new and len(before) < min(r["seq"] for r in new) <= 1001
    [aside] = asides(outbox)
    assert f"ERROR agent.mqtt.outbox: outbox {outbox} is unreadable (file is not a database)" in log
    assert f"moving it to {aside}" in log
    assert f"recovered {len(before)} message(s) from {aside}" in log
    assert "Traceback" not in log


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(
    tmp_path: Path, start_agent: StartAgent
) -> None:
    config = write_config(tmp_path, free_port(), tmp_path / "registry", [])
    state = tmp_path / "state"
    first = start_agent(config)
    wait_until(lambda: read_status(state).get("pid") == first.proc.pid, "the first daemon's status",
               timeout=120, state=lambda: first.log()[-3000:])  # fmt: skip

    started = time.monotonic()
    second = subprocess.run([EDGE_AGENT, "run", "-c", str(config)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert second.returncode == 1, second.stderr
    assert (
        f"error: another edge-agent (pid {first.proc.pid}) is already running on state_dir {state} "
        f"(it holds {state / 'agent.lock'})"
    ) in second.stderr
    assert "one daemon per state_dir" in second.stderr and "Traceback" not in second.stderr
    assert time.monotonic() - started < 60  # it does not wait for the lock
    assert first.poll() is None

    # Reading commands are not blocked by the running daemon.
    listed = subprocess.run([EDGE_AGENT, "models", "list", "-c", str(config), "--json"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    first.stop()

    # The lock goes with the daemon that held it: the next one starts.
    third = start_agent(config)
    wait_until(lambda: read_status(state).get("pid") == third.proc.pid, "the next daemon's status",
               timeout=120, state=lambda: third.log()[-3000:])  # fmt: skip
    third.stop()


@pytest.mark.slow
def test_the_daemon_exits_with_a_clear_error_when_its_outbox_is_locked(tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), tmp_path / "registry", [])
    outbox = tmp_path / "state" / "outbox.sqlite"
    outbox.parent.mkdir()
    write_outbox(outbox, "close")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(outbox)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        done = subprocess.run([EDGE_AGENT, "run", "-c", str(config)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert done.returncode == 1
    assert f"error: outbox {outbox} is locked by another process" in done.stderr
    assert f"hint: is another edge-agent or a tool (sqlite3, a backup) using it? `fuser -v {outbox}`" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not asides(outbox) and not asides(outbox, "foreign")
