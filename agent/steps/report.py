"""Report: the frame record becomes a `Result` (agent/results.py), handed to the pipeline's sink.

`result_of` is the one place a result is made from a frame. The frame's pixels go with the result
when the Home Assistant image wants them (the image is then the result's own frame, whatever the
pipeline's threads are doing meanwhile); they are never serialised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agent.config import PipelineConfig
from agent.pipeline_tracking import TrackingSink
from agent.results import Result
from agent.steps.base import INFERENCE_STEP, PREPROCESS_STEP, FrameRecord, Step


class ResultSink(TrackingSink, Protocol):
    """Where a pipeline's results and events go (the daemon's: agent/results.py ResultWriter, to the
    outbox); what tracking needs of it: agent/pipeline_tracking.py."""

    def submit(self, result: Result) -> None: ...


def result_of(
    record: FrameRecord, pipeline: str, model: Mapping[str, Any], source: Mapping[str, Any], pixels: bool
) -> Result:
    """The result of a frame whose report-thread steps ran (`source`: its uri and counters now;
    `pixels`: hand the frame's pixels along)."""
    timings = record.timings_ms
    # Every step after the model that ran before this one (postprocess, tracking, rules, ...).
    postprocess_ms = sum(ms for step, ms in timings.items() if step not in (PREPROCESS_STEP, INFERENCE_STEP))
    return Result(
        pipeline=pipeline,
        captured_at=record.captured_at,
        model=model,
        backend=record.backend,
        precision=record.precision,
        latency_ms={
            "preprocess": round(timings.get(PREPROCESS_STEP, 0.0), 3),
            "inference": round(record.inference_ms, 3),
            "postprocess": round(postprocess_ms, 3),
            "capture_to_result": round((time.time() - record.captured_at) * 1000, 3),
        },
        source={
            "uri": source["uri"],
            "frame": record.index,
            "position_s": None if record.position_s is None else round(record.position_s, 3),
            **{key: value for key, value in source.items() if key != "uri"},
        },
        output=record.output or {},
        held_back=record.held_back,
        frames_gated=None if record.motion_areas is None else record.frames_gated,  # (None: no gate ran)
        events=record.events,
        publish=record.publish,
        scene=record.scene,
        tags=record.tags,
        pixels=record.pixels if pixels else None,
    )


class ReportStep(Step):
    name = "report"
    thread = "report"

    def __init__(
        self,
        config: PipelineConfig,
        sink: ResultSink,
        model: Mapping[str, Any],
        source: Callable[[], Mapping[str, Any]],
    ) -> None:
        super().__init__()
        self.pipeline = config.name
        self.sink = sink
        self.model = model
        self.source = source
        self.needs_pixels = config.home_automation.image  # the image is the result's own frame

    @property
    def failure(self) -> str:
        return "cannot store the result"

    def run(self, record: FrameRecord) -> bool:
        self.sink.submit(result_of(record, self.pipeline, self.model, self.source(), self.needs_pixels))
        return True
