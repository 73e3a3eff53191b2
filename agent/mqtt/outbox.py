"""Durable SQLite outbox: the only way results leave the box for MQTT.

A result is written here first (`put`) and removed only when the broker has acknowledged
it (`ack`, called on the PUBACK for its message id). So a result survives a broker outage,
a network loss and a daemon restart; delivery is at-least-once (payloads carry unique ids
so consumers can de-duplicate).

Durability is a choice (`durability`): `crash-safe` (the default) is WAL with synchronous=NORMAL:
a commit survives a crash of the process; on power loss the last few commits may be lost, the
usual trade for not fsyncing every result on SD cards and eMMC. `power-loss-safe` fsyncs
(synchronous=FULL), and to keep the rate up it commits the puts of `commit_interval_s` together:
each put is a savepoint in the open transaction, and a commit every interval makes them durable.
On power loss at most the last interval's results are lost; nothing committed is.

The queue is bounded in messages and in bytes (`max_messages`, `max_bytes`): a box offline for
weeks does not fill its disk. What happens when it is full is a policy (`when_full`):
`drop-oldest` (the default: the newest results matter most), `drop-newest` (the new result is
refused), or `wait` (the writer blocks until the broker takes some: the pipeline stops taking
frames, so its camera drops them and counts them, and nothing already stored is lost). Every drop
is counted per stream (the pipeline), persistently, and logged with the running total. While the
broker is away (the connection says so: `keep_reserve`), the two drop policies apply RESERVE_SHARE
below each bound, so the results made just after it is back find room (see RESERVE_SHARE).

A result's sequence number is taken in the same transaction that stores it (`put_numbered`): a
number is never handed out for a result that was not stored, so a gap in a pipeline's `seq`
always means a result was lost (dropped by the policy, and counted).

One connection guarded by a lock serves every thread (pipeline workers put, the publisher
peeks and acks); SQLite calls are short, so contention is small. The publisher acks the PUBACKs that
arrived together in one transaction (`ack_many`), and `peek` reads the ids first, so the rows in
flight are skipped without reading their payloads.

Opening (agent/mqtt/outbox_file.py): a file that is not a healthy outbox is never used silently.
A damaged one is replaced by a new outbox holding what can still be read from it, another program's
database is moved aside untouched, and a file another process has locked is left alone (OutboxLocked).

Sequence numbers never go backwards, whatever happens to the file. A put stores its number in its
own row (`seq`), so storing a result is one INSERT (one transaction, no separate counter to update);
the `sequences` table takes each stream's last number in every transaction that deletes rows (acks,
drops), so the file always records it: the larger of the table and the queued rows' numbers. Each
stream's counter is also kept in a small
sidecar, `<stem>.sequences.json` beside the outbox, written atomically and fsynced: before a number
is handed out that the sidecar does not cover, the sidecar reserves the next `sequence_block`
numbers (one fsync per block, not per result); a clean close writes the exact values back. On open
a stream continues after the largest of: the table; the sidecar, when the table may lack numbers
that were handed out (the outbox was damaged; or the last run was crash-safe and the machine
rebooted since, or we cannot tell: a power cut can take a crash-safe outbox's last commits, which
are not fsynced, and their results may have been published); and, from a damaged file, its
recovered `sequences` rows and the `seq` of its recovered payloads (JSON objects). After a clean
stop the sidecar is exact, and after a crash of the process the table is (as it is after a power
cut for a power-loss-safe outbox): no number is skipped. Otherwise up to `sequence_block - 1`
numbers may be skipped, never repeated: such a gap marks the damage or the power cut (where results
may have been lost too), and is logged. This relies on a number being published only once its
transaction has committed.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.mqtt.outbox_file import OutboxFile
from agent.mqtt.outbox_sequences import SequenceCounters

log = logging.getLogger(__name__)

# Ids bound in one `IN (...)`: below SQLite's smallest default limit of bound parameters (999).
_IDS_PER_STATEMENT = 500

# Warn about drops at most this often: a full outbox drops on every put.
_DROP_WARN_INTERVAL_S = 60.0

# While the link is down, drop-oldest and drop-newest keep this share of each bound free. After a
# reconnect the first room a drain can free comes a publish/PUBACK round trip (and a delete) later,
# however fast the drain: a result made in that gap (a few ms, more on a busy box) met a full outbox
# and was dropped with the link already back. The reserve holds those results instead; the policy
# drops that much more of what the outage made (drop-oldest: the same oldest rows it would have
# dropped after the reconnect, then often rows already in flight, whose PUBACK freed nothing).
# `wait` drops nothing, so it keeps no reserve.
RESERVE_SHARE = 0.05


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    topic: str
    payload: bytes
    qos: int
    created: float
    stream: str = ""


WHEN_FULL = ("drop-oldest", "drop-newest", "wait")


class _NoRoomYet(Exception):
    """`wait`: the built message does not fit yet (its transaction is rolled back, number included)."""


class OutboxFull(Exception):
    """`drop-newest`: the outbox is full and this message was not stored (it is counted)."""


class Outbox:
    """Bounded, durable, thread-safe FIFO of MQTT messages (see module docstring)."""

    def __init__(
        self,
        path: Path,
        max_messages: int = 100_000,
        *,
        max_bytes: int | None = None,
        when_full: str = "drop-oldest",
        durability: str = "crash-safe",
        commit_interval_s: float = 0.05,
        busy_timeout_s: float = 10.0,
        sequence_block: int = 1000,
    ) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        if when_full not in WHEN_FULL:
            raise ValueError(f"when_full must be one of {', '.join(WHEN_FULL)}, got {when_full!r}")
        self.path = Path(path)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.when_full = when_full
        if durability not in ("crash-safe", "power-loss-safe"):
            raise ValueError(f"durability must be crash-safe or power-loss-safe, got {durability!r}")
        self.durability = durability
        # power-loss-safe: puts are grouped into one fsynced commit per interval (see the docstring).
        self._group_s = commit_interval_s if durability == "power-loss-safe" else 0.0
        self._group_started: float | None = None  # monotonic: when the open group transaction began
        self._committed_upto = 0  # power-loss-safe: the highest row id committed (peek shows no later)
        self._room = threading.Condition()  # `wait`: writers wait here for an ack to make room
        self._reserving = False  # keep_reserve: the link is down
        # Queued longer than this, the oldest results are a backlog (an outage, not a burst): see peek.
        self.backlog_age_s = 10.0
        self._busy_timeout_s = busy_timeout_s  # waiting for another process (e.g. the CLI) holding the file
        self._lock = threading.Lock()
        self._acked_total = 0
        self._last_drop_warning = 0.0
        self._last_wait_warning = 0.0
        self._dropped_since_warning = 0
        self._numbers = SequenceCounters(self.path, sequence_block, grouped=bool(self._group_s))
        self.sequences_path = self._numbers.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn, recovered = OutboxFile(self.path, bool(self._group_s), busy_timeout_s).open_or_recover()
        self._numbers.start(self._conn, recovered)
        # crash-safe: peek reads through its own connection (WAL: a reader and the writer do not block
        # each other), so a put is not held up by the publisher reading. power-loss-safe: acks wait
        # in the open group like puts, and only the writing connection sees them, so it reads too.
        self._read_lock = threading.Lock() if not self._group_s else self._lock
        self._reader = (
            sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=self._busy_timeout_s
            )
            if not self._group_s
            else self._conn
        )
        self._count = self._scalar("SELECT COUNT(*) FROM messages")
        self._committed_upto = self._scalar("SELECT COALESCE(MAX(id), 0) FROM messages")
        self._bytes = self._scalar("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM messages")
        self._dropped = self._scalar(
            "SELECT COALESCE((SELECT value FROM counters WHERE name = 'dropped'), 0)"
        )
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, value FROM counters WHERE name LIKE 'dropped:%'"
            ).fetchall()
        self._dropped_by_stream = {str(name)[len("dropped:") :]: int(value) for name, value in rows}
        self._closed = False
        if self._group_s:
            threading.Thread(target=self._committer, name="outbox-commit", daemon=True).start()

    # -- sequence counters ---------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # Caller holds self._lock. IMMEDIATE takes the write lock up front, so a second process
        # on the same file (e.g. the CLI) waits instead of failing half-way.
        if self._group_s:
            with self._grouped():
                yield
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            # SQLite may already have rolled back (e.g. disk full); don't mask the real error.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextmanager
    def _grouped(self) -> Iterator[None]:
        """power-loss-safe: one savepoint in the group transaction (a failing put undoes only itself);
        the group is committed by the committer thread, or here once the interval has passed."""
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")
            self._group_started = time.monotonic()
        self._conn.execute("SAVEPOINT put")
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK TO put")
                self._conn.execute("RELEASE put")
            raise
        self._conn.execute("RELEASE put")
        self._commit_group_if_due()

    def _commit_group_if_due(self, force: bool = False) -> None:
        """Caller holds self._lock."""
        started = self._group_started
        due = started is not None and (force or time.monotonic() - started >= self._group_s)
        if due and self._conn.in_transaction:
            last = self._conn.execute("SELECT MAX(id) FROM messages").fetchone()[0]
            self._conn.execute("COMMIT")
            self._group_started = None
            if last is not None:
                self._committed_upto = max(self._committed_upto, int(last))

    def _committer(self) -> None:
        """power-loss-safe: commit the open group every interval, even when no more puts come."""
        while True:
            time.sleep(self._group_s)
            with self._lock:
                if self._closed:
                    return
                try:
                    self._commit_group_if_due()
                except sqlite3.Error:
                    log.exception("outbox %s: could not commit", self.path)

    def _scalar(self, sql: str, args: Iterable[object] = ()) -> int:
        with self._lock:
            row = self._conn.execute(sql, tuple(args)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    # -- queue ---------------------------------------------------------------------------------

    def put(self, topic: str, payload: bytes, qos: int = 1, stream: str = "") -> int:
        """Store one message; returns its row id. When full, the `when_full` policy applies."""
        return self.put_numbered(topic, lambda _seq: payload, qos, stream, numbered=False)[0]

    def put_numbered(
        self,
        topic: str,
        make_payload: Callable[[int], bytes],
        qos: int = 1,
        stream: str = "",
        numbered: bool = True,
    ) -> tuple[int, int]:
        """Store the message `make_payload(seq)` builds, with `seq` the stream's next sequence number
        taken in the same transaction; returns (row id, seq). An exception from `make_payload` stores
        nothing and uses no number. When full: `drop-oldest` drops the oldest messages; `drop-newest`
        raises OutboxFull (the number is used: the gap shows the loss, and it is counted); `wait`
        blocks until acks make room (the number is taken once there is room)."""
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        while True:
            now = time.time()
            with self._lock:
                self._check_open()
                if not (self.when_full == "wait" and self._full(0)):
                    try:
                        return self._store(topic, make_payload, qos, stream, numbered, now)
                    except _NoRoomYet:
                        pass
            self._note_waiting(stream or topic, now)
            with self._room:  # `wait`: until an ack makes room (or the outbox closes)
                self._room.wait(0.5)

    def _store(
        self,
        topic: str,
        make_payload: Callable[[int], bytes],
        qos: int,
        stream: str,
        numbered: bool,
        now: float,
    ) -> tuple[int, int]:
        """One put, as one transaction (caller holds the lock)."""
        try:
            return self._store_one(topic, make_payload, qos, stream, numbered, now)
        except (sqlite3.Error, OSError):
            # Rolled back (disk full, I/O): the counts kept in memory follow the database again.
            self._count = int(self._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
            self._bytes = int(
                self._conn.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM messages").fetchone()[0]
            )
            raise

    def _store_one(
        self,
        topic: str,
        make_payload: Callable[[int], bytes],
        qos: int,
        stream: str,
        numbered: bool,
        now: float,
    ) -> tuple[int, int]:
        seq = self._numbers.take(stream) if numbered else 0
        payload = bytes(make_payload(seq))
        full = self._full(len(payload))
        if full and self.when_full == "wait" and self._count:
            raise _NoRoomYet()  # nothing written: the number is taken again once there is room
        dropped_new = full and (self.when_full == "drop-newest" or self._count == 0)
        insert = (
            "INSERT INTO messages(topic, payload, qos, created, stream, seq) VALUES (?, ?, ?, ?, ?, ?)",
            (topic, sqlite3.Binary(payload), qos, now, stream, seq),
        )
        removed: dict[str, int] = {}
        row_id: int | None = None
        if not full and not self._group_s:
            # The common case: one statement is one transaction (atomic, and committed before it
            # returns), so a put costs one round trip into SQLite, not four (BEGIN, COMMIT); on a
            # busy box each round trip waits for the GIL.
            row_id = self._conn.execute(*insert).lastrowid
        else:
            with self._transaction():
                if dropped_new:
                    removed = {stream: 1}
                    self._count_drops(removed)
                    if numbered:
                        self._numbers.keep(
                            self._conn, {stream: seq}
                        )  # the number is used: its gap shows the loss
                else:
                    removed = self._drop_oldest(len(payload))
                    row_id = self._conn.execute(*insert).lastrowid
        if numbered:
            self._numbers.last[stream] = seq
        self._note_drops(removed, now)
        if dropped_new:
            raise OutboxFull(
                f"outbox full ({self._describe_limits()}, when_full: {self.when_full}): "
                f"message {seq or ''} of {stream or topic} dropped"
            )
        self._count += 1
        self._bytes += len(payload)
        assert row_id is not None
        return row_id, seq

    def _full(self, adding: int, reserve: bool | None = None) -> bool:
        """Would `adding` bytes more pass a bound (less the reserve while it is kept, or if `reserve`)?"""
        max_messages, max_bytes = self.max_messages, self.max_bytes
        if (self._reserving if reserve is None else reserve) and self.when_full != "wait":
            max_messages -= int(max_messages * RESERVE_SHARE)
            if max_bytes is not None:
                max_bytes -= int(max_bytes * RESERVE_SHARE)
        over_bytes = max_bytes is not None and self._bytes + adding > max_bytes
        return self._count + 1 > max_messages or over_bytes

    def _drop_oldest(self, size: int) -> dict[str, int]:
        """Drop the oldest messages until one of `size` bytes fits; the drops per stream. Caller holds
        the lock inside a transaction."""
        removed: dict[str, int] = {}
        while self._count and self._full(size):
            rows = self._conn.execute(
                "SELECT id, LENGTH(payload), stream FROM messages ORDER BY id LIMIT 256"
            ).fetchall()
            for row_id, length, row_stream in rows:
                if not self._full(size):
                    break
                self._conn.execute("DELETE FROM messages WHERE id = ?", (row_id,))
                self._count -= 1
                self._bytes -= int(length)
                removed[row_stream] = removed.get(row_stream, 0) + 1
        if removed:
            self._numbers.keep(self._conn)
        self._count_drops(removed)
        return removed

    def _count_drops(self, removed: dict[str, int]) -> None:
        for stream, count in removed.items():
            if not count:
                continue
            for name in ("dropped", f"dropped:{stream}"):
                self._conn.execute(
                    "INSERT INTO counters(name, value) VALUES(?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                    (name, count),
                )

    def _note_drops(self, removed: dict[str, int], now: float) -> None:
        total = sum(removed.values())
        if not total:
            return
        self._dropped += total
        self._dropped_since_warning += total
        for stream, count in removed.items():
            self._dropped_by_stream[stream] = self._dropped_by_stream.get(stream, 0) + count
        if now - self._last_drop_warning >= _DROP_WARN_INTERVAL_S:
            by_stream = ", ".join(f"{s or '-'}: {n}" for s, n in sorted(self._dropped_by_stream.items()))
            log.warning(
                "outbox full (%s, when_full: %s): dropped %d message(s) since the last warning, %d in "
                "total (%s); is the broker reachable?",
                self._describe_limits(),
                self.when_full,
                self._dropped_since_warning,
                self._dropped,
                by_stream,
            )
            self._last_drop_warning = now
            self._dropped_since_warning = 0

    def _note_waiting(self, stream: str, now: float) -> None:
        """`wait`: say so (at most once a minute): the writer is held, so its pipeline takes no frames."""
        if now - self._last_wait_warning < _DROP_WARN_INTERVAL_S:
            return
        self._last_wait_warning = now
        log.warning(
            "outbox full (%s, when_full: wait): %s waits until the broker takes some; its pipeline takes "
            "no frames meanwhile (its camera drops them, counted); is the broker reachable?",
            self._describe_limits(),
            stream,
        )

    def _describe_limits(self) -> str:
        limits = f"{self.max_messages} messages"
        return limits + (f" or {self.max_bytes} bytes" if self.max_bytes is not None else "")

    def next_sequence(self, stream: str) -> int:
        """Next value (1, 2, 3, ...) of a persistent per-stream counter; survives restarts."""
        with self._lock:
            self._check_open()
            value = self._numbers.take(stream)
            with self._transaction():
                self._numbers.keep(self._conn, {stream: value})
            self._numbers.last[stream] = value
            return value

    def peek(
        self, limit: int, exclude: set[int] | frozenset[int] = frozenset(), newest: int = 0
    ) -> list[OutboxMessage]:
        """Up to `limit` messages, skipping the ids in `exclude` (in flight): the oldest first, and,
        with `newest` > 0 while a backlog is queued (more than `limit`, the oldest waiting longer than
        `backlog_age_s`: an outage, not a burst), that many of the newest too, so fresh results are
        not held behind a long backlog."""
        if limit <= 0:
            return []
        # power-loss-safe: only committed rows go out (an uncommitted one lost to a power cut must not
        # have been published under a number that is handed out again).
        # Ids first (in-flight rows are skipped without reading their payloads), then the rows.
        select = "SELECT id FROM messages WHERE id <= ? ORDER BY id {} LIMIT ?"
        with self._read_lock:  # not the write lock: a put is not held up by the publisher reading
            self._check_open()
            visible = self._committed_upto if self._group_s else 1 << 62
            newest = min(newest, limit - 1) if self._count > limit + len(exclude) else 0
            if newest:
                first = self._reader.execute("SELECT created FROM messages ORDER BY id LIMIT 1").fetchone()
                if first is None or time.time() - float(first[0]) < self.backlog_age_s:
                    newest = 0  # a burst, not a backlog: strictly oldest first
            oldest = [
                row_id
                for (row_id,) in self._reader.execute(
                    select.format("ASC"), (visible, limit - newest + len(exclude))
                )
                if row_id not in exclude
            ][: limit - newest]
            fresh: list[int] = []
            if newest:
                taken = set(oldest)
                fresh = [
                    row_id
                    for (row_id,) in self._reader.execute(
                        select.format("DESC"), (visible, newest + len(exclude))
                    )
                    if row_id not in exclude and row_id not in taken
                ][:newest][::-1]
            wanted = oldest + fresh
            if not wanted:
                return []
            rows = {
                row[0]: row
                for row in self._reader.execute(
                    "SELECT id, topic, payload, qos, created, stream FROM messages "
                    f"WHERE id IN ({','.join('?' * len(wanted))})",
                    wanted,
                )
            }
        return [
            OutboxMessage(id=r[0], topic=r[1], payload=bytes(r[2]), qos=r[3], created=r[4], stream=r[5])
            for r in (rows[i] for i in wanted if i in rows)
        ]

    def ack(self, message_id: int) -> bool:
        """Delete a delivered message; False when it was already gone (dropped or acked)."""
        return self.ack_many((message_id,)) == 1

    def ack_many(self, message_ids: Iterable[int]) -> int:
        """Delete delivered messages in one transaction (the publisher collects the PUBACKs that came
        in together); returns how many were still there (the others were dropped or acked)."""
        ids = list(message_ids)
        if not ids:
            return 0
        removed = removed_bytes = 0
        with self._lock:
            self._check_open()
            # power-loss-safe: in the open group (a delete lost to a power cut only means the result
            # is sent again, which at-least-once allows), so an ack costs no fsync of its own.
            with self._transaction():
                for start in range(0, len(ids), _IDS_PER_STATEMENT):
                    chunk = ids[start : start + _IDS_PER_STATEMENT]
                    marks = ",".join("?" * len(chunk))
                    sizes = self._conn.execute(
                        "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM messages "
                        f"WHERE id IN ({marks})",
                        chunk,
                    ).fetchone()
                    self._conn.execute(f"DELETE FROM messages WHERE id IN ({marks})", chunk)
                    removed += int(sizes[0])
                    removed_bytes += int(sizes[1])
                if removed:
                    self._numbers.keep(self._conn)
            self._count -= removed
            self._bytes -= removed_bytes
            self._acked_total += removed
        if removed:
            with self._room:
                self._room.notify_all()
        return removed

    def keep_reserve(self, keep: bool) -> None:
        """The connection's word: True while the link is down (drop-oldest and drop-newest then keep
        RESERVE_SHARE of each bound free for the results made just after it is back), False from the
        CONNACK on."""
        with self._lock:
            self._reserving = keep

    def has_room(self, size: int, spare_reserve: bool = False) -> bool:
        """Would a message of `size` bytes fit without the `when_full` policy applying? With
        `spare_reserve`, also leaving the reserve (RESERVE_SHARE) free, link or no link."""
        with self._lock:
            return not self._full(size, True if spare_reserve else None)

    def pending(self) -> int:
        with self._lock:
            return self._count

    def fill(self) -> float:
        """How full the queue is (0.0 to 1.0): the larger of its share of max_messages and of max_bytes."""
        with self._lock:
            by_bytes = self._bytes / self.max_bytes if self.max_bytes else 0.0
            return max(self._count / self.max_messages, by_bytes)

    def __len__(self) -> int:
        return self.pending()

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._dropped

    def dropped_by_stream(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dropped_by_stream)

    def stats(self) -> dict[str, Any]:
        """pending: queued now (and its bytes); dropped: lost to the limits (persistent, also per
        stream); acked_total: since open."""
        with self._lock:
            stats: dict[str, Any] = {
                "pending": self._count,
                "pending_bytes": self._bytes,
                "dropped": self._dropped,
                "dropped_by_stream": dict(self._dropped_by_stream),
                "acked_total": self._acked_total,
                "when_full": self.when_full,
            }
        stats["oldest_age_s"] = self.oldest_age_s() if stats["pending"] else None
        return stats

    def oldest_age_s(self) -> float | None:
        """How long the oldest queued message has waited (None: empty): a backlog's age."""
        with self._read_lock:
            if self._closed:
                return None
            row = self._reader.execute("SELECT created FROM messages ORDER BY id LIMIT 1").fetchone()
        return None if row is None else round(max(0.0, time.time() - float(row[0])), 3)

    def close(self) -> None:
        with self._read_lock, contextlib.nullcontext() if self._read_lock is self._lock else self._lock:
            # (the only place holding both locks: always in this order)
            if self._closed:
                return
            self._closed = True
            if self._reader is not self._conn:
                self._reader.close()
            try:
                with self._transaction():
                    self._numbers.keep(self._conn)
                if self._group_s:
                    self._commit_group_if_due(force=True)
                exact: dict[str, int] | None = dict(self._numbers.last)
            except sqlite3.Error:
                exact = None  # the reservation stays: numbers may be skipped, never reused
            self._conn.close()  # the last connection: its WAL is checkpointed into the file
            if exact is not None and exact != self._numbers.reserved:
                # A clean stop: the sidecar gets the exact values, so no number is skipped on the
                # next start, even after a reboot.
                try:
                    self._numbers.write_sidecar(exact)
                except OSError as exc:
                    log.warning("outbox %s: cannot write %s: %s", self.path, self.sequences_path, exc)
        with self._room:  # writers waiting for room find it closed
            self._room.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"outbox {self.path} is closed")
