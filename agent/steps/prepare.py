"""Prepare: the frame's pixels (or audio window) -> the model's inputs, and how an image was fitted.

Runs on the prepare thread, overlapping the model's run on the frame before; a recurrent model (state
links: a run's inputs need the previous run's outputs) prepares on the inference thread instead.
"""

from __future__ import annotations

from agent.processing.feed import Feeder
from agent.steps.base import PREPROCESS_STEP, FrameRecord, Step


class PrepareStep(Step):
    name = PREPROCESS_STEP

    def __init__(self, feeder: Feeder) -> None:
        super().__init__()
        self.feeder = feeder
        self.thread = "inference" if feeder.recurrent else "prepare"

    def run(self, record: FrameRecord) -> bool:
        assert record.pixels is not None, "the frame's pixels are kept until the model ran"
        record.feeds, record.geometry = self.feeder.feeds(record.pixels, record.gap)
        return True
