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
is counted per stream (the pipeline), persistently, and logged with the running total.

A result's sequence number is taken in the same transaction that stores it (`put_numbered`): a
number is never handed out for a result that was not stored, so a gap in a pipeline's `seq`
always means a result was lost (dropped by the policy, and counted).

One connection guarded by a lock serves every thread (pipeline workers put, the publisher
peeks and acks); SQLite calls are short, so contention is small.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INT NOT NULL,
    created REAL NOT NULL,
    stream TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS sequences (
    stream TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

# Warn about drops at most this often: a full outbox drops on every put.
_DROP_WARN_INTERVAL_S = 60.0


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    topic: str
    payload: bytes
    qos: int
    created: float


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
        self._room = threading.Condition()  # `wait`: writers wait here for an ack to make room
        # Queued longer than this, the oldest results are a backlog (an outage, not a burst): see peek.
        self.backlog_age_s = 10.0
        self._busy_timeout_s = busy_timeout_s  # waiting for another process (e.g. the CLI) holding the file
        self._lock = threading.Lock()
        self._acked_total = 0
        self._last_drop_warning = 0.0
        self._dropped_since_warning = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._open()
        except sqlite3.OperationalError:
            # Locked, permissions, disk I/O: the file may be fine, so never move it aside.
            raise
        except sqlite3.DatabaseError as exc:
            # Not a database / malformed: keep the bad file for a post-mortem and start fresh,
            # otherwise the daemon would crash-loop on it for ever.
            aside = self._move_aside()
            log.error(
                "outbox %s is unreadable (%s); moved it to %s and started a new one", self.path, exc, aside
            )
            self._conn = self._open()
        self._count = self._scalar("SELECT COUNT(*) FROM messages")
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

    # -- opening -------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN ourselves, so each operation is one explicit transaction.
        conn = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=self._busy_timeout_s
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL" if self._group_s else "PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
            if "stream" not in columns:  # an outbox written by an earlier version
                conn.execute("ALTER TABLE messages ADD COLUMN stream TEXT NOT NULL DEFAULT ''")
            # quick_check reads every page once: cheap at outbox sizes, and it finds corruption now
            # rather than in the middle of a put from a pipeline thread.
            result = conn.execute("PRAGMA quick_check").fetchone()
            if result is None or result[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check failed: {result[0] if result else 'no answer'}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        self.path.replace(aside)
        # A stale WAL/SHM next to a new database would be replayed into it: move them too.
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                side.replace(aside.with_name(aside.name + suffix))
        return aside

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
            self._conn.execute("COMMIT")
            self._group_started = None

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
            return self._store_in_transaction(topic, make_payload, qos, stream, numbered, now)
        except (sqlite3.Error, OSError):
            # Rolled back (disk full, I/O): the counts kept in memory follow the database again.
            self._count = int(self._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
            self._bytes = int(
                self._conn.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM messages").fetchone()[0]
            )
            raise

    def _store_in_transaction(
        self,
        topic: str,
        make_payload: Callable[[int], bytes],
        qos: int,
        stream: str,
        numbered: bool,
        now: float,
    ) -> tuple[int, int]:
        with self._transaction():
            seq = self._take_sequence(stream) if numbered else 0
            payload = bytes(make_payload(seq))
            full = self._full(len(payload))
            if full and self.when_full == "wait" and self._count:
                raise _NoRoomYet()  # rolled back, the number included
            dropped_new = full and (self.when_full == "drop-newest" or self._count == 0)
            if dropped_new:
                removed = {stream: 1}
                self._count_drops(removed)
            else:
                removed = self._drop_oldest(len(payload))
                cur = self._conn.execute(
                    "INSERT INTO messages(topic, payload, qos, created, stream) VALUES (?, ?, ?, ?, ?)",
                    (topic, sqlite3.Binary(payload), qos, now, stream),
                )
        self._note_drops(removed, now)
        if dropped_new:
            raise OutboxFull(
                f"outbox full ({self._describe_limits()}, when_full: {self.when_full}): "
                f"message {seq or ''} of {stream or topic} dropped"
            )
        self._count += 1
        self._bytes += len(payload)
        row_id = cur.lastrowid
        assert row_id is not None
        return row_id, seq

    def _full(self, adding: int) -> bool:
        over_bytes = self.max_bytes is not None and self._bytes + adding > self.max_bytes
        return self._count + 1 > self.max_messages or over_bytes

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

    def _describe_limits(self) -> str:
        limits = f"{self.max_messages} messages"
        return limits + (f" or {self.max_bytes} bytes" if self.max_bytes is not None else "")

    def _take_sequence(self, stream: str) -> int:
        """The stream's next sequence number (caller holds the lock in a transaction)."""
        self._conn.execute(
            "INSERT INTO sequences(stream, value) VALUES (?, 1) "
            "ON CONFLICT(stream) DO UPDATE SET value = value + 1",
            (stream,),
        )
        row = self._conn.execute("SELECT value FROM sequences WHERE stream = ?", (stream,)).fetchone()
        return int(row[0])

    def next_sequence(self, stream: str) -> int:
        """Next value (1, 2, 3, ...) of a persistent per-stream counter; survives restarts."""
        with self._lock:
            self._check_open()
            with self._transaction():
                return self._take_sequence(stream)

    def peek(
        self, limit: int, exclude: set[int] | frozenset[int] = frozenset(), newest: int = 0
    ) -> list[OutboxMessage]:
        """Up to `limit` messages, skipping the ids in `exclude` (in flight): the oldest first, and,
        with `newest` > 0 while a backlog is queued (more than `limit`, the oldest waiting longer than
        `backlog_age_s`: an outage, not a burst), that many of the newest too, so fresh results are
        not held behind a long backlog."""
        if limit <= 0:
            return []
        select = "SELECT id, topic, payload, qos, created FROM messages ORDER BY id {} LIMIT ?"
        with self._lock:
            self._check_open()
            newest = min(newest, limit - 1) if self._count > limit + len(exclude) else 0
            if newest:
                first = self._conn.execute("SELECT created FROM messages ORDER BY id LIMIT 1").fetchone()
                if first is None or time.time() - float(first[0]) < self.backlog_age_s:
                    newest = 0  # a burst, not a backlog: strictly oldest first
            # Scan from the oldest (and newest) rows: excluded (in-flight) rows are few.
            oldest_rows = self._conn.execute(
                select.format("ASC"), (limit - newest + len(exclude),)
            ).fetchall()
            newest_rows = (
                self._conn.execute(select.format("DESC"), (newest + len(exclude),)).fetchall()
                if newest
                else []
            )
        oldest = [r for r in oldest_rows if r[0] not in exclude][: limit - newest]
        taken = {r[0] for r in oldest}
        fresh = [r for r in newest_rows if r[0] not in exclude and r[0] not in taken][:newest][::-1]
        return [
            OutboxMessage(id=r[0], topic=r[1], payload=bytes(r[2]), qos=r[3], created=r[4])
            for r in oldest + fresh
        ]

    def ack(self, message_id: int) -> bool:
        """Delete a delivered message; False when it was already gone (dropped or acked)."""
        with self._lock:
            self._check_open()
            row = self._conn.execute(
                "SELECT LENGTH(payload) FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            cur = self._conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            removed = cur.rowcount > 0
            if removed:
                self._count -= 1
                self._bytes -= int(row[0]) if row else 0
                self._acked_total += 1
        if removed:
            with self._room:
                self._room.notify_all()
        return removed

    def pending(self) -> int:
        with self._lock:
            return self._count

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
            return {
                "pending": self._count,
                "pending_bytes": self._bytes,
                "dropped": self._dropped,
                "dropped_by_stream": dict(self._dropped_by_stream),
                "acked_total": self._acked_total,
                "when_full": self.when_full,
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._group_s:
                self._commit_group_if_due(force=True)
            self._conn.close()
        with self._room:  # writers waiting for room find it closed
            self._room.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"outbox {self.path} is closed")
