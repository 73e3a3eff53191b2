"""Durable SQLite outbox: the only way results leave the box for MQTT.

A result is written here first (`put`) and removed only when the broker has acknowledged
it (`ack`, called on the PUBACK for its message id). So a result survives a broker outage,
a network loss and a daemon restart; delivery is at-least-once (payloads carry unique ids
so consumers can de-duplicate).

WAL with synchronous=NORMAL: a commit survives a crash of the process; on power loss the
last few commits may be lost, which is the usual trade for not fsyncing every result on
SD cards and eMMC.

The queue is bounded (`max_messages`): a box offline for weeks drops its oldest results,
counts them (`dropped`, persistent) and logs a warning, instead of filling its disk.

One connection guarded by a lock serves every thread (pipeline workers put, the publisher
peeks and acks); SQLite calls are short, so contention is small.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INT NOT NULL,
    created REAL NOT NULL
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


class Outbox:
    """Bounded, durable, thread-safe FIFO of MQTT messages (see module docstring)."""

    def __init__(self, path: Path, max_messages: int = 100_000, *, busy_timeout_s: float = 10.0) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        self.path = Path(path)
        self.max_messages = max_messages
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
        self._dropped = self._scalar(
            "SELECT COALESCE((SELECT value FROM counters WHERE name = 'dropped'), 0)"
        )
        self._closed = False

    # -- opening -------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN ourselves, so each operation is one explicit transaction.
        conn = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=self._busy_timeout_s
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
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
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            # SQLite may already have rolled back (e.g. disk full); don't mask the real error.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _scalar(self, sql: str, args: Iterable[object] = ()) -> int:
        with self._lock:
            row = self._conn.execute(sql, tuple(args)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    # -- queue ---------------------------------------------------------------------------------

    def put(self, topic: str, payload: bytes, qos: int = 1) -> int:
        """Store one message; returns its row id. Drops the oldest rows when full."""
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        now = time.time()
        with self._lock:
            self._check_open()
            overflow = self._count - self.max_messages + 1
            with self._transaction():
                if overflow > 0:
                    cur = self._conn.execute(
                        "DELETE FROM messages WHERE id IN (SELECT id FROM messages ORDER BY id LIMIT ?)",
                        (overflow,),
                    )
                    removed = max(cur.rowcount, 0)
                    self._conn.execute(
                        "INSERT INTO counters(name, value) VALUES('dropped', ?) "
                        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                        (removed,),
                    )
                else:
                    removed = 0
                cur = self._conn.execute(
                    "INSERT INTO messages(topic, payload, qos, created) VALUES (?, ?, ?, ?)",
                    (topic, sqlite3.Binary(bytes(payload)), qos, now),
                )
            row_id = cur.lastrowid
            self._count += 1 - removed
            if removed:
                self._dropped += removed
                self._dropped_since_warning += removed
                if now - self._last_drop_warning >= _DROP_WARN_INTERVAL_S:
                    log.warning(
                        "outbox full (%d messages): dropped %d oldest message(s) since the last warning, "
                        "%d in total; is the broker reachable?",
                        self.max_messages,
                        self._dropped_since_warning,
                        self._dropped,
                    )
                    self._last_drop_warning = now
                    self._dropped_since_warning = 0
        assert row_id is not None
        return row_id

    def next_sequence(self, stream: str) -> int:
        """Next value (1, 2, 3, ...) of a persistent per-stream counter; survives restarts."""
        with self._lock:
            self._check_open()
            with self._transaction():
                self._conn.execute(
                    "INSERT INTO sequences(stream, value) VALUES (?, 1) "
                    "ON CONFLICT(stream) DO UPDATE SET value = value + 1",
                    (stream,),
                )
                row = self._conn.execute("SELECT value FROM sequences WHERE stream = ?", (stream,)).fetchone()
        return int(row[0])

    def peek(self, limit: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[OutboxMessage]:
        """Up to `limit` messages, oldest first, skipping the ids in `exclude` (in flight)."""
        if limit <= 0:
            return []
        with self._lock:
            self._check_open()
            # Scan from the oldest row: excluded (in-flight) rows are few, at most max_inflight.
            rows = self._conn.execute(
                "SELECT id, topic, payload, qos, created FROM messages ORDER BY id LIMIT ?",
                (limit + len(exclude),),
            ).fetchall()
        out = [
            OutboxMessage(id=r[0], topic=r[1], payload=bytes(r[2]), qos=r[3], created=r[4])
            for r in rows
            if r[0] not in exclude
        ]
        return out[:limit]

    def ack(self, message_id: int) -> bool:
        """Delete a delivered message; False when it was already gone (dropped or acked)."""
        with self._lock:
            self._check_open()
            cur = self._conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            removed = cur.rowcount > 0
            if removed:
                self._count -= 1
                self._acked_total += 1
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

    def stats(self) -> dict[str, int]:
        """pending: queued now; dropped: lost to the cap (persistent); acked_total: since open."""
        with self._lock:
            return {"pending": self._count, "dropped": self._dropped, "acked_total": self._acked_total}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"outbox {self.path} is closed")
