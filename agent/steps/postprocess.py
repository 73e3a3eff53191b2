"""Postprocess: the model's raw outputs -> the result's `output` (labels, detections, regions...)."""

from __future__ import annotations

from agent.processing import Postprocessor
from agent.steps.base import FrameRecord, Step


class PostprocessStep(Step):
    name = "postprocess"
    thread = "report"

    def __init__(self, postprocess: Postprocessor) -> None:
        super().__init__()
        self.postprocess = postprocess

    def run(self, record: FrameRecord) -> bool:
        assert record.outputs is not None
        record.output, record.outputs = self.postprocess(record.outputs, record.geometry), None
        return True
