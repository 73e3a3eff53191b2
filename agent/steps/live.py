"""Live view: while someone watches the pipeline (agent/live_view.py), a few frames a second go, drawn
and encoded off this thread, to its viewers.

Runs after tracking and attributes (the boxes carry their track ids and the scene its counts) and
before the report rules, so a frame the rules hold back is still seen. Unwatched, `run` is one
attribute read: the pixels are not touched. The step does not declare `needs_pixels` (whether anyone
will watch is not known when the plan is made): instead the pipeline keeps a frame's pixels past the
model while its live view is watched (agent/pipeline.py `_infer`), so an unwatched pipeline holds no
more frames than without the live view; the first frames after a viewer came may come without
pixels, and are let pass.
"""

from __future__ import annotations

from agent.config import PipelineConfig
from agent.live_view import LiveFrame, LiveView
from agent.pipeline_tracking import PipelineTracking
from agent.processing.scene import boxes_of
from agent.processing.zones import LineShape, ZoneShape
from agent.steps.base import FrameRecord, Step


class LiveViewStep(Step):
    name = "live_view"
    thread = "report"
    failure_ends_frame = False  # a picture for a viewer is never worth a result

    def __init__(self, config: PipelineConfig, view: LiveView, tracking: PipelineTracking) -> None:
        super().__init__()
        self.config = config
        self.view = view
        self.tracking = tracking
        self._shapes: tuple[tuple[int, int], list[ZoneShape], list[LineShape]] | None = None
        self._limits = {zone.name: zone.max_objects for zone in config.zones}

    def run(self, record: FrameRecord) -> bool:
        if not self.view.due():
            return True
        pixels = record.pixels
        if pixels is None or pixels.ndim != 3 or pixels.shape[2] != 3:
            return True  # (audio, or let go after the model before anyone watched: nothing to show)
        height, width = pixels.shape[:2]
        zones, lines = self._shapes_for(width, height)
        summary = self.tracking.summary if self.tracking.scene is not None else None
        output = record.output
        entries = boxes_of(output) if output is not None else None
        self.view.offer(
            LiveFrame(
                pixels=pixels.copy(),  # the encoder's own: the frame goes on to its report
                captured_at=record.captured_at,
                entries=[dict(entry) for entry in entries or ()],
                zones=zones,
                lines=lines,
                occupancy=summary["zones"] if summary is not None else None,
                limits=self._limits,
                counts=summary["lines"] if summary is not None else None,
                motion_areas=list(record.motion_areas or ()),
            )
        )
        return True

    def _shapes_for(self, width: int, height: int) -> tuple[list[ZoneShape], list[LineShape]]:
        """The config's zones and lines in this frame size's pixels (made again when the size changes)."""
        if self._shapes is None or self._shapes[0] != (width, height):
            zones = [ZoneShape.from_config(zone, width, height) for zone in self.config.zones]
            lines = [LineShape.from_config(line, width, height) for line in self.config.lines]
            self._shapes = ((width, height), zones, lines)
        return self._shapes[1], self._shapes[2]
