"""Filter: the frame's boxes through the pipeline's object filters and masks (`filters:`,
agent/processing/object_filter.py), after postprocess and before tracking. What it drops is gone
from the frame's `output`: tracking, zones, the report rules, the result and Home Assistant see only
what passed. Its status counts the drops per rule and per label (the pipeline's counts: a new
stage counts on)."""

from __future__ import annotations

from typing import Any

from agent.config.filters import FiltersConfig
from agent.filter_counts import Drops
from agent.pipeline_tracking import frame_size  # the tracking's: geometry, else pixels
from agent.processing.object_filter import ObjectFilter
from agent.processing.scene import boxes_of
from agent.steps.base import FrameRecord, Step


class FilterStep(Step):
    name = "filter"
    thread = "report"

    def __init__(self, config: FiltersConfig, drops: Drops | None = None) -> None:
        """`drops`: the pipeline's counts, kept across its stages (None: this step's own)."""
        super().__init__()
        self.filter = ObjectFilter(config)
        self._drops = drops if drops is not None else Drops()

    def run(self, record: FrameRecord) -> bool:
        if record.output is None:
            return True
        width, height = frame_size(record.pixels, record.geometry)
        record.output, dropped = self.filter.apply(record.output, width, height)
        self._drops.count(len(boxes_of(record.output) or []), dropped)
        return True

    def status(self) -> dict[str, Any]:
        return self._drops.to_dict()
