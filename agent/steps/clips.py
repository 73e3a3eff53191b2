"""Clips: the frame and its tracking events to the pipeline's clip recorder (agent/clips.py), which puts
the clip's id on the events it covers (before the report). The recorder is the pipeline's, kept across
stages like its scene (agent/pipeline_tracking.py); this step only hands the frame over."""

from __future__ import annotations

from typing import Any

from agent.config import PipelineConfig
from agent.pipeline_tracking import PipelineTracking
from agent.steps.base import FrameRecord, Step


class ClipsStep(Step):
    name = "clips"
    thread = "report"
    failure_ends_frame = False  # a lost clip frame never costs the result
    needs_pixels = True

    def __init__(self, config: PipelineConfig, tracking: PipelineTracking) -> None:
        super().__init__()
        self.config = config
        self.tracking = tracking

    def run(self, record: FrameRecord) -> bool:
        recorder = self.tracking.clip_recorder(self.config)
        if recorder is not None:
            recorder.frame(record.pixels, record.captured_at, record.events)
        return True

    def status(self) -> dict[str, Any] | None:
        recorder = self.tracking.clips
        return recorder.status() if recorder is not None else {"encoder": "no clip directory (no state dir)"}
