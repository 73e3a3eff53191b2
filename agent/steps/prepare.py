"""Prepare: the frame's pixels (or audio window) -> the model's inputs, and how an image was fitted.

Runs on the prepare thread, overlapping the model's run on the frame before; a recurrent model (state
links: a run's inputs need the previous run's outputs) prepares on the inference thread instead.

With motion regions (`motion.regions`), a frame the motion gate found areas in is cut into crops
around them and the live tracks' last boxes (agent/processing/motion_regions.py), one input each
(`FrameRecord.crops`); the whole frame as usual when the regions say so (motion over most of it).
"""

from __future__ import annotations

import threading
from typing import Any

from agent.config import MotionConfig
from agent.pipeline_tracking import PipelineTracking
from agent.processing import Geometry
from agent.processing.feed import Feeder
from agent.processing.motion_regions import Box, plan_regions
from agent.steps.base import PREPROCESS_STEP, CropRun, FrameRecord, Step


class PrepareStep(Step):
    name = PREPROCESS_STEP

    def __init__(
        self, feeder: Feeder, motion: MotionConfig | None = None, tracking: PipelineTracking | None = None
    ) -> None:
        """`motion`: the pipeline's motion gate (its regions settings); `tracking`: the pipeline's, whose
        live tracks are looked at in a region too."""
        super().__init__()
        self.feeder = feeder
        self.thread = "inference" if feeder.recurrent else "prepare"
        # (A stage with regions has an image feeder: agent/stage.py checks it.)
        self.regions = motion if motion is not None and motion.regions else None
        self.tracking = tracking
        self._lock = threading.Lock()
        self._counts = {"frames": 0, "whole_frames": 0, "crops": 0}  # since the step was built

    def run(self, record: FrameRecord) -> bool:
        assert record.pixels is not None, "the frame's pixels are kept until the model ran"
        crops = self._crops(record)
        if crops is None:
            record.feeds, record.geometry = self.feeder.feeds(record.pixels, record.gap)
            return True
        height, width = record.pixels.shape[:2]
        record.crops = []
        for box in crops:
            x1, y1, x2, y2 = box
            feeds, geometry = self.feeder.feeds(record.pixels[y1:y2, x1:x2], record.gap)
            assert geometry is not None  # an image feeder's
            record.crops.append(CropRun(box, feeds, geometry.of_crop(x1, y1, width, height)))
        record.geometry = Geometry.identity(width, height)  # the merged boxes are in frame pixels
        return True

    def _crops(self, record: FrameRecord) -> list[Box] | None:
        """The frame's crops (None: the whole frame): with regions on and the gate's areas only."""
        if self.regions is None or record.motion_areas is None:
            return None
        assert record.pixels is not None and self.feeder.input_size is not None
        height, width = record.pixels.shape[:2]
        crops = plan_regions(
            record.motion_areas,
            (width, height),
            self.feeder.input_size,
            tracked=tracked_boxes(self.tracking),
            max_regions=self.regions.max_regions,
            full_frame_above=self.regions.full_frame_above,
        )
        with self._lock:
            self._counts["frames"] += 1
            self._counts["whole_frames"] += crops is None
            self._counts["crops"] += len(crops or ())
        return crops

    def status(self) -> dict[str, Any] | None:
        """With regions on: frames they were planned for, how many ran whole, crops run."""
        if self.regions is None:
            return None
        with self._lock:
            return {"regions": dict(self._counts)}


def tracked_boxes(tracking: PipelineTracking | None) -> list[Box]:
    """The live (confirmed) tracks' last boxes, read from the prepare thread while the report thread
    tracks: a copy of the objects first, and nothing when it changed under the copy."""
    scene = tracking.scene if tracking is not None else None
    if scene is None:
        return []
    try:
        objects = list(scene.objects.values())
    except RuntimeError:  # the dict changed size while copied: the next frame has them
        return []
    return [(int(b[0]), int(b[1]), int(b[2]) + 1, int(b[3]) + 1) for b in (o.box for o in objects)]
