"""Attributes: second models on the tracked objects (the pipeline's `attributes:`).

On each frame, after tracking: the answers the reader thread delivered since the last frame go on their
objects (each an `update` with changed ["attributes"]: agent/processing/scene.py `set_attribute`), the
frame's tracked boxes carry their objects' answers so far (`attributes`, embeddings left to the
events: a vector in every frame's result would be a firehose), then the objects due a reading
(agent/pipeline_attributes.py `due`) are cut from this frame's pixels and handed to the stage's
reader (agent/attribute_models.py), at most `max_per_frame` per attribute. The reader runs on its own
thread: this step never waits for a second model.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from agent.attribute_models import AttributeSet, Job, Reading
from agent.clock import iso_utc
from agent.config import PipelineConfig
from agent.pipeline_attributes import AttributeCounts, PipelineAttributes
from agent.pipeline_tracking import PipelineTracking, frame_size
from agent.processing.scene import boxes_of
from agent.steps.base import FrameRecord, Step

log = logging.getLogger(__name__)


class AttributesStep(Step):
    name = "attributes"
    thread = "report"
    failure_ends_frame = False  # a second model's trouble costs only its answers
    needs_pixels = True  # crops are cut from the frame

    def __init__(
        self,
        config: PipelineConfig,
        models: AttributeSet,
        readings: PipelineAttributes,
        tracking: PipelineTracking,
    ) -> None:
        super().__init__()
        self.config = config
        self.models = models
        self.readings = readings
        self.tracking = tracking

    def run(self, record: FrameRecord) -> bool:
        scene = self.tracking.scene
        if scene is None:
            return True
        applied = self._apply(self.readings.take())
        if applied:
            record.events += scene.take_events()
            record.scene = self.tracking.summary
        self.readings.forget(scene.objects)
        entries = boxes_of(record.output) if record.output is not None else None
        if not entries:
            return True
        for entry in entries:  # the frame's result names what was read on each tracked box so far
            obj = scene.objects.get(entry.get("track_id"))  # type: ignore[arg-type]
            if obj is not None and obj.attributes:
                entry["attributes"] = {
                    name: {"value": a["value"], "score": a["score"]}
                    for name, a in obj.attributes.items()
                    if not isinstance(a["value"], list)  # an embedding: in the events, not in every frame
                }
        if record.pixels is not None:
            self._ask(record, entries)
        return True

    def _apply(self, readings: list[Reading]) -> bool:
        scene = self.tracking.scene
        assert scene is not None
        applied = False
        for reading in readings:
            counts = self.readings.counts.setdefault(reading.name, AttributeCounts())
            if reading.error is not None:
                counts.failed += 1
                continue
            attribute = next((a for a in self.config.attributes if a.name == reading.name), None)
            if attribute is not None and reading.score is not None and reading.score < attribute.min_score:
                counts.unsure += 1
                continue
            obj = scene.objects.get(reading.track_id)
            runs = obj.attributes.get(reading.name, {}).get("runs", 0) if obj is not None else 0
            value = {
                "value": reading.value,
                "score": None if reading.score is None else round(reading.score, 4),
                "at": iso_utc(reading.captured_at),
                "runs": runs + 1,
            }
            if scene.set_attribute(reading.track_id, reading.name, value):
                counts.answered += 1
                applied = True
            else:
                counts.late += 1
        return applied

    def _ask(self, record: FrameRecord, entries: list[dict[str, Any]]) -> None:
        pixels = record.pixels
        assert pixels is not None
        width, height = frame_size(pixels, record.geometry)
        scene = self.tracking.scene
        assert scene is not None
        wanted: dict[int, tuple[dict[str, Any], list[int]]] = {}
        for index, model in enumerate(self.models.models):
            attribute = model.config
            due = [e for e in entries if self.readings.due(attribute, e, record.captured_at, width, height)][
                : attribute.max_per_frame
            ]
            for entry in due:
                wanted.setdefault(int(entry["track_id"]), (entry, []))[1].append(index)
        for track_id, (entry, indexes) in wanted.items():
            padding = max(self.models.models[i].config.crop.padding for i in indexes)
            x1, y1, x2, y2 = (float(v) for v in entry["box"])
            pad = padding * (y2 - y1)
            left, top = max(int(x1 - pad), 0), max(int(y1 - pad), 0)
            right, bottom = min(int(x2 + pad) + 1, width), min(int(y2 + pad) + 1, height)
            if right <= left or bottom <= top:
                continue
            obj = scene.objects.get(track_id)
            known = {n: a.get("value") for n, a in obj.attributes.items()} if obj is not None else {}
            polygon = entry.get("polygon")  # (regions with polygons: the text line at its angle)
            job = Job(
                track_id,
                pixels[top:bottom, left:right].copy(),
                (x1 - left, y1 - top, x2 - left, y2 - top),
                indexes,
                known,
                record.captured_at,
                None if polygon is None else np.asarray(polygon, np.float64) - (left, top),
            )
            names = [self.models.models[i].config.name for i in indexes]
            for name in names:
                self.readings.asked(name, entry, record.captured_at, width, height)
            if not self.models.submit(job, self.readings.deliver):
                for name in names:
                    self.readings.refused(name, track_id)

    def status(self) -> dict[str, Any] | None:
        shown = self.models.status()
        for name, counts in self.readings.status().items():
            shown.setdefault(name, {}).update(counts)
        return shown
