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
    "PipelineParts",
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
class PipelineParts:
    """What a pipeline keeps across its stages (a new model version, a changed zone): its sink, its
    source's counters, its tracking and scene, the motion gate's background and counts, what the
    filters dropped, which object a second model read when, and its live view."""

    sink: ResultSink
    source: Callable[[], Mapping[str, Any]]  # the source's uri and counters, for a result
    tracking: PipelineTracking
    motion: PipelineMotion
    drops: Drops
    readings: PipelineAttributes
    live_view: LiveView

    @classmethod
    def new(cls, name: str, sink: ResultSink, source: Callable[[], Mapping[str, Any]]) -> PipelineParts:
        """Fresh ones, for a pipeline named `name` (or a test's stage run alone)."""
        return cls(
            sink, source, PipelineTracking(name, sink), PipelineMotion(), Drops(), PipelineAttributes(),
            LiveView(name),
        )  # fmt: skip


@dataclass(frozen=True)
class StepParts:
    """What steps are made of besides the config: the stage's (its model's run, feeder, postprocessor
    and report rules, agent/stage.py) and the pipeline's (`kept`)."""

    feeder: Feeder
    run_model: RunModel
    serving: Callable[[], tuple[str, str]]  # the backend and precision the model runs on now
    fall_back: Callable[[str], None]  # a backend keeps failing: try the next candidate
    batches: Callable[[], bool]  # the model serving now runs several inputs at once (motion regions)
    postprocess: Postprocessor
    rules: ReportRules
    model: Mapping[str, Any]  # name, version, sha256: the result's `model`
    attribute_models: AttributeSet | None  # the stage's second models (None: no attributes)
    kept: PipelineParts  # the pipeline's, kept across stages


def build_steps(config: PipelineConfig, parts: StepParts) -> list[Step]:
    """The steps a frame of this pipeline walks, in order: one line a step (None: not in this one)."""
    kept = parts.kept
    tracks = config.tracking is not None or kept.tracking.scene is not None  # (or a scene to end)
    gate = config.motion_gate
    steps = [
        MotionGateStep(gate, kept.motion, kept.tracking.tracks_alive) if gate is not None else None,
        PrepareStep(parts.feeder, gate, kept.tracking),  # (motion regions: crops around the motion)
        InferStep(parts.run_model, parts.serving, parts.fall_back, parts.batches),
        PostprocessStep(parts.postprocess),
        FilterStep(config.filters, kept.drops) if config.filters is not None else None,
        TrackStep(config, kept.tracking) if tracks else None,
        AttributesStep(config, parts.attribute_models, kept.readings, kept.tracking)
        if config.attributes and parts.attribute_models is not None
        else None,
        ClipsStep(config, kept.tracking) if config.clips.enabled and tracks else None,
        LiveViewStep(config, kept.live_view, kept.tracking),  # (before the rules: held back is seen)
        ReportRulesStep(config.report, parts.rules),
        TagStep(config.report.tags) if config.report.tags else None,
        ReportStep(config, kept.sink, parts.model, kept.source),
    ]
    return [step for step in steps if step is not None]


@dataclass(frozen=True)
class Plan:
    """A stage and the steps its frames walk in a pipeline, by thread."""

    stage: Stage
    steps: dict[Thread, list[Step]]
    keeps_pixels: bool  # a step after the model needs the frame's pixels


def plan_for(stage: Stage, kept: PipelineParts) -> Plan:
    """The steps of `stage` in a pipeline that keeps these parts across its stages."""
    parts = StepParts(
        feeder=stage.feeder,
        run_model=lambda feeds: stage.infer(feeds, offer=stage.offer_sample),
        serving=stage.running_on,
        fall_back=stage.fall_back,
        batches=lambda: runs_batches(stage.model.session),
        postprocess=stage.postprocess,
        rules=stage.rules,
        model=stage.identity,
        attribute_models=stage.attributes if isinstance(stage.attributes, AttributeSet) else None,
        kept=kept,
    )
    steps = build_steps(stage.config, parts)
    order = [THREADS.index(step.thread) for step in steps]
    assert order == sorted(order), f"steps out of their threads' order: {[s.name for s in steps]}"
    by_thread: dict[Thread, list[Step]] = {t: [s for s in steps if s.thread == t] for t in THREADS}
    return Plan(stage, by_thread, any(step.needs_pixels for step in by_thread["report"]))
