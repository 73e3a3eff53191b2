"""A result's one path: the pipeline's report step builds a `Result` once (agent/steps/report.py),
`ResultWriter` turns it into the message the fleet reads and writes it to the outbox, and the
publisher stamps its send time.

    steps' report (result_of) ─ Result ─> ResultWriter.submit ─ message (id, device, seq, times) ─> Outbox
                                             └─ its events ─> EventWriter (agent/events.py) ─> Outbox
    Outbox ─> mqtt publisher ─ stamp_published_at (wired by the daemon) ─> broker

A tracking pipeline's frame carries its events (and its scene's counts) in the same `Result`; its
per-frame result may be off (`report.results: false`) or held back by the report rules while the
events still go. Snapshots are saved through the writer too (`save_snapshot`).

The message is complete in the outbox except for `published_at`, which only the send can know: it
is stored as a placeholder whose bytes the publisher swaps for the send time. Nothing under
agent/mqtt/ knows this module; the daemon hands `stamp_published_at` to the connection.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.clock import iso_utc
from agent.config import SnapshotsConfig
from agent.errors import ModelError
from agent.events import EventWriter
from agent.logfmt import first_or_every
from agent.mqtt import Outbox, OutboxMessage, results_topic
from agent.mqtt.outbox import OutboxFull
from agent.processing.scene import SnapshotWanted

if TYPE_CHECKING:
    from agent.snapshots import SnapshotStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What one frame of a pipeline became, as the pipeline knows it (no ids, no send times)."""

    pipeline: str
    captured_at: float  # the frame's capture time (epoch seconds)
    model: Mapping[str, Any]  # name, version, sha256
    backend: str  # as it was at the run (a switch may follow before the result is made)
    precision: str
    latency_ms: Mapping[str, float]  # preprocess, inference, postprocess, capture_to_result
    source: Mapping[str, Any]  # uri, frame, position_s, frames_dropped, outages, last_outage_s
    output: Mapping[str, Any]  # the postprocessed output
    held_back: int  # results the report rules held back since the last one published
    frames_gated: int | None = None  # frames the motion gate skipped before this one (None: no gate)
    events: Sequence[Mapping[str, Any]] = ()  # the frame's tracking events, in order
    publish: bool = True  # False: only the events go (report.results off, or held back by the rules)
    scene: Mapping[str, Any] | None = None  # a tracking pipeline's counts after this frame (Scene.summary)
    tags: Mapping[str, Any] = field(default_factory=dict)  # what steps added (published when any)
    # The frame's pixels, when a consumer of the result needs them (the Home Assistant image): never
    # serialised; the image is then the result's own frame.
    pixels: np.ndarray | None = field(default=None, repr=False, compare=False)

    def fields(self) -> dict[str, Any]:
        """The message's own fields, in the order published (the sink adds id, device, seq, times)."""
        return {
            "model": self.model,
            "backend": self.backend,
            "precision": self.precision,
            "latency_ms": self.latency_ms,
            "source": self.source,
            "output": self.output,
            "held_back": self.held_back,
            **({"frames_gated": self.frames_gated} if self.frames_gated is not None else {}),
            **({"tags": self.tags} if self.tags else {}),
        }


# Results are serialised with this placeholder; the publisher swaps in the real send time.
# JSON escapes quotes inside strings, so these exact bytes can only be our key.
_PUBLISHED_AT_PLACEHOLDER = b'"published_at":null'


def stamp_published_at(message: OutboxMessage) -> bytes:
    """The payload as sent: `published_at` set to now (results only; other messages unchanged)."""
    stamp = b'"published_at":"' + iso_utc(time.time()).encode() + b'"'
    return message.payload.replace(_PUBLISHED_AT_PLACEHOLDER, stamp, 1)


# A published result's pipeline, its `output` and its frame's pixels (None: the pipeline kept none).
ResultObserver = Callable[[str, Mapping[str, Any], "np.ndarray | None"], None]
# A tracking pipeline's frame: its pipeline, its scene's summary and its events.
SceneObserver = Callable[[str, Mapping[str, Any], Sequence[Mapping[str, Any]]], None]
# A new snapshot: its pipeline, label and JPEG (for the retained image topic).
SnapshotObserver = Callable[[str, str, bytes], None]


class ResultWriter:
    """The pipelines' sink: completes each result as a message and writes it to the outbox.

    `device_id`, `topic_prefix` and `max_payload_bytes` may change on a reload (`configure`)."""

    def __init__(
        self,
        device_id: str,
        topic_prefix: str,
        max_payload_bytes: int,
        outbox: Outbox,
        on_written: Callable[[], None],
        observer: ResultObserver | None = None,
        events: EventWriter | None = None,
        snapshots: SnapshotStore | None = None,
        scene_observer: SceneObserver | None = None,
        snapshot_observer: SnapshotObserver | None = None,
    ) -> None:
        self.outbox = outbox
        self.events = events if events is not None else EventWriter(device_id, topic_prefix, outbox, None)
        self.snapshots = snapshots
        self.configure(device_id, topic_prefix, max_payload_bytes)
        self.on_written = on_written
        # The state topics see every result handed to the outbox, every tracking frame, every snapshot.
        self.observer = observer
        self.scene_observer = scene_observer
        self.snapshot_observer = snapshot_observer
        self.snapshot_errors = 0
        self._line_counts: dict[str, dict[str, dict[str, int]]] = {}  # pipeline -> line -> direction

    @property
    def clips_root(self) -> Path | None:
        """Where event clips go (agent/clips.py): beside the snapshots, <state_dir>/clips (None: none)."""
        return None if self.snapshots is None else self.snapshots.root.parent / "clips"

    def configure(self, device_id: str, topic_prefix: str, max_payload_bytes: int) -> None:
        self.device_id = device_id
        self.topic_prefix = topic_prefix
        self.max_payload_bytes = max_payload_bytes
        self.events.configure(device_id, topic_prefix)

    def submit(self, result: Result) -> None:
        if result.publish:
            self._write_result(result)
        if result.events:
            self.write_events(result.pipeline, result.events)
        if result.scene is not None and self.scene_observer is not None:
            try:
                self.scene_observer(result.pipeline, result.scene, result.events)
            except Exception:  # the state topics must never cost an event
                log.exception("pipeline %s: the scene observer failed", result.pipeline)

    def write_events(self, pipeline: str, events: Sequence[Mapping[str, Any]]) -> None:
        """A pipeline's events, in order, to the outbox (agent/events.py)."""
        if self.events.write(pipeline, events):
            self.on_written()

    def open_tracks(self, pipeline: str) -> int:
        """At a tracking pipeline's start: end what the last run left open; the next track id."""
        next_id = self.events.recover(pipeline)
        self.on_written()
        return next_id

    def line_counts(self, pipeline: str) -> dict[str, dict[str, int]]:
        """The pipeline's crossing counts, kept here from the daemon's start across its rebuilds."""
        return self._line_counts.setdefault(pipeline, {})

    def save_snapshot(
        self,
        pipeline: str,
        wanted: SnapshotWanted,
        frame: np.ndarray,
        captured_at: float,
        config: SnapshotsConfig,
    ) -> str | None:
        """Save an object's picture (agent/snapshots.py); its id, or None when it could not be saved
        (said in the log, the first time and every 100th)."""
        if self.snapshots is None:
            return None
        try:
            snapshot = self.snapshots.save(
                pipeline,
                wanted.track_id,
                wanted.label,
                frame,
                wanted.box,
                quality=config.quality,
                crop=config.crop,
                captured_at=captured_at,
                attributes=wanted.attributes,
            )
            data = snapshot.path.read_bytes() if self.snapshot_observer is not None else b""
        except Exception as exc:  # a full disk costs the picture, never the events
            self.snapshot_errors += 1
            if first_or_every(self.snapshot_errors):
                log.warning(
                    "pipeline %s: cannot save a snapshot (%d failed so far): %s",
                    pipeline,
                    self.snapshot_errors,
                    exc,
                )
            return None
        if wanted.replaces is not None:  # an object keeps one snapshot, its best so far
            try:
                self.snapshots.remove(pipeline, wanted.replaces)
            except OSError as exc:
                log.warning(
                    "pipeline %s: cannot remove the replaced snapshot %s: %s", pipeline, wanted.replaces, exc
                )
        if self.snapshot_observer is not None:
            try:
                self.snapshot_observer(pipeline, wanted.label, data)
            except Exception:
                log.exception("pipeline %s: the snapshot observer failed", pipeline)
        return snapshot.id

    def _write_result(self, result: Result) -> None:
        pipeline, limit = result.pipeline, self.max_payload_bytes
        base = {"id": str(uuid.uuid4()), "device": self.device_id, "pipeline": pipeline}
        rest = {
            "captured_at": iso_utc(result.captured_at),
            "produced_at": iso_utc(time.time()),
            "published_at": None,  # set when sent: see stamp_published_at
            **result.fields(),
        }

        def payload(seq: int) -> bytes:
            # allow_nan=False: NaN is not JSON; a model emitting it fails the frame (counted), not the reader.
            data = json.dumps({**base, "seq": seq, **rest}, separators=(",", ":"), allow_nan=False).encode()
            if len(data) > limit:
                raise ModelError(
                    f"result of {len(data)} bytes is over mqtt.max_payload_bytes ({limit}); "
                    "lower postprocess.max_values or raise the limit"
                )
            return data

        topic = results_topic(self.topic_prefix, self.device_id, pipeline)
        try:
            # The sequence number is taken in the transaction that stores the result: a gap is a loss.
            self.outbox.put_numbered(topic, payload, qos=1, stream=f"results/{pipeline}")
        except OutboxFull:
            # when_full: drop-newest; counted per pipeline by the outbox (status, telemetry, log)
            written = False
        else:
            written = True
        if self.observer is not None:
            try:
                self.observer(pipeline, result.output or {}, result.pixels)
            except Exception:  # the state topics must never cost a result
                log.exception("pipeline %s: the result observer failed", pipeline)
        if written:
            self.on_written()
