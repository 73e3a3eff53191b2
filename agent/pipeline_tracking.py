"""A pipeline's tracking: its `Scene` (agent/processing/scene.py) stepped on each frame's boxes by the
report thread, its snapshots taken from the frame's pixels, and its open tracks ended when it stops.

The scene belongs to the pipeline, not to a stage: a swapped-in stage (a new model version, a changed
zone from agent.yaml or the fleet) carries a new config, which the scene takes (`Scene.use`) keeping
every track and who is in each zone (an edge moved while a person waits is no exit and enter); a stage
whose config has no tracking ends the open tracks (`tracking turned off`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agent.clips import ClipRecorder
from agent.config import PipelineConfig, SnapshotsConfig
from agent.processing import Geometry
from agent.processing.scene import Event, Scene, SnapshotWanted, boxes_of

log = logging.getLogger(__name__)


class TrackingSink(Protocol):
    """What tracking needs from the pipeline's sink (the daemon's: agent/results.py ResultWriter)."""

    def write_events(self, pipeline: str, events: list[dict[str, Any]]) -> None:
        """Events outside a frame's result: the tracks a stop ends."""

    def open_tracks(self, pipeline: str) -> int:
        """A tracking pipeline starts: end what its last run left open; returns the next track id."""
        ...

    def line_counts(self, pipeline: str) -> dict[str, dict[str, int]]:
        """The pipeline's crossings per line and direction, the same mapping every time: a pipeline
        rebuilt (a new source, a retry) counts on from where the last one stopped."""
        ...

    def save_snapshot(
        self,
        pipeline: str,
        wanted: SnapshotWanted,
        frame: np.ndarray,
        captured_at: float,
        config: SnapshotsConfig,
    ) -> str | None:
        """Save an object's picture; its id (None: not saved)."""
        ...


class PipelineTracking:
    """One pipeline's scene across its stages. The report thread calls `frame`; `stop` runs after it."""

    def __init__(self, name: str, sink: TrackingSink) -> None:
        self.name = name
        self.sink = sink
        self.scene: Scene | None = None
        self._config: PipelineConfig | None = None  # the config the scene was last set from
        self.summary: dict[str, Any] | None = None  # for status (the report thread writes it)
        self.clips: ClipRecorder | None = None  # its event clips (agent/clips.py), made by the clips step

    def start(self, config: PipelineConfig) -> None:
        """Before the first frame, when the config tracks: the last run's open tracks end first."""
        if config.tracking is not None:
            self._start(config)

    def _start(self, config: PipelineConfig) -> None:
        tracking = config.tracking
        assert tracking is not None
        next_id, counts = self.sink.open_tracks(self.name), self.sink.line_counts(self.name)
        self.scene = Scene(tracking, config.zones, config.lines, next_id=next_id, line_counts=counts)
        self._config = config
        self.summary = self.scene.summary()

    def frame(
        self,
        config: PipelineConfig,
        output: dict[str, Any],
        captured_at: float,
        pixels: np.ndarray | None,
        geometry: Geometry | None,
    ) -> list[Event]:
        """Track one frame's boxes (the output's entries get their `track_id`) and take its snapshots
        from its `pixels` (None: not kept); the frame's events (none without tracking). `config` is
        the frame's stage's."""
        if self.clips is not None and not config.clips.enabled:  # a stage without clips: the open one ends
            clips, self.clips = self.clips, None
            clips.stop()
        tracking = config.tracking
        if tracking is None:
            if self.scene is None:
                return []
            ended, self.scene, self.summary = self.scene, None, None
            ended.end_all("tracking turned off", captured_at)
            return ended.take_events()
        if self.scene is None:
            self._start(config)
        scene = self.scene
        assert scene is not None
        if config is not self._config:
            scene.use(tracking, config.zones, config.lines)
            self._config = config
        entries = boxes_of(output)
        if entries is None:
            return []  # a plugin without boxes this frame
        width, height = frame_size(pixels, geometry)
        shaped = scene.problems
        scene.step(entries, captured_at, width, height)
        if scene.problems and scene.problems is not shaped:  # once per frame size or config
            log.warning("pipeline %s: %s", self.name, "; ".join(scene.problems))
        if pixels is not None:  # kept for the snapshots
            for wanted in scene.snapshots_wanted():
                snapshot = self.sink.save_snapshot(self.name, wanted, pixels, captured_at, tracking.snapshots)
                if snapshot is not None:
                    scene.snapshot_taken(wanted.track_id, snapshot, wanted.quality, captured_at)
        events = scene.take_events()
        if events or self.summary is None:
            self.summary = scene.summary()
        return events

    def clip_recorder(self, config: PipelineConfig) -> ClipRecorder | None:
        """The pipeline's clip recorder, made at its first frame with clips on (None: the sink keeps no
        clips: the infer tool's). Its config follows the stage's."""
        if self.clips is None:
            # The daemon's sink keeps them beside the snapshots (<state_dir>/clips); other sinks have none.
            root: Path | None = getattr(self.sink, "clips_root", None)
            if root is None:
                return None
            self.clips = ClipRecorder(self.name, root / self.name, config.clips)
        elif self.clips.config is not config.clips:
            self.clips.use(config.clips)
        return self.clips

    def tracks_alive(self) -> bool:
        """Whether any track is open, tentative or lost ones too (the motion gate keeps the model running
        meanwhile); cheap, from any thread."""
        scene = self.scene
        return scene is not None and len(scene.tracker.ids) > 0

    def stop(self, now: float) -> None:
        """The pipeline stopped (its report thread is done): end the open tracks (`stopped`)."""
        scene, self.scene = self.scene, None
        clips, self.clips = self.clips, None
        if scene is None:
            if clips is not None:
                clips.stop()
            return
        scene.end_all("stopped", now)
        events = scene.take_events()
        if clips is not None:  # the open clip ends with them
            clips.tag(events)
            clips.stop()
        try:
            self.sink.write_events(self.name, events)
        except Exception as exc:  # the outbox is gone: the journal ends them at the next start
            log.warning("pipeline %s: cannot write the end of its open tracks: %s", self.name, exc)


def keeps_pixels(config: PipelineConfig) -> bool:
    """Whether a frame's pixels must wait for its report: its snapshots are taken from them."""
    tracking = config.tracking
    return tracking is not None and tracking.snapshots.enabled


def frame_size(pixels: np.ndarray | None, geometry: Geometry | None) -> tuple[int, int]:
    """The source image's width and height: the preprocessing's, else the pixels' (0, 0: unknown)."""
    if geometry is not None:
        return geometry.source_width, geometry.source_height
    if pixels is not None and pixels.ndim >= 2:
        return int(pixels.shape[1]), int(pixels.shape[0])
    return 0, 0
