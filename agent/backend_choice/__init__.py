"""Choosing a pipeline's backend on this box: policy from the config, a real sample from the
pipeline's own source, the decision proven by `providers.decide`, cached and explained.

The decision is cached in `<state_dir>/decisions/` keyed by the model's artifact hashes, this
box's hardware fingerprint, the runtimes' versions and the policy, so a restart does not
benchmark again, and a driver upgrade or a new accelerator does.

`current_choice` and `choose_and_load` are here; the package's other modules: `box` (this box, the
policy), `decisions` (the cache), `proof` (samples and judging) and `switcher` (fallback while
serving).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.backend_choice.box import (
    Box,
    box_backends,
    derived_dir_of,
    hardware_notes,
    owns_state_dir,
    policy_for,
    providers_report,
)
from agent.backend_choice.decisions import DecisionStore, deciding_lock, decision_key
from agent.backend_choice.proof import Peek, grab_sample, pipeline_judge, proof_samples
from agent.backend_choice.switcher import DecisionSwitcher, Prover
from agent.config import AgentConfig, PipelineConfig
from agent.errors import ModelError
from agent.processing.judge import judged_on
from agent.testdata import TestData, testdata_samples
from agent.transform import with_upgraded_twins
from providers import BackendError, Decision, ModelArtifact, SelectionPolicy, Session, decide, load_decided
from providers.select import (
    FULL_PRECISION_REFERENCES,
    CandidateReport,
    Loader,
    NoBackendError,
    Progress,
    Sample,
    compare_outputs,
    judged_by,
    reference_first,
)

log = logging.getLogger(__name__)


__all__ = [
    "Box",
    "Choice",
    "DecisionStore",
    "DecisionSwitcher",
    "Peek",
    "Prover",
    "box_backends",
    "check_on_testdata",
    "choose_and_load",
    "current_choice",
    "decision_key",
    "derived_dir_of",
    "first_start_decision",
    "grab_sample",
    "hardware_notes",
    "load_choice",
    "make_prover",
    "model_candidates",
    "owns_state_dir",
    "pipeline_judge",
    "policy_for",
    "prove_on",
    "providers_report",
]


@dataclass
class Choice:
    """Where a model runs on this box and why: the one answer the daemon, infer, bench, explain,
    doctor, validate and the fleet commands share (`current_choice`, `choose_and_load`).

    `artifacts` are what it chose among (upgraded twins included: the choice may be one), `policy`
    and `box` what it was made under, `key` its decision cache key. `cached`: read from the cache
    (proven on an earlier start, or by `models validate`)."""

    model: str
    decision: Decision
    artifacts: list[ModelArtifact]
    policy: SelectionPolicy
    box: Box
    key: str
    cached: bool = False
    screened: bool = True  # False: the reference taken at once, the other candidates not screened
    load_failures: tuple[str, ...] = ()  # the candidates that did not load before the one serving

    @property
    def backend(self) -> str:
        return self.decision.backend

    @property
    def artifact(self) -> str:
        return self.decision.artifact

    @property
    def precision(self) -> str | None:
        return self.decision.precision

    @property
    def proven(self) -> bool:
        """Its outputs were compared with a reference (expected outputs, or the CPU reference)."""
        return self.decision.checked

    @property
    def full_precision_reference(self) -> bool:
        return self.decision.backend in FULL_PRECISION_REFERENCES

    def summary(self) -> dict[str, Any]:
        """What runs, for people and scripts: backend, artifact, precision, proven and on what."""
        return {
            "model": self.model,
            "backend": self.backend,
            "artifact": self.artifact,
            "precision": self.precision,
            "proven": self.proven,
            "proof": self.decision.proof() if self.proven else None,
            "cached": self.cached,
            "why": self.decision.explain(),
        }


def model_candidates(
    config: AgentConfig, artifacts: Sequence[ModelArtifact], box: Box, derived_dir: Path | None = None
) -> list[ModelArtifact]:
    """The model's files plus an opset-upgraded twin of each the CPU reference refuses as it is
    (kept in the store's derived/ folder, made once)."""
    return with_upgraded_twins(artifacts, box.backends, derived_dir or derived_dir_of(config))


def current_choice(
    config: AgentConfig,
    pipeline: PipelineConfig | None,
    artifacts: Sequence[ModelArtifact],
    model_ref: str,
    testdata: Sequence[TestData] = (),
    box: Box | None = None,
    derived_dir: Path | None = None,
    screen_all: bool = False,
) -> Choice:
    """Where this box runs the model now, without running it: the cached proven decision for this
    model, policy and box; else what a first start serves (the full-precision CPU reference, the
    upgraded twin where it refuses the file as it is) until a sample proves another candidate.

    `screen_all`: rank every candidate too (what would be tried next: `explain`), which loads
    every runtime to check the model's operators; else only the reference is named. Raises
    NoBackendError (each candidate's reason) when nothing can serve the model."""
    box = box or Box.here(config)
    policy = policy_for(config, pipeline, box.backends)
    candidates = model_candidates(config, artifacts, box, derived_dir)
    key = decision_key(candidates, testdata, policy, box.backends, box.hardware)
    cached = DecisionStore(config.state_dir).get(key)
    if cached is not None:
        return Choice(model_ref, cached, candidates, policy, box, key, cached=True)
    decision, screened = first_start_decision(candidates, policy, box, screen_all)
    return Choice(model_ref, decision, candidates, policy, box, key, screened=screened)


def first_start_decision(
    artifacts: Sequence[ModelArtifact], policy: SelectionPolicy, box: Box, screen_all: bool = False
) -> tuple[Decision, bool]:
    """What serves before any sample proved a candidate, and whether the others were screened: the
    full-precision reference at once (reference_first), else (the policy rules it out, benchmarking
    is off, or `screen_all`) `decide` without a sample."""
    if policy.benchmark and not screen_all:
        quick = reference_first(artifacts, policy, box.backends)
        if quick is not None:
            return quick, False
    notes = hardware_notes(box.hardware)
    return decide(artifacts, policy, None, box.backends, hardware=notes), True


def choose_and_load(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    model_ref: str,
    testdata: Sequence[TestData] = (),
    progress: Progress | None = None,
    load: Loader | None = None,
    peek: Peek | None = None,
    prove_later: bool = False,
    box: Box | None = None,
) -> tuple[Session, Choice]:
    """The current choice (`current_choice`), proven first where it is not and `prove_later` is
    off, and loaded in this process (the next candidate where the chosen one does not load).

    `prove_later`: with no cached decision, serve the first-start choice at once, unproven (the
    caller proves the candidates on a live frame beside it: make_prover), instead of running
    trials first. Else candidates are proven on the model's test data (`testdata`) where it fits,
    else on a frame from the pipeline's own source (`peek`: see proof_samples). `progress` hears each
    step (trials, engine builds) before it starts.

    Pipelines on the same model decide one at a time: the second finds the first's proven decision
    in the cache instead of deciding again (or guessing by rank when its own source is dead).
    """
    say = progress or (lambda _text: None)
    store = DecisionStore(config.state_dir)
    try:
        choice = current_choice(config, pipeline, artifacts, model_ref, testdata, box)
    except NoBackendError as exc:  # the policy rules the reference out, and nothing else can serve
        store.put_refusal(exc, pipeline.name, model_ref)
        raise
    policy, backends = choice.policy, choice.box.backends
    if choice.cached:
        log.info("pipeline %s: using the cached backend decision %s", pipeline.name, choice.key)
    elif policy.benchmark and prove_later:
        log.info(
            "pipeline %s: no proven decision for %s yet: serving on %s while the candidates are "
            "proven on its first frame",
            pipeline.name,
            model_ref,
            "the CPU reference" if choice.full_precision_reference else f"{choice.backend}, unproven,",
        )
    elif not policy.benchmark:
        log.info(
            "pipeline %s: choosing a backend for %s (benchmarking off: by rank)", pipeline.name, model_ref
        )
    else:
        say("getting inputs to prove backends on")
        samples, no_frame = proof_samples(config, pipeline, choice.artifacts, testdata, backends, peek)
        choice = _prove_now(config, pipeline, choice, samples, no_frame, progress)
    try:
        session, choice = load_choice(choice, f"pipeline {pipeline.name}", progress, load)
    except NoBackendError as exc:
        store.put_refusal(exc, pipeline.name, model_ref)
        raise
    # Recorded for this pipeline (explain, reselect-backend); cached for the next start only when
    # proven, or when benchmarking is off (an unchecked first-start choice is made again).
    cache = not choice.cached and (choice.proven or not policy.benchmark)
    store.put(choice.key, choice.decision, pipeline.name, model_ref, cache=cache)
    return session, choice


def _prove_now(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    samples: list[Sample],
    no_frame: bool,
    progress: Progress | None,
) -> Choice:
    """Prove the candidates on `samples` before serving (the choice is not cached yet)."""
    store = DecisionStore(config.state_dir)
    with deciding_lock(choice.key):
        # Another pipeline on this model may have proven a decision while this one waited for a frame.
        cached = store.get(choice.key)
        if no_frame:
            log.warning(
                "pipeline %s: no frame from its source within %.0f s; %s",
                pipeline.name,
                config.backends.sample_timeout_s,
                "another pipeline on this model proved a decision meanwhile: using it"
                if cached is not None
                else "only the candidates its test data fits are proven"
                if samples
                else "serving on the full-precision CPU reference, outputs not checked",
            )
        if cached is not None:
            log.info("pipeline %s: using the cached backend decision %s", pipeline.name, choice.key)
            return replace(choice, decision=cached, cached=True)
        if not samples:
            return choice
        log.info(
            "pipeline %s: choosing a backend for %s (benchmarking the top candidates on %s)",
            pipeline.name,
            choice.model,
            ", ".join(s.origin for s in samples),
        )
        try:
            decision = _decide_on(config, pipeline, choice, samples, progress)
        except NoBackendError as exc:
            store.put_refusal(exc, pipeline.name, choice.model)
            raise
        return replace(choice, decision=decision, screened=True)


def load_choice(
    choice: Choice, who: str, progress: Progress | None = None, load: Loader | None = None
) -> tuple[Session, Choice]:
    """Load the choice in this process; where it fails, the next candidate of its order (the
    returned choice's `load_failures` say which did not). The reference taken at once (an
    unscreened choice) that cannot load the model after all: every candidate is screened for
    another. NoBackendError when none can."""
    try:
        session, _used, failures = _load(choice, progress, load)
    except BackendError as exc:
        if choice.screened:
            raise
        log.info("%s: %s; screening every candidate", who, exc)
        decision, _screened = first_start_decision(
            choice.artifacts, choice.policy, choice.box, screen_all=True
        )
        choice = replace(choice, decision=decision, screened=True)
        session, _used, failures = _load(choice, progress, load)
    for failure in failures:
        log.warning("%s: %s; falling back to the next backend", who, failure)
    # The decision stays as it was made (it is cached): what serves instead shows from the session.
    return session, replace(choice, load_failures=tuple(failures))


def _load(
    choice: Choice, progress: Progress | None = None, load: Loader | None = None
) -> tuple[Session, CandidateReport, list[str]]:
    return load_decided(choice.decision, choice.artifacts, choice.policy, choice.box.backends, progress, load)


def check_on_testdata(session: Session, choice: Choice, testdata: Sequence[TestData]) -> int:
    """Run the loaded session on every test set that fits its artifact and compare with the expected
    outputs at the test data's tolerances: the proof a version gets on this box when the decision
    did not run trials (benchmarking off). Returns the number of sets checked; ModelError naming
    the set and the difference when one is wrong."""
    artifacts, policy, backends = choice.artifacts, choice.policy, choice.box.backends
    artifact_sha256 = choice.decision.artifact_sha256
    checked = 0
    artifact = next((a for a in artifacts if a.sha256 == artifact_sha256), None)
    if artifact is None:
        return 0
    for sample in testdata_samples(testdata, [artifact], backends):
        if not sample.expected or not sample.fits_artifact(artifact):
            continue
        outputs = session.run(sample.feeds)
        max_diff, problem = compare_outputs(outputs, sample.expected, judged_by(sample, policy))
        if problem:
            raise ModelError(
                f"{session.backend} does not give the expected outputs in {sample.origin}: {problem}"
                + (f" (max abs diff {max_diff:.3g})" if max_diff is not None else ""),
                hint="the version's test data disagrees with what the model computes on this box",
            )
        checked += 1
    return checked


def prove_on(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    feeds: Mapping[str, np.ndarray],
    testdata: Sequence[TestData] = (),
    origin: str = "a frame from the pipeline's source",
    record: bool = True,
    cache: bool = True,
) -> Choice:
    """Decide again with the candidates proven on `feeds` (plus the model's test data); a proven
    decision is cached under the choice's key (with `cache`), for every later start and tool to
    find, and with `record` recorded as the pipeline's for `explain`."""
    backends = choice.box.backends
    samples = [*testdata_samples(testdata, choice.artifacts, backends), Sample(feeds, origin)]
    log.info("pipeline %s: proving the candidates for %s on %s", pipeline.name, choice.model, origin)
    decision = _decide_on(config, pipeline, choice, samples)
    if decision.checked and (cache or record) and owns_state_dir(config):
        store = DecisionStore(config.state_dir)
        store.put(choice.key, decision, pipeline.name if record else None, choice.model, cache=cache)
    return replace(choice, decision=decision, cached=False, screened=True)


def _decide_on(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    samples: Sequence[Sample],
    progress: Progress | None = None,
) -> Decision:
    """`decide` among the choice's candidates under its policy, proven on `samples` and judged as
    the pipeline reports (pipeline_judge)."""
    judge = pipeline_judge(config, pipeline, choice.artifacts, choice.box.backends)
    notes = hardware_notes(choice.box.hardware)
    return decide(
        choice.artifacts,
        choice.policy,
        samples,
        choice.box.backends,
        hardware=notes,
        progress=progress,
        judge=judge,
        judged_on=judged_on(pipeline.postprocess),
    )


def make_prover(
    config: AgentConfig, pipeline: PipelineConfig, choice: Choice, testdata: Sequence[TestData] = ()
) -> Prover:
    """For a pipeline whose choice is not proven (no sample when it was built): a function that
    proves the candidates on one of its frames (prove_on)."""

    def prove(feeds: Mapping[str, np.ndarray]) -> Decision:
        return prove_on(config, pipeline, choice, feeds, testdata).decision

    return prove
