"""Track: the frame's boxes through the pipeline's scene (tracks, zones, lines, snapshots).

The scene is the pipeline's (agent/pipeline_tracking.py), not this step's: a new stage (a new model
version, a changed zone) gets a new step on the same scene, so every track carries on. A tracking bug
costs the frame its events, never its result.
"""

from __future__ import annotations

from agent.config import PipelineConfig
from agent.pipeline_tracking import PipelineTracking, keeps_pixels
from agent.steps.base import FrameRecord, Step


class TrackStep(Step):
    name = "tracking"
    thread = "report"
    failure_ends_frame = False

    def __init__(self, config: PipelineConfig, tracking: PipelineTracking) -> None:
        super().__init__()
        self.config = config
        self.tracking = tracking
        self.needs_pixels = keeps_pixels(config)  # snapshots are taken from the frame's pixels

    def run(self, record: FrameRecord) -> bool:
        if record.output is None:
            return True
        record.events = self.tracking.frame(
            self.config, record.output, record.captured_at, record.pixels, record.geometry
        )
        if record.events:
            record.scene = self.tracking.summary
        return True
