"""The recent-events index: the events a person reviews, in <state_dir>/events.db (SQLite, WAL), for
the events page (agent/web/events.py) to filter and page through.

    EventWriter.write (agent/events.py) ─ each event as published (id, device, pipeline, seq, ...) ─> add

It is a view, never the record: the outbox is. `add` never raises and never costs an event: an index
that cannot be opened, or a write that fails, is logged (the first time) and counted, and the event
goes to the outbox all the same. A file that is no SQLite database (or a damaged one) is moved aside
as `events.db.corrupt` and a new one is made.

What is kept: every event but `update` (the frequent one; docs/results.md "Events"): new, end, enter,
exit, dwell, cross, overcrowded, and whatever type comes later. Each row has its pipeline, seq, type,
time (`at`, as epoch seconds), track id, label, zone, line, direction, snapshot id, clip id, the
object's attributes (JSON) and the whole event (JSON). The brief `object` of enter/exit/dwell/cross
has no snapshot: a row gets its track's latest (from the track's `new` and `update`s), and a
better snapshot (an `update` whose `changed` has "snapshot"; the old file is removed by then) is put
on every row of its track, so no row points at a picture that is gone.

Retention: at most `max_rows` rows, none older than `max_age_s`; pruned in batches every
`prune_every` adds (and at open), never at each insert.

Threads: one writer connection, shared under a lock by the pipelines' report threads (which write
events); `synchronous=NORMAL` (WAL: a commit is not fsynced, a power cut may lose the newest rows, never
the file). Readers (the web page's worker threads) open their own read-only connection per query.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "events.db"
MAX_ROWS = 20_000
MAX_AGE_S = 7 * 24 * 3600.0
PRUNE_EVERY = 500  # adds between prunes
_PRUNE_BATCH = 2_000  # rows deleted per statement (a short write lock each)
NOT_INDEXED = frozenset({"update"})  # per-frame changes of an object: its new/enter/.../end tell the story
MAX_PAGE = 500  # rows one query returns at most
_MAX_OPEN_TRACKS = 10_000  # tracks whose latest snapshot is remembered (each ends with its `end`)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    seq INTEGER,
    type TEXT NOT NULL,
    t REAL NOT NULL,
    at TEXT NOT NULL,
    track INTEGER,
    label TEXT,
    zone TEXT,
    line TEXT,
    direction TEXT,
    snapshot TEXT,
    clip TEXT,
    attributes TEXT NOT NULL,
    event TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_t ON events (t);
CREATE INDEX IF NOT EXISTS events_track ON events (pipeline, track);
"""
_COLUMNS = (
    "id, pipeline, seq, type, t, at, track, label, zone, line, direction, snapshot, clip, attributes, event"
)
FILTERS = ("pipeline", "zone", "line", "label", "type")  # the columns a query filters on by equality


@dataclass(frozen=True)
class IndexedEvent:
    """One row. `id`: the index's own (newest is highest; the page's paging cursor)."""

    id: int
    pipeline: str
    seq: int | None
    type: str
    t: float
    at: str
    track: int | None
    label: str | None
    zone: str | None
    line: str | None
    direction: str | None
    snapshot: str | None
    clip: str | None
    attributes: dict[str, Any]
    event: dict[str, Any]


def epoch_of(at: object) -> float | None:
    """An event's `at` (RFC 3339, e.g. 2026-11-29T07:12:04.500Z) as epoch seconds; None when it is not one."""
    if not isinstance(at, str):
        return None
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


class EventIndex:
    """The index at `path` (the module's docstring). Open with `EventIndex(path)`: never raises."""

    def __init__(
        self,
        path: Path,
        max_rows: int = MAX_ROWS,
        max_age_s: float = MAX_AGE_S,
        prune_every: int = PRUNE_EVERY,
    ) -> None:
        self.path = path
        self.max_rows, self.max_age_s, self.prune_every = max_rows, max_age_s, prune_every
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._since_prune = 0
        self._snapshots: dict[tuple[str, int], str] = {}  # (pipeline, open track) -> its latest snapshot
        self.errors = 0  # failed opens and writes
        self.problem: str | None = None  # why the index is off (None: it works)
        self._open()

    # --- the writer ---------------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self._conn = self._connect()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "not a database" not in str(exc):
                self._off(f"cannot open {self.path}: {exc}")
                return
            # Not a database, or a damaged one: kept aside for a look, and a new one made.
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.warning(
                "the events index %s is damaged (%s): moved to %s, starting a new one", self.path, exc, aside
            )
            try:
                os.replace(self.path, aside)
                for suffix in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{self.path}{suffix}")
                self._conn = self._connect()
            except (OSError, sqlite3.Error) as again:
                self._off(f"cannot replace the damaged {self.path}: {again}")
                return
        except OSError as exc:
            self._off(f"cannot open {self.path}: {exc}")
            return
        with self._lock:
            self._prune()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            conn.execute("SELECT COUNT(*) FROM events").fetchone()  # a damaged file fails here
        except BaseException:
            conn.close()
            raise
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)  # events name what the cameras saw: as private as the outbox
        return conn

    def _off(self, why: str) -> None:
        self.errors += 1
        self.problem = why
        log.error("events index off (the events page shows none; events still go out): %s", why)

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Index a pipeline's events as published (each with `pipeline` and `seq`; seq None: the
        outbox had no room for it). Never raises (the module's docstring)."""
        if self._conn is None:
            return
        try:
            with self._lock:
                if self._conn is None:
                    return
                self._add(self._conn, events)
                if self._since_prune >= self.prune_every:
                    self._prune()
        except Exception as exc:
            self.errors += 1
            if self.errors == 1:
                log.error(
                    "cannot index events in %s (events still go out; counted from now): %s", self.path, exc
                )

    def _add(self, conn: sqlite3.Connection, events: Iterable[Mapping[str, Any]]) -> None:
        rows: list[tuple[Any, ...]] = []
        better: list[tuple[str, str, int]] = []  # (snapshot, pipeline, track): put on the track's rows
        for event in events:
            pipeline, kind = str(event.get("pipeline", "")), str(event.get("type", ""))
            obj = event.get("object") if isinstance(event.get("object"), Mapping) else {}
            assert isinstance(obj, Mapping)
            track = obj.get("id") if isinstance(obj.get("id"), int) else None
            key = (pipeline, track) if track is not None else None
            if key is not None and obj.get("snapshot"):
                snapshot = str(obj["snapshot"])
                if self._snapshots.get(key) not in (None, snapshot):
                    better.append((snapshot, pipeline, key[1]))
                self._snapshots[key] = snapshot
                if len(self._snapshots) > _MAX_OPEN_TRACKS:  # tracks whose end never came: the oldest go
                    del self._snapshots[next(iter(self._snapshots))]
            if kind in NOT_INDEXED:
                continue
            t = epoch_of(event.get("at"))
            at = str(event.get("at")) if t is not None else ""
            if t is None:
                t = time.time()
            seq = event.get("seq")
            attributes = obj.get("attributes") if isinstance(obj.get("attributes"), Mapping) else {}
            rows.append(
                (
                    pipeline,
                    seq if isinstance(seq, int) else None,
                    kind,
                    t,
                    at,
                    track,
                    _text(obj.get("label")),
                    _text(event.get("zone")),
                    _text(event.get("line")),
                    _text(event.get("direction")),
                    self._snapshots.get(key) if key is not None else None,
                    _text(event.get("clip")),
                    json.dumps(attributes, default=str),
                    json.dumps(event, default=str),
                )
            )
            if kind == "end" and key is not None:
                self._snapshots.pop(key, None)
        if not rows and not better:
            return
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT INTO events (pipeline, seq, type, t, at, track, label, zone, line, direction, "
                "snapshot, clip, attributes, event) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.executemany("UPDATE events SET snapshot = ? WHERE pipeline = ? AND track = ?", better)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._since_prune += len(rows)

    def _prune(self) -> None:
        """The oldest rows go until at most max_rows remain, none older than max_age_s (under the lock)."""
        conn = self._conn
        if conn is None:
            return
        self._since_prune = 0
        cutoff = time.time() - self.max_age_s
        for _ in range(10_000):  # bounded: each round deletes a batch or ends the loop
            (count,) = conn.execute("SELECT COUNT(*) FROM events").fetchone()
            over = min(_PRUNE_BATCH, max(0, count - self.max_rows))
            gone = conn.execute(
                "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id LIMIT ?) "
                "OR id IN (SELECT id FROM events WHERE t < ? LIMIT ?)",
                (over, cutoff, _PRUNE_BATCH),
            ).rowcount
            if gone <= 0:
                return

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None

    # --- readers (any thread: a read-only connection each) -------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        conn.execute("PRAGMA query_only=ON")
        return conn

    def query(
        self,
        *,
        before: int | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        **equal: str | None,
    ) -> list[IndexedEvent]:
        """Newest first: rows matching each given filter of FILTERS (pipeline=, zone=, line=, label=,
        type=; None or "" is no filter), captured in [since, until] (epoch seconds), with an id below
        `before` (the paging cursor: the last row's id of the page before), at most `limit`.
        Raises sqlite3.Error when the index cannot be read."""
        unknown = set(equal) - set(FILTERS)
        if unknown:
            raise TypeError(f"no such filter: {', '.join(sorted(unknown))}")
        where, args = _where(equal, before, since, until)
        limit = max(1, min(MAX_PAGE, int(limit)))
        with contextlib.closing(self._reader()) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM events{where} ORDER BY id DESC LIMIT ?", (*args, limit)
            ).fetchall()
        return [_row(row) for row in rows]

    def newest(self, **equal: str | None) -> int | None:
        """The id of the newest row matching the filters (the page refreshes when it changes)."""
        where, args = _where(equal, None, None, None)
        with contextlib.closing(self._reader()) as conn:
            (newest,) = conn.execute(f"SELECT MAX(id) FROM events{where}", args).fetchone()
        return None if newest is None else int(newest)

    def choices(self) -> dict[str, list[str]]:
        """What each filter can be: the distinct pipelines, zones, lines, labels and types held."""
        with contextlib.closing(self._reader()) as conn:  # one scan: the combinations are few
            combinations = conn.execute(f"SELECT DISTINCT {', '.join(FILTERS)} FROM events").fetchall()
        return {
            column: sorted({row[i] for row in combinations if row[i] is not None})
            for i, column in enumerate(FILTERS)
        }

    def count(self) -> int:
        with contextlib.closing(self._reader()) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _where(
    equal: Mapping[str, str | None], before: int | None, since: float | None, until: float | None
) -> tuple[str, Sequence[Any]]:
    terms: list[str] = []
    args: list[Any] = []
    for column in FILTERS:  # (the column names are ours, never a caller's)
        value = equal.get(column)
        if value:
            # `+`: no index for it; newest first walks the ids down and stops at the page's end, where
            # the (pipeline, track) index would have every row of a pipeline sorted first.
            terms.append(f"+{column} = ?")
            args.append(value)
    if before is not None:
        terms.append("id < ?")
        args.append(int(before))
    for term, bound in (("+t >= ?", since), ("+t <= ?", until)):  # (`+`: as above)
        if bound is not None and math.isfinite(bound):
            terms.append(term)
            args.append(float(bound))
    return (" WHERE " + " AND ".join(terms) if terms else ""), args


def _row(row: Sequence[Any]) -> IndexedEvent:
    (id_, pipeline, seq, kind, t, at, track, label, zone, line, direction, snapshot, clip, attrs, event) = row
    return IndexedEvent(
        id=int(id_),
        pipeline=pipeline,
        seq=seq,
        type=kind,
        t=float(t),
        at=at,
        track=track,
        label=label,
        zone=zone,
        line=line,
        direction=direction,
        snapshot=snapshot,
        clip=clip,
        attributes=_json_object(attrs),
        event=_json_object(event),
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
