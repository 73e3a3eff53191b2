"""Validate a model version on this box: every candidate (backend x artifact, upgraded twins
included) on every test set, judged against the expected outputs at the test data's tolerances.

What `edge-agent models validate` prints and what `registry publish` requires: a version is usable
when some candidate loads, runs and gives the expected outputs on every test set that fits it. The
candidate the agent would activate comes from the selection itself (`decide`), fed the same trials.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.testdata import TestData, testdata_fits
from agent.transform import with_upgraded_twins
from providers import Backend, ModelArtifact, TrialRequest, TrialResult, all_backends, run_trial_isolated
from providers.select import (
    Decision,
    NoBackendError,
    Sample,
    SelectionPolicy,
    Trial,
    compare_outputs,
    computed_reference,
    decide,
    judged_by,
    non_finite_reference,
    output_pairs,
    published_non_finite_met,
    screen,
    trial_request,
)

log = logging.getLogger(__name__)


@dataclass
class OutputError:
    """How far one output of one test set is from what was expected."""

    test_set: str
    output: str
    max_abs: float | None  # None: not numbers (compared for equality)
    max_rel: float | None
    within: bool


@dataclass
class CandidateCheck:
    backend: str
    artifact: str
    loads: bool = False
    runs: bool = False
    correct: bool | None = None  # None: no test set with expected outputs fits it
    reason: str = ""
    precision: str = ""
    median_ms: float | None = None
    errors: list[OutputError] = field(default_factory=list)


@dataclass
class Validation:
    model: str
    test_sets: list[str]
    unfit: list[tuple[str, str]]  # (test data, why it fits no model file)
    candidates: list[CandidateCheck]
    unusable: list[tuple[str, str, str]]  # (backend, artifact, why it is no candidate)
    activated: str | None  # "backend on artifact", or None
    decision: str  # the selection's explanation, or why nothing can be activated
    proven: Decision | None = None  # the decision itself, proven on the test sets
    cached: bool = False  # kept as the agent's decision for this model on this box

    @property
    def usable(self) -> bool:
        """Some candidate gives the expected outputs (or, for test data that has none, runs)."""
        return any(c.correct or (c.correct is None and c.runs) for c in self.candidates)

    def reasons(self) -> list[str]:
        """Why each candidate (and each backend that is none) does not serve the model."""
        lines = [
            f"{c.backend} on {c.artifact}: {c.reason}"
            for c in self.candidates
            if not (c.correct or (c.runs and c.correct is None))
        ]
        lines += [f"{backend} on {artifact}: {why}" for backend, artifact, why in self.unusable]
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "usable": self.usable}
        data.pop("proven")  # `activated` and `decision` say it (explain has the table)
        return data


def validate(
    model: str,
    artifacts: Sequence[ModelArtifact],
    testdata: Sequence[TestData],
    policy: SelectionPolicy,
    derived_dir: Path | None,
    backends: Sequence[Backend] | None = None,
    trial: Trial = run_trial_isolated,
) -> Validation:
    """Run every candidate of this box on every test set (see the module docstring)."""
    backends = list(backends if backends is not None else all_backends())
    if derived_dir is not None:  # None: `artifacts` has the twins already (model_candidates)
        artifacts = with_upgraded_twins(artifacts, backends, derived_dir)
    fits = testdata_fits(testdata, artifacts, backends)
    samples = [sample for _data, sample, _why in fits if sample is not None]
    unfit = [(data.artifact.label, why) for data, sample, why in fits if sample is None]
    ranked, rejected = screen(artifacts, policy, backends)
    # Backends that are here and read the format but refuse the model (operators): a reason about
    # the model. Backends this box lacks are `edge-agent providers`' business, not the model's.
    readers = {b.name: b.formats for b in backends if b.probe().available}
    refusing = [
        r
        for r in rejected
        if any(a.label == r.artifact and a.format in readers.get(r.backend, ()) for a in artifacts)
    ]
    cached = _CachingTrial(trial)
    checks = []
    for backend, artifact in ranked:
        check = CandidateCheck(backend.name, artifact.label)
        fitting = [(i, s) for i, s in enumerate(samples) if s.fits_artifact(artifact)]
        if not fitting:
            check.reason = "no test set fits this artifact"
        for _index, sample in fitting:
            result = cached(trial_request(backend.name, artifact, sample, policy), policy.timeout_s)
            if not result.ok:
                check.reason = result.error
                check.correct = False
                break
            check.loads = check.runs = True
            check.precision, check.median_ms = result.precision, result.median_ms
            if not sample.expected:
                continue
            _judge(check, sample, result, policy)
        checks.append(check)
    # The CPU reference on each test set (its trial is one of the candidates' above): a version on
    # whose own test data it gives NaN or infinities (where the expected outputs do not) is unusable,
    # whatever the candidates do; nothing can be proven against it, nor served on it.
    unreferenced: list[str] = []
    for sample in samples:
        name, outputs = computed_reference(sample, policy, cached, artifacts, backends)
        problem = non_finite_reference(name, outputs, sample) if name and outputs is not None else ""
        if not problem:
            continue
        unreferenced.append(problem)
        log.warning("%s: %s", model, problem)
        for (_backend, artifact), check in zip(ranked, checks, strict=True):
            if check.runs and sample.fits_artifact(artifact):
                check.correct = False
                check.reason = problem + (f"; {check.reason}" if check.reason else "")
    activated: str | None = None
    proven: Decision | None = None
    try:
        decision: Decision = decide(artifacts, policy, samples, backends, trial=cached)
        activated, explained = f"{decision.backend} on {decision.artifact}", decision.explain()
        proven = decision if decision.checked else None
    except NoBackendError as exc:
        explained = str(exc)
    if unreferenced and activated:  # nothing is activated on a version whose reference is not finite
        activated, proven, explained = None, None, "; ".join(unreferenced)
    return Validation(
        model,
        [s.origin for s in samples],
        unfit,
        checks,
        [(r.backend, r.artifact, r.reason) for r in refusing],
        activated,
        explained,
        proven,
    )


def _judge(check: CandidateCheck, sample: Sample, result: TrialResult, policy: SelectionPolicy) -> None:
    assert sample.expected is not None
    rules = judged_by(sample, policy)
    _worst, problem = compare_outputs(result.outputs, sample.expected, rules)
    pairs = output_pairs(result.outputs, sample.expected)  # as compare_outputs pairs them
    if pairs is None:  # not even the outputs' count fits
        check.errors += [OutputError(sample.origin, name, None, None, False) for name in sample.expected]
    for name, got, expected in pairs or []:
        check.errors.append(_output_error(sample.origin, name, got, expected, rules))
    if problem:
        check.correct = False
        check.reason = f"{sample.origin}: {problem}"
    elif check.correct is None:
        check.correct = True


def _output_error(
    test_set: str, name: str, got: np.ndarray, expected: np.ndarray, rules: SelectionPolicy
) -> OutputError:
    out, ref = np.asarray(got), np.asarray(expected)
    if out.shape != ref.shape:
        return OutputError(test_set, name, None, None, False)
    if ref.dtype.kind not in "fc" or out.dtype.kind not in "fciub":
        return OutputError(test_set, name, None, None, bool(np.array_equal(out, ref)))
    if not ref.size:
        return OutputError(test_set, name, 0.0, 0.0, True)
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    out_finite, ref_finite = np.isfinite(out64), np.isfinite(ref64)
    # NaN or an infinity in the expected outputs is the publisher's contract (onnx's Pow and Sqrt
    # tests), met only by the same value at the same place; a NaN or infinite output where a number
    # is expected (or the other way round) is infinitely off. An expected output with no finite
    # value proves nothing: never within.
    same = published_non_finite_met(out64, ref64)
    both = out_finite & ref_finite
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.where(both, np.abs(out64 - ref64), np.where(same, 0.0, np.inf))
        rel = np.where(ref64 != 0, diff / np.abs(ref64), np.where(diff == 0, 0.0, np.inf))
    rel = np.where(both, rel, diff)  # 0 where matched, inf where not
    close = np.isclose(out64, ref64, rtol=rules.rtol, atol=rules.atol, equal_nan=True) & (both | same)
    within = bool(ref_finite.any()) and not (ref_finite & ~out_finite).any()
    within = within and bool(close.mean() >= 1 - rules.max_mismatch)
    return OutputError(test_set, name, float(diff.max()), float(rel.max()), within)


class _CachingTrial:
    """A trial function that runs each (backend, artifact, inputs) once: validation's trials are
    the ones `decide` asks for again."""

    def __init__(self, trial: Trial) -> None:
        self._trial = trial
        self._results: dict[tuple[str, str, int], TrialResult] = {}

    def __call__(self, request: TrialRequest, timeout_s: float) -> TrialResult:
        key = (request.backend, request.artifact.sha256, id(request.feeds))
        if key not in self._results:
            self._results[key] = self._trial(request, timeout_s)
        return self._results[key]
