"""A pipeline's per-frame path as an ordered list of steps over one `FrameRecord` (agent/steps/base.py).

`build_steps` is the one place the list is put together from a pipeline's config; a new step is a
module here and one line below. Each step declares its thread (prepare / inference / report), whether
it is a gate, and whether it needs the frame's pixels; agent/pipeline.py runs them in order on their
threads and counts a failure against the step that failed.

    motion (gate) -> preprocess -> inference -> postprocess -> filter -> tracking -> attributes -> clips
    (prepare ...............)     (inference)  (report ...................................................
      -> live view -> report rules (gate) -> tag -> report
      ...............................)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.attribute_models import AttributeSet
from agent.batching import runs_batches
from agent.config import PipelineConfig
from agent.filter_counts import Drops
from agent.live_view import LiveView
from agent.pipeline_attributes import PipelineAttributes
from agent.pipeline_tracking import PipelineTracking
from agent.processing import Postprocessor
from agent.processing.feed import Feeder
from agent.rules import ReportRules
from agent.stage import Stage
from agent.steps.attributes import AttributesStep
from agent.steps.base import THREADS, FrameRecord, Step, StepStats, Thread
from agent.steps.clips import ClipsStep
from agent.steps.filter import FilterStep
from agent.steps.infer import InferStep, RunModel
from agent.steps.live import LiveViewStep
from agent.steps.motion import MotionGateStep, PipelineMotion
from agent.steps.postprocess import PostprocessStep
from agent.steps.prepare import PrepareStep
from agent.steps.report import ReportStep, ResultSink, result_of
from agent.steps.report_rules import ReportRulesStep
from agent.steps.tag import TagStep
from agent.steps.track import TrackStep

__all__ = [
    "THREADS",
    "FrameRecord",
    "PipelineMotion",
    "Plan",
    "ResultSink",
    "Step",
    "StepParts",
    "StepStats",
    "Thread",
    "build_steps",
    "plan_for",
    "result_of",
]


@dataclass(frozen=True)
class StepParts:
    """What steps are made of besides the config: the stage's (its model's run, feeder, postprocessor
    and report rules, agent/stage.py) and the pipeline's (its sink, its scene, its source)."""

    feeder: Feeder
    run_model: RunModel
    serving: Callable[[], tuple[str, str]]  # the backend and precision the model runs on now
    fall_back: Callable[[str], None]  # a backend keeps failing: try the next candidate
    batches: Callable[[], bool]  # the model serving now runs several inputs at once (motion regions)
    postprocess: Postprocessor
    rules: ReportRules
    model: Mapping[str, Any]  # name, version, sha256: the result's `model`
    sink: ResultSink
    tracking: PipelineTracking
    motion: PipelineMotion  # the motion gate's background and counters (kept across stages)
    drops: Drops  # what the filters dropped (kept across stages)
    source: Callable[[], Mapping[str, Any]]  # the source's uri and counters, for a result
    attribute_models: AttributeSet | None  # the stage's second models (None: no attributes)
    readings: PipelineAttributes  # which object was read when, and the answers (kept across stages)
    live_view: LiveView  # the pipeline's latest drawn frame for its viewers (kept across stages)


def build_steps(config: PipelineConfig, parts: StepParts) -> list[Step]:
    """The steps a frame of this pipeline walks, in order: one line a step (None: not in this one)."""
    tracks = config.tracking is not None or parts.tracking.scene is not None  # (or a scene to end)
    gate = config.motion_gate
    steps = [
        MotionGateStep(gate, parts.motion, parts.tracking.tracks_alive) if gate is not None else None,
        PrepareStep(parts.feeder, gate, parts.tracking),  # (motion regions: crops around the motion)
        InferStep(parts.run_model, parts.serving, parts.fall_back, parts.batches),
        PostprocessStep(parts.postprocess),
        FilterStep(config.filters, parts.drops) if config.filters is not None else None,
        TrackStep(config, parts.tracking) if tracks else None,
        AttributesStep(config, parts.attribute_models, parts.readings, parts.tracking)
        if config.attributes and parts.attribute_models is not None
        else None,
        ClipsStep(config, parts.tracking) if config.clips.enabled and tracks else None,
        LiveViewStep(config, parts.live_view, parts.tracking),  # (before the rules: held back is seen)
        ReportRulesStep(config.report, parts.rules),
        TagStep(config.report.tags) if config.report.tags else None,
        ReportStep(config, parts.sink, parts.model, parts.source),
    ]
    return [step for step in steps if step is not None]


@dataclass(frozen=True)
class Plan:
    """A stage and the steps its frames walk in a pipeline, by thread."""

    stage: Stage
    steps: dict[Thread, list[Step]]
    keeps_pixels: bool  # a step after the model needs the frame's pixels


def plan_for(
    stage: Stage,
    sink: ResultSink,
    tracking: PipelineTracking,
    source: Callable[[], Mapping[str, Any]],
    motion: PipelineMotion | None = None,
    drops: Drops | None = None,
    readings: PipelineAttributes | None = None,
    live_view: LiveView | None = None,
) -> Plan:
    """The steps of `stage` in a pipeline with this sink, scene, source, motion background, filter
    counts, attribute readings and live view (None: new ones)."""
    parts = StepParts(
        feeder=stage.feeder,
        run_model=lambda feeds: stage.infer(feeds, offer=stage.offer_sample),
        serving=stage.running_on,
        fall_back=stage.fall_back,
        batches=lambda: runs_batches(stage.model.session),
        postprocess=stage.postprocess,
        rules=stage.rules,
        model=stage.identity,
        sink=sink,
        tracking=tracking,
        motion=motion or PipelineMotion(),
        drops=drops or Drops(),
        source=source,
        attribute_models=stage.attributes if isinstance(stage.attributes, AttributeSet) else None,
        readings=readings or PipelineAttributes(),
        live_view=live_view or LiveView(stage.config.name),
    )
    steps = build_steps(stage.config, parts)
    order = [THREADS.index(step.thread) for step in steps]
    assert order == sorted(order), f"steps out of their threads' order: {[s.name for s in steps]}"
    by_thread: dict[Thread, list[Step]] = {t: [s for s in steps if s.thread == t] for t in THREADS}
    return Plan(stage, by_thread, any(step.needs_pixels for step in by_thread["report"]))
