"""The outbox's file (agent/mqtt/outbox.py): opened and checked, and when it is not a healthy
outbox, replaced by a new one that holds what could still be read from it.

A new outbox is built under a temporary name and renamed into place, so an outbox file that exists
is never legitimately empty or without its tables. A file that is not one is never used silently:
- damaged (not a database, malformed, 0 bytes, no tables): what can still be read from it and its
  WAL (agent/mqtt/salvage.py) goes into a new outbox, in its order, which then takes its place;
  the damaged files are moved aside (`<name>.corrupt-<time>`), and an ERROR names both paths, a
  second line how many messages were recovered and about how many could not be read;
- another program's database (tables, none of them ours): moved aside (`<name>.foreign-<time>`),
  never written into, and a new outbox started;
- locked by another process: OutboxLocked (after `busy_timeout_s`); the file is left as it is,
  since it may well be healthy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from agent.errors import EdgeAgentError
from agent.fsutil import fsync_dir, temp_name
from agent.mqtt.salvage import Salvage, salvage

log = logging.getLogger("agent.mqtt.outbox")  # one logger for the outbox, whichever part speaks

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INT NOT NULL,
    created REAL NOT NULL,
    stream TEXT NOT NULL DEFAULT '',
    seq INTEGER NOT NULL DEFAULT 0
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

# The columns a `messages` table must have for a file to be an outbox (`stream` came later).
_MESSAGE_COLUMNS = {"id", "topic", "payload", "qos", "created"}


class OutboxLocked(EdgeAgentError):
    """Another process holds a lock on the outbox file; it is left alone (it may be healthy)."""


class _Damaged(Exception):
    """The file is not a usable outbox; what it holds is recovered."""


class _Foreign(Exception):
    """The file is another program's database: it is moved aside, not read and not written."""


@dataclass
class _Restored:
    """What a recovery put into the new outbox."""

    count: int = 0
    first_id: int = 0
    last_id: int = 0
    payload_seqs: dict[str, int] | None = None


class OutboxFile:
    """Opens the outbox's SQLite file: checked, and replaced when it is not a healthy outbox."""

    def __init__(self, path: Path, grouped: bool, busy_timeout_s: float) -> None:
        self.path = path
        self.grouped = grouped  # power-loss-safe: synchronous=FULL
        self.busy_timeout_s = busy_timeout_s

    def open_or_recover(self) -> tuple[sqlite3.Connection, dict[str, int] | None]:
        """The connection, and when the file was damaged the sequence values recovered from it."""
        for stale in self.path.parent.glob(self.path.name + ".tmp-*"):  # a build a crash cut short
            with contextlib.suppress(OSError):
                stale.unlink()
        if not self.path.exists():
            if not self._side_files(self.path)[0].exists():
                self._install(self._build(None)[0])
                return self._open(), None
            # A WAL without its database would be replayed into a new one: recover from it instead.
            problem: Exception = _Damaged("is missing, but its write-ahead log is there")
        else:
            try:
                return self._open(), None
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise OutboxLocked(
                        f"outbox {self.path} is locked by another process ({exc}); it was left as it is",
                        hint=f"is another edge-agent or a tool (sqlite3, a backup) using it? `fuser -v "
                        f"{self.path}` shows which process; stop it, then start again",
                    ) from None
                raise  # permissions, disk I/O: the file may be fine, so it is never moved aside
            except (sqlite3.DatabaseError, _Damaged, _Foreign) as exc:
                problem = exc
        return self._replace(problem)

    def _open(self) -> sqlite3.Connection:
        """Open the existing outbox; _Damaged, _Foreign or sqlite3 errors when it is not usable."""
        self._check()
        # isolation_level=None: we issue BEGIN ourselves, so each operation is one explicit transaction.
        conn = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=self.busy_timeout_s
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL" if self.grouped else "PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
            if "stream" not in columns:  # an outbox written by an earlier version
                conn.execute("ALTER TABLE messages ADD COLUMN stream TEXT NOT NULL DEFAULT ''")
            if "seq" not in columns:  # written before a row carried its own number
                conn.execute("ALTER TABLE messages ADD COLUMN seq INTEGER NOT NULL DEFAULT 0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _check(self) -> None:
        """Is the file a healthy outbox? Read-only: another program's database is not changed, and
        a damaged file is kept as it is (a writable connection would checkpoint its WAL into it when
        closed)."""
        if self.path.stat().st_size == 0:
            # SQLite takes an empty file for an empty database; an outbox is never created empty.
            raise _Damaged("is empty (0 bytes)")
        conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=self.busy_timeout_s
        )
        try:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            if not tables:
                raise _Damaged("is a database without any table (an outbox is created with its tables)")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
            if not columns >= _MESSAGE_COLUMNS:
                raise _Foreign(
                    "is not an outbox but another program's database (its tables: "
                    f"{', '.join(sorted(tables))})"
                )
            # quick_check reads every page once: cheap at outbox sizes, and it finds corruption now
            # rather than in the middle of a put from a pipeline thread.
            result = conn.execute("PRAGMA quick_check").fetchone()
            if result is None or result[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check failed: {result[0] if result else 'no answer'}")
        finally:
            conn.close()

    def _replace(self, problem: Exception) -> tuple[sqlite3.Connection, dict[str, int] | None]:
        """Move an unusable file aside and put a new outbox in its place, holding what could be read
        from a damaged one. The new outbox is complete before the old file moves: a crash on the way
        leaves the damaged file where it was, and the next start does it again."""
        foreign = isinstance(problem, _Foreign)
        aside = self._aside_name("foreign" if foreign else "corrupt")
        if foreign:
            log.error(
                "outbox %s %s; moving it to %s, unchanged, and starting a new outbox",
                self.path,
                problem,
                aside,
            )
        else:
            reason = problem if isinstance(problem, _Damaged) else f"is unreadable ({problem})"
            log.error(
                "outbox %s %s; moving it to %s and starting a new outbox with what can still be read from it",
                self.path,
                reason,
                aside,
            )
        found = None if foreign else salvage(self.path)
        try:
            built, restored = self._build(found)
        finally:
            if found is not None:
                found.close()
        self._move_aside(aside)
        self._install(built)
        conn = self._open()
        if found is None:
            return conn, None
        self._report_recovery(found, restored, aside)
        recovered = dict(found.sequences)
        for stream, seq in (restored.payload_seqs or {}).items():
            recovered[stream] = max(recovered.get(stream, 0), seq)
        return conn, recovered

    def _build(self, found: Salvage | None) -> tuple[Path, _Restored]:
        """A new outbox under a temporary name, holding what `found` recovered."""
        tmp = temp_name(self.path)
        try:
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                restored = _restore(conn, found) if found is not None else _Restored()
            finally:
                conn.close()  # checkpoints the WAL into the file and removes it
        except BaseException:
            for path in (tmp, *self._side_files(tmp)):
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        return tmp, restored

    def _install(self, built: Path) -> None:
        os.replace(built, self.path)
        fsync_dir(self.path.parent)

    def _report_recovery(self, found: Salvage, restored: _Restored, aside: Path) -> None:
        complete = False
        if restored.count:
            missing = max(found.max_id, restored.last_id) - restored.first_id + 1 - restored.count
            complete = missing == 0
            lost = (
                "nothing is missing between the oldest recovered and the newest the file records"
                if complete
                else f"about {missing} more could not be read and are lost (ids missing between the "
                "oldest recovered and the newest the file records)"
            )
        elif found.complete:
            complete, lost = True, "it held no message"
        else:
            lost = "how many it held is unknown: none could be read"
        level = logging.WARNING if complete else logging.ERROR
        log.log(
            level,
            "outbox %s: recovered %d message(s) from %s (read %s), queued for delivery in their order; %s",
            self.path,
            restored.count,
            aside,
            found.how,
            lost,
        )
        if found.may_repeat_delivered:
            log.warning(
                "outbox %s: every page of %s was scanned, so messages delivered before the damage may be "
                "sent again (consumers de-duplicate by id)",
                self.path,
                aside,
            )

    def _aside_name(self, kind: str) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.{kind}-{stamp}")
        n = 1
        while aside.exists():
            aside = self.path.with_name(f"{self.path.name}.{kind}-{stamp}-{n}")
            n += 1
        return aside

    @staticmethod
    def _side_files(path: Path) -> list[Path]:
        return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]

    def _move_aside(self, aside: Path) -> None:
        if self.path.exists():
            self.path.replace(aside)
        # A stale WAL/SHM next to a new database would be replayed into it: move them too.
        for side, moved in zip(self._side_files(self.path), self._side_files(aside), strict=True):
            if side.exists():
                side.replace(moved)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


def _restore(conn: sqlite3.Connection, found: Salvage) -> _Restored:
    """Put the recovered messages (in their order, with their ids) and drop counters into a new
    outbox; new ids continue above every id the damaged file used."""
    restored = _Restored(payload_seqs={})
    seqs: dict[str, int] = {}
    conn.execute("BEGIN")
    for message in found.messages():
        conn.execute(
            "INSERT INTO messages(id, topic, payload, qos, created, stream, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (message.id, message.topic, sqlite3.Binary(message.payload), message.qos, message.created,
             message.stream, message.seq),
        )  # fmt: skip
        restored.count += 1
        restored.first_id = restored.first_id or message.id
        restored.last_id = message.id
        if message.stream:
            seq = _payload_seq(message.payload)
            if seq is not None:
                seqs[message.stream] = max(seqs.get(message.stream, 0), seq)
    conn.executemany("INSERT INTO counters(name, value) VALUES (?, ?)", sorted(found.counters.items()))
    if found.max_id:
        cur = conn.execute(
            "UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'messages'", (found.max_id,)
        )
        if not cur.rowcount:  # no message recovered: sqlite_sequence has no row yet
            conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('messages', ?)", (found.max_id,))
    conn.execute("COMMIT")
    restored.payload_seqs = seqs
    return restored


def _payload_seq(payload: bytes) -> int | None:
    """The `seq` of a result payload (a JSON object), if it has one."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    seq = data.get("seq") if isinstance(data, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None
