"""Filter: the frame's boxes through the pipeline's object filters and masks (`filters:`,
agent/processing/object_filter.py), after postprocess and before tracking. What it drops is gone
from the frame's `output`: tracking, zones, the report rules, the result and Home Assistant see only
what passed. Its status counts the drops per rule and per label."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from agent.config.filters import FiltersConfig
from agent.pipeline_tracking import _frame_size as frame_size  # the tracking's: geometry, else pixels
from agent.processing.object_filter import ObjectFilter
from agent.processing.scene import boxes_of
from agent.steps.base import FrameRecord, Step


class FilterStep(Step):
    name = "filter"
    thread = "report"

    def __init__(self, config: FiltersConfig) -> None:
        super().__init__()
        self.filter = ObjectFilter(config)
        self._lock = threading.Lock()  # the report thread counts, a status request reads
        self._dropped: Counter[str] = Counter()
        self._by_label: dict[str, Counter[str]] = {}
        self._kept = 0

    def run(self, record: FrameRecord) -> bool:
        if record.output is None:
            return True
        width, height = frame_size(record.pixels, record.geometry)
        record.output, dropped = self.filter.apply(record.output, width, height)
        kept = len(boxes_of(record.output) or [])
        with self._lock:
            self._kept += kept
            for label, rule in dropped:
                self._dropped[rule] += 1
                self._by_label.setdefault(label, Counter())[rule] += 1
        return True

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "dropped": dict(self._dropped),
                "by_label": {label: dict(rules) for label, rules in self._by_label.items()},
                "kept": self._kept,
            }
