"""What candidates are proven on (the model's test data, else a frame from the pipeline's own
source) and judged by (the pipeline's reports where its postprocessor says what matters)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from agent.config import AgentConfig, PipelineConfig
from agent.errors import EdgeAgentError
from agent.processing.feed import Feeder, build_feeder
from agent.processing.judge import Judge, report_judge
from agent.sources import Frame, open_source
from agent.testdata import TestData, testdata_samples
from providers import Backend, BackendError, ModelArtifact
from providers.select import Sample, reference_session

log = logging.getLogger(__package__)  # the package's logger, as before it was split


def grab_sample(pipeline: PipelineConfig, feeder: Feeder, timeout_s: float) -> dict[str, np.ndarray] | None:
    """One real input from the pipeline's own source, as the model's inputs; None if none came in time."""
    source, slot = open_source(pipeline.source, f"{pipeline.name}-sample")
    source.start()
    try:
        frame = slot.get(timeout_s)
    finally:
        source.stop(timeout=5)
    if frame is None:
        return None
    return feeder.feeds(frame.data, gap=True)[0]


Peek = Callable[[float], Frame | None]  # a frame of an open source, within a timeout, not taken from it


def proof_samples(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    testdata: Sequence[TestData],
    backends: Sequence[Backend],
    peek: Peek | None = None,
) -> tuple[list[Sample], bool]:
    """What to prove candidates on: the model's test data, then (for the artifacts it does not
    fit) a frame from the pipeline's own source (`peek`: the open source's, else it is opened for
    one frame); empty when neither can be had. And whether a frame was wanted but none came."""
    samples = testdata_samples(testdata, artifacts, backends)
    if all(any(s.fits_artifact(a) for s in samples) for a in artifacts):
        return samples, False
    reference = reference_session(artifacts, backends)
    try:
        feeder = build_feeder(pipeline, reference.inputs, reference.outputs)
    finally:
        reference.close()
    timeout = config.backends.sample_timeout_s
    if peek is not None:
        seen = peek(timeout)
        frame = None if seen is None else feeder.feeds(seen.data, gap=True)[0]
    else:
        frame = grab_sample(pipeline, feeder, timeout)
    if frame is not None:
        return [*samples, Sample(frame, "a frame from the pipeline's source")], False
    return samples, True


def pipeline_judge(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    backends: Sequence[Backend],
) -> Judge | None:
    """Judge candidates on the pipeline's reports where its postprocessor says what matters
    (agent/processing/judge.py); None (tensors) when it does not, or when the outputs cannot be read."""
    try:
        reference = reference_session(artifacts, backends)
    except BackendError:
        return None
    try:
        return report_judge(pipeline.postprocess, reference.outputs, config.backends.match_iou)
    except EdgeAgentError as exc:  # a postprocess that does not fit the outputs fails the build later
        log.debug("pipeline %s: judging candidates on tensors: %s", pipeline.name, exc)
        return None
    finally:
        reference.close()
