"""Postprocess: the model's raw outputs -> the result's `output` (labels, detections, regions...).

A frame cut into motion regions (`FrameRecord.crops`) has each crop's detections mapped to frame
pixels and made one list (agent/processing/motion_regions.py `merge_detections`): every step after
this one sees one frame's detections, as without regions.
"""

from __future__ import annotations

from agent.processing import Postprocessor
from agent.processing.motion_regions import merge_detections
from agent.processing.postprocess import Detection
from agent.steps.base import FrameRecord, Step


class PostprocessStep(Step):
    name = "postprocess"
    thread = "report"

    def __init__(self, postprocess: Postprocessor) -> None:
        super().__init__()
        self.postprocess = postprocess

    def run(self, record: FrameRecord) -> bool:
        if record.crops is None:
            assert record.outputs is not None
            record.output, record.outputs = self.postprocess(record.outputs, record.geometry), None
            return True
        # (Regions need a detection postprocess: agent/config/pipeline.py refuses them otherwise.)
        assert isinstance(self.postprocess, Detection) and record.geometry is not None
        found = []
        for crop in record.crops:
            assert crop.outputs is not None
            found.append((crop.box, self.postprocess(crop.outputs, crop.geometry)["detections"]))
            crop.outputs = None
        size = (record.geometry.source_width, record.geometry.source_height)
        config = self.postprocess.config
        record.output = {
            "detections": merge_detections(found, size, config.iou_threshold, config.max_detections)
        }
        return True
