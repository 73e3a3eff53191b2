"""A tracking pipeline's events on their way to the outbox, and the journal that lets a restart end
the tracks a killed agent left open (docs/results.md "Events").

    Scene (agent/processing/scene.py) ─ events ─> EventWriter.write ─ message (id, device, seq) ─> Outbox

Every event of a pipeline goes to one topic, <prefix>/<device>/events/<pipeline>, numbered in one
sequence (`seq`, taken in the transaction that stores it, as results are): a gap is a loss.

The journal, <state_dir>/tracks/<pipeline>.json, holds the pipeline's open tracks (as their latest
`new` or `update` described them) and its next track id. A track is written to it before its `new` goes to the
outbox and leaves it after its `end` did, so every `new` the outbox holds has an `end` to come: the
pipeline's next start ends what is still open with reason `restarted` (`recover`), and ids go on
from the journal's next id (never reused for another object).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.clock import iso_utc
from agent.event_index import EventIndex
from agent.fsutil import atomic_write_bytes
from agent.mqtt import Outbox, events_topic
from agent.mqtt.outbox import OutboxFull

log = logging.getLogger(__name__)

Event = Mapping[str, Any]

RESTARTED = "restarted"  # the end reason of a track the agent was stopped or killed with open


class TrackJournal:
    """The open tracks of each pipeline, on disk (the module's docstring). Thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._open: dict[str, dict[int, dict[str, Any]]] = {}
        self._next_id: dict[str, int] = {}

    def _path(self, pipeline: str) -> Path:
        return self.directory / f"{pipeline}.json"

    def load(self, pipeline: str) -> tuple[int, list[dict[str, Any]]]:
        """(next track id, the open tracks' last descriptions) as the journal holds them; a missing
        or unreadable journal is an empty one (said in the log)."""
        path = self._path(pipeline)
        try:
            data = json.loads(path.read_bytes())
            next_id = int(data["next_id"])
            tracks = [dict(t) for t in data["open"]]
        except FileNotFoundError:
            next_id, tracks = 1, []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "pipeline %s: cannot read its open tracks from %s (%s); starting with none",
                pipeline,
                path,
                exc,
            )
            next_id, tracks = 1, []
        with self._lock:
            self._open[pipeline] = {int(t["id"]): t for t in tracks if isinstance(t.get("id"), int)}
            self._next_id[pipeline] = max([next_id, *(i + 1 for i in self._open[pipeline])])
            return self._next_id[pipeline], list(self._open[pipeline].values())

    def change(
        self, pipeline: str, opened: Iterable[Mapping[str, Any]] = (), closed: Iterable[int] = ()
    ) -> None:
        """Record tracks opened or changed (their `new` or `update` descriptions) and closed (ids); one
        write."""
        opened, closed = list(opened), list(closed)
        if not opened and not closed:
            return
        with self._lock:
            tracks = self._open.setdefault(pipeline, {})
            for obj in opened:
                track_id = int(obj["id"])
                tracks[track_id] = dict(obj)
                self._next_id[pipeline] = max(self._next_id.get(pipeline, 1), track_id + 1)
            for track_id in closed:
                tracks.pop(track_id, None)
            data = {
                "next_id": self._next_id.get(pipeline, 1),
                "open": sorted(tracks.values(), key=lambda t: t["id"]),
            }
            self.directory.mkdir(parents=True, exist_ok=True)
            # Not fsynced: rewritten on every frame whose events start, change or end a track; a power
            # cut may lose the newest change (a track then ends without the `restarted` end, or ends
            # twice, or its `restarted` end describes it as it was a little earlier), never the file.
            atomic_write_bytes(self._path(pipeline), json.dumps(data).encode(), mode=0o600, durable=False)


class EventWriter:
    """Writes a pipeline's events to the outbox as messages, keeping the journal in step."""

    def __init__(
        self,
        device_id: str,
        topic_prefix: str,
        outbox: Outbox,
        journal: TrackJournal | None,
        index: EventIndex | None = None,
    ) -> None:
        self.configure(device_id, topic_prefix)
        self.outbox = outbox
        self.journal = journal
        self.index = index  # the events page's (agent/event_index.py): fed after the outbox, never raises

    def configure(self, device_id: str, topic_prefix: str) -> None:
        self.device_id = device_id
        self.topic_prefix = topic_prefix

    def write(self, pipeline: str, events: Iterable[Event]) -> int:
        """Write `events` in order; returns how many were stored (the outbox full: the rest dropped,
        counted by the outbox per stream)."""
        events = list(events)
        if not events:
            return 0
        # Each open object as its newest `new` or `update` describes it: a restart's `end` says as much.
        described = [e["object"] for e in events if e.get("type") in ("new", "update")]
        if self.journal is not None and described:
            self.journal.change(pipeline, opened=described)  # before the `new`: the module's docstring
        topic = events_topic(self.topic_prefix, self.device_id, pipeline)
        stored = 0
        published: list[dict[str, Any]] = []  # as the outbox holds them (seq None: no room), to index
        for event in events:
            base = {"id": str(uuid.uuid4()), "device": self.device_id, "pipeline": pipeline}

            def payload(seq: int, base: dict[str, Any] = base, event: Event = event) -> bytes:
                return json.dumps(
                    {**base, "seq": seq, **event}, separators=(",", ":"), allow_nan=False
                ).encode()

            seq: int | None = None
            try:
                _, seq = self.outbox.put_numbered(topic, payload, qos=1, stream=f"events/{pipeline}")
            except OutboxFull:  # when_full: drop-newest; counted per stream by the outbox
                pass
            else:
                stored += 1
            published.append({**base, "seq": seq, **event})
        if self.index is not None:
            self.index.add(published)
        closed = [int(e["object"]["id"]) for e in events if e.get("type") == "end"]
        if self.journal is not None and closed:
            self.journal.change(pipeline, closed=closed)
        return stored

    def recover(self, pipeline: str) -> int:
        """At a pipeline's start: end the tracks the journal still holds open (reason `restarted`) and
        return the next track id."""
        if self.journal is None:
            return 1
        next_id, still_open = self.journal.load(pipeline)
        if still_open:
            now = iso_utc(time.time())
            log.info("pipeline %s: ending %d track(s) left open by the last run", pipeline, len(still_open))
            self.write(
                pipeline,
                [{"type": "end", "at": now, "reason": RESTARTED, "object": obj} for obj in still_open],
            )
        return next_id
