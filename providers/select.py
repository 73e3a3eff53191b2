"""Pick the backend for a model: filter with reasons, rank, prove the best few, choose.

1. Candidates are every backend x every artifact of the model version.
2. Each is kept or rejected with a reason: policy (deny / fixed), probe (runtime or device
   missing), format, operator coverage.
3. The rest are ranked: native formats first (OpenVINO reading a .tflite file is second tier), then
   the policy's `prefer` patterns, then DEFAULT_PREFERENCE.
4. Unless benchmarking is off, the top `max_trials` run in child processes (timeout each) on a
   real sample input (the model's own test data where it fits the artifact, else a frame from the
   pipeline's source), next to a reference (the expected outputs shipped with the test data, else a
   plain CPU backend's outputs): a candidate whose outputs differ from the reference beyond the
   tolerances is rejected, however fast. A reference that is not finite (a CPU backend's NaN or
   infinities, where no expected outputs put NaN) is none: the candidates proven on that sample are
   rejected for it. The fastest correct one wins (among native-format candidates when any is correct).
5. The Decision lists every candidate with its verdict and numbers (`explain()`).

This module is data in, data out: no files, no hardware access; tests feed it backends.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from providers.base import Backend, BackendError, ModelArtifact, Session, TensorSpec
from providers.registry import all_backends
from providers.trial import TrialRequest, TrialResult, run_trial_isolated

log = logging.getLogger(__name__)

# Most wanted first; glob patterns over backend names. TensorRT and CUDA on NVIDIA, then the
# dedicated NPUs/TPUs, GPUs, then CPUs (OpenVINO's CPU plugin before onnxruntime's CPU EP).
DEFAULT_PREFERENCE: tuple[str, ...] = (
    "onnxruntime/TensorrtExecutionProvider",
    "onnxruntime/CUDAExecutionProvider",
    "tflite/edgetpu",
    "openvino/NPU*",
    "openvino/GPU*",
    "onnxruntime/ROCMExecutionProvider",
    "onnxruntime/OpenVINOExecutionProvider",
    "onnxruntime/CoreMLExecutionProvider",
    "openvino/CPU",
    "onnxruntime/XnnpackExecutionProvider",
    "onnxruntime/CPUExecutionProvider",
    "tflite/cpu",
    "openvino/AUTO",
    "*",
)

# Where reference outputs come from: the plainest CPU backend that can read the artifact.
REFERENCE_BACKENDS: tuple[str, ...] = ("onnxruntime/CPUExecutionProvider", "tflite/cpu", "openvino/CPU")
# The references that always compute at full precision (OpenVINO's CPU may default to bf16).
FULL_PRECISION_REFERENCES: tuple[str, ...] = ("onnxruntime/CPUExecutionProvider", "tflite/cpu")


@dataclass(frozen=True)
class SelectionPolicy:
    prefer: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    fixed: str | None = None
    benchmark: bool = True
    max_trials: int = 3
    warmup: int = 3
    runs: int = 20
    min_time_s: float = 1.0
    budget_s: float = 5.0
    timeout_s: float = 180.0
    rtol: float = 1e-2
    atol: float = 1e-3
    max_mismatch: float = 0.001  # share of an output's values allowed outside the tolerance
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    spare_core: bool = True  # try CPU backends with one core fewer (spare_core_variant)

    def options_for(self, backend: str) -> dict[str, Any]:
        return dict(self.options.get(backend, {}))


# The option that caps the threads of one inference, for the CPU backends that use every core by
# default. A pipeline decodes, prepares and reports on threads of its own beside inference: a model
# that runs about as fast with one core fewer leaves that core to them (on 2 cores, PP-OCR's
# classifier on OpenVINO: 0.95x the speed alone, 1.37x the pipeline's results/s).
CPU_THREAD_OPTIONS = {"onnxruntime/CPUExecutionProvider": "intra_op_threads", "openvino/CPU": "threads"}
SPARE_CORE_SLOWDOWN = 1.10  # one core fewer is taken when the model is at most this much slower
# ... and only for a model whose run takes less than this on every core: beside a longer run the
# pipeline's own work per frame (about a millisecond of CPU on a small box) hardly counts, and a
# trial fooled by a busy spell would cost a large model up to half its speed for good.
SPARE_CORE_MAX_MS = 5.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a systemd CPUAffinity= or a container's
    cpuset), not every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def spare_core_variant(backend: str, policy: SelectionPolicy) -> dict[str, int] | None:
    """The options that run `backend` with one core fewer, to time beside its defaults; None when it
    has no such option, the box has one core, the policy turns this off or its options set threads."""
    option = CPU_THREAD_OPTIONS.get(backend)
    cores = usable_cores()
    if option is None or cores < 2 or not policy.spare_core or option in policy.options_for(backend):
        return None
    return {option: cores - 1}


def serving_options(policy: SelectionPolicy, report: CandidateReport) -> dict[str, Any]:
    """The options a decided candidate is loaded with: the policy's, plus the thread count its trial
    chose (CandidateReport.threads)."""
    options = policy.options_for(report.backend)
    option = CPU_THREAD_OPTIONS.get(report.backend)
    if report.threads is not None and option is not None:
        options.setdefault(option, report.threads)
    return options


@dataclass(frozen=True)
class Sample:
    """Inputs to prove candidates on, and where they come from.

    `expected` are outputs the model's publisher vouches for (shipped with its test data): when
    present they are the reference. `fits` are the sha256s of the artifacts these inputs are for
    (a .tflite variant may want NHWC where the .onnx wants NCHW); None: every artifact.
    """

    feeds: Mapping[str, np.ndarray]
    origin: str = "a sample input"
    expected: Mapping[str, np.ndarray] | None = None
    fits: frozenset[str] | None = None
    # Tolerances the expected outputs hold to (declared with the test data): every value must be
    # within them. None: the selection policy's.
    rtol: float | None = None
    atol: float | None = None

    def fits_artifact(self, artifact: ModelArtifact) -> bool:
        return self.fits is None or artifact.sha256 in self.fits


Samples = Sequence[Sample] | Mapping[str, np.ndarray] | None


def as_samples(samples: Samples) -> list[Sample]:
    """A bare feeds dict is one sample that fits every artifact."""
    if samples is None:
        return []
    if isinstance(samples, Mapping):
        return [Sample(samples)]
    return list(samples)


@dataclass
class CandidateReport:
    backend: str
    artifact: str  # label
    format: str
    sha256: str
    verdict: str  # "chosen", "rejected", "passed" (correct, not chosen), "untried"
    reason: str = ""
    rank: int | None = None
    precision: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    max_abs_diff: float | None = None
    peak_rss_mb: float | None = None
    unlock: str = ""  # rejected for its outputs: what would let it through
    # Timed with one core fewer too (spare_core_variant), and at most SPARE_CORE_SLOWDOWN slower that
    # way: the threads it runs with, and its median on the runtime's default threads (median_ms and
    # p90_ms are then those with `threads`). None: it runs on the runtime's default threads.
    threads: int | None = None
    default_threads_ms: float | None = None


@dataclass
class Decision:
    backend: str
    artifact_sha256: str
    artifact: str
    precision: str | None
    candidates: list[CandidateReport]
    reference: str | None = None  # the backend whose outputs were the reference
    checked: bool = False  # outputs compared with the reference on a real sample
    note: str = ""
    inputs: str = ""  # where the sample the chosen candidate was proven on came from

    def explain(self) -> str:
        head = f"chose {self.backend} for {self.artifact}"
        chosen = next((c for c in self.candidates if c.verdict == "chosen"), None)
        if chosen and chosen.median_ms is not None:
            head += f" ({chosen.median_ms:.2f} ms median, {chosen.precision}{_spare_core(chosen)})"
        if self.reference and self.checked:
            head += f"; outputs checked against {self.proof()}"
        if self.note:
            head += f"; {self.note}"
        # Candidates with the same verdict for the same reason share one entry: a fixed backend
        # rejects a dozen others alike, and the line should say so once.
        others: dict[tuple[str, str], list[str]] = {}
        for c in self.candidates:
            if c.verdict != "chosen":
                verdict = (
                    f"{c.verdict}{_numbers(c)}"
                    + (f": {c.reason}" if c.reason else "")
                    + (f" (would pass with {c.unlock})" if c.unlock else "")
                )
                others.setdefault((c.artifact, verdict), []).append(c.backend)
        entries = [
            f"{', '.join(backends)} on {artifact}: {verdict}"
            for (artifact, verdict), backends in others.items()
        ]
        return head + (f" (others: {'; '.join(entries)})" if entries else "")

    def proof(self) -> str:
        """What the outputs were checked against, and on which inputs."""
        if self.inputs and self.reference and self.inputs not in self.reference:
            return f"{self.reference} on {self.inputs}"
        return self.reference or ""

    def order(self) -> list[CandidateReport]:
        """Usable candidates, best first: the chosen one, then those that passed, then untried."""
        rank = {"chosen": 0, "passed": 1, "untried": 2}
        usable = [c for c in self.candidates if c.verdict in rank]
        return sorted(usable, key=lambda c: (rank[c.verdict], c.rank if c.rank is not None else 1 << 30))

    def artifact_on(self, backend: str) -> str | None:
        """The artifact a session on `backend` runs: the chosen one on the chosen backend, else the
        best of its order on that backend (a fallback); None when the decision has none there."""
        return next((c.artifact for c in self.order() if c.backend == backend), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        values = dict(data)
        values["candidates"] = [CandidateReport(**c) for c in values.get("candidates", [])]
        return cls(**values)


class NoBackendError(BackendError):
    def __init__(self, candidates: list[CandidateReport]) -> None:
        reasons = "; ".join(
            f"{c.backend} on {c.artifact}: {c.reason}"
            + (f" (would pass with {c.unlock})" if c.unlock else "")
            for c in candidates
        )
        super().__init__(f"no backend can run this model ({reasons or 'no backends are registered'})")
        self.candidates = candidates


def preference_index(name: str, policy: SelectionPolicy) -> tuple[int, int]:
    """Sort key: the policy's prefer list first, then the default preference."""
    for i, pattern in enumerate(policy.prefer):
        if fnmatch.fnmatchcase(name, pattern):
            return (0, i)
    for i, pattern in enumerate(DEFAULT_PREFERENCE):
        if fnmatch.fnmatchcase(name, pattern):
            return (1, i)
    return (2, 0)


def _report(backend: str, artifact: ModelArtifact, verdict: str, reason: str = "") -> CandidateReport:
    return CandidateReport(backend, artifact.label, artifact.format, artifact.sha256, verdict, reason)


def screen(
    artifacts: Sequence[ModelArtifact],
    policy: SelectionPolicy,
    backends: Sequence[Backend] | None = None,
    hardware: Mapping[str, str] | None = None,
) -> tuple[list[tuple[Backend, ModelArtifact]], list[CandidateReport]]:
    """Filter every (backend, artifact) with reasons; return the ranked survivors and the rejected.

    `hardware` maps backend names to what this box has for them ("NVIDIA H100 80GB HBM3 found"):
    a runtime missing for hardware that is present is said first, with what to install.
    """
    notes = hardware or {}
    backends = list(backends if backends is not None else all_backends())
    kept: list[tuple[Backend, ModelArtifact]] = []
    rejected: list[CandidateReport] = []
    for backend in backends:
        name = backend.name
        ruled_out = _ruled_out(backend, policy, notes)
        for artifact in artifacts:
            if ruled_out:
                reason = ruled_out
            elif artifact.format not in backend.formats:
                reason = f"cannot read {artifact.format} files"
            else:
                support = backend.supports(artifact)
                if support.ok:
                    kept.append((backend, artifact))
                    continue
                reason = support.reason
            rejected.append(_report(name, artifact, "rejected", reason))
    known = {b.name for b in backends}
    for name, found in notes.items():  # hardware that no backend of edge-agent can drive
        if name not in known:
            reason = f"{found}, but edge-agent has no {name} backend"
            rejected.extend(_report(name, a, "rejected", reason) for a in artifacts)
    kept.sort(
        key=lambda pair: (not pair[0].is_native(pair[1].format), preference_index(pair[0].name, policy))
    )
    # What this box has hardware for comes first in the explanation, then by preference.
    rejected.sort(key=lambda r: (r.backend not in notes, preference_index(r.backend, policy)))
    return kept, rejected


def _ruled_out(backend: Backend, policy: SelectionPolicy, notes: Mapping[str, str]) -> str:
    """Why the policy or this box rules `backend` out whatever the model; "" when nothing does."""
    name = backend.name
    denied = next((p for p in policy.deny if fnmatch.fnmatchcase(name, p)), None)
    if denied:
        return f"denied by policy ({denied})"
    if policy.fixed and name != policy.fixed:
        return f"policy fixes the backend to {policy.fixed}"
    probe = backend.probe()
    if not probe.available:
        return (f"{notes[name]}, but " if name in notes else "") + probe.reason
    return ""


Trial = Callable[[TrialRequest, float], TrialResult]
# (candidate outputs, reference outputs) -> (largest difference, "" or what differs in the reports),
# or None when the reference makes no report (then the tensors are compared)
ReportJudge = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], tuple[float | None, str] | None]
# Loads a backend's session (a pool may hand out one it already has): Backend.load by default.
Loader = Callable[[Backend, ModelArtifact, Mapping[str, Any]], Session]
Progress = Callable[[str], None]  # hears what selection is doing now, e.g. "trial 2: openvino/CPU on ..."


def trial_request(
    backend: str, artifact: ModelArtifact, sample: Sample, policy: SelectionPolicy
) -> TrialRequest:
    """How a candidate is tried on a sample under `policy` (validation asks for the same trials)."""
    return TrialRequest(
        backend,
        artifact,
        sample.feeds,
        policy.options_for(backend),
        warmup=policy.warmup,
        runs=policy.runs,
        min_time_s=policy.min_time_s,
        budget_s=policy.budget_s,
        variant=spare_core_variant(backend, policy),
    )


def decide(
    artifacts: Sequence[ModelArtifact],
    policy: SelectionPolicy,
    samples: Samples,
    backends: Sequence[Backend] | None = None,
    trial: Trial = run_trial_isolated,
    hardware: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    judge: ReportJudge | None = None,
) -> Decision:
    """Choose a backend. With samples and benchmarking on, the top candidates are proven.

    `judge` compares a candidate's outputs with the reference's as the pipeline would report them
    (agent/processing/judge.py); without one, or against test data that declares its tolerances
    (the publisher's own contract), outputs are compared as tensors.

    Each candidate is proven on the first sample that fits its artifact; a candidate no sample
    fits is not tried. `progress` hears of each trial before it starts (a trial includes building
    the candidate's compiled engine, which can take minutes). Raises NoBackendError (every
    candidate's reason) when nothing can run the model.
    """
    say = progress or (lambda _text: None)
    backends = list(backends if backends is not None else all_backends())
    inputs = as_samples(samples)
    ranked, rejected = screen(artifacts, policy, backends, hardware)
    if not ranked:
        raise NoBackendError(rejected)
    reports = [_report(b.name, a, "untried") for b, a in ranked]
    for i, report in enumerate(reports):
        report.rank = i + 1
    # The explanation names what this box has hardware for (and what it lacks) before the fallbacks.
    found = [r for r in rejected if r.backend in (hardware or {})]
    others = [r for r in rejected if r.backend not in (hardware or {})]
    sample_of = [next((s for s, x in enumerate(inputs) if x.fits_artifact(a)), None) for _, a in ranked]
    triable = [i for i in range(len(ranked)) if sample_of[i] is not None]
    if not policy.benchmark or not triable:
        pick = 0
        if not policy.benchmark:
            note = "benchmark off"
        else:
            # Nothing to prove a faster guess on: serve on the full-precision CPU reference until a
            # sample proves another candidate (never a reduced-precision guess that may be wrong).
            missing = "no sample input fits any artifact" if inputs else "no sample input"
            pick = next(
                (
                    i
                    for name in FULL_PRECISION_REFERENCES
                    for i, (b, _a) in enumerate(ranked)
                    if b.name == name
                ),
                0,
            )
            verdict = (
                "serving on the full-precision reference"
                if ranked[pick][0].name in FULL_PRECISION_REFERENCES
                else "by rank"
            )
            note = f"outputs not checked: {missing}; {verdict} until a sample proves a candidate"
        reports[pick].verdict = "chosen"
        return Decision(
            ranked[pick][0].name,
            ranked[pick][1].sha256,
            ranked[pick][1].label,
            None,
            found + reports + others,
            note=note,
        )
    for i in range(len(ranked)):
        if sample_of[i] is None:
            reports[i].reason = "not tried: no test input fits this artifact"

    results: dict[int, TrialResult] = {}

    def run(i: int) -> None:
        backend, artifact = ranked[i]
        say(f"trial {len(results) + 1}: {backend.name} on {artifact.label} (load, compile, time, check)")
        results[i] = trial(
            trial_request(backend.name, artifact, inputs[sample_of[i] or 0], policy), policy.timeout_s
        )

    # Per sample: what the reference is, its outputs, and "" or why they are no reference (NaN).
    references: dict[int, tuple[str | None, Mapping[str, np.ndarray] | None, str]] = {}

    def reference_for(s: int) -> tuple[str | None, Mapping[str, np.ndarray] | None, str]:
        if s not in references:
            tried = {ranked[i][0].name: results[i] for i in results if sample_of[i] == s}
            name, outputs = _reference(inputs[s], tried, policy, trial, artifacts, backends, say)
            problem = reference_problem(name, outputs, inputs[s]) if name and outputs is not None else ""
            references[s] = (name, outputs, problem)
        return references[s]

    wrong_backends: set[str] = set()  # computed wrong outputs on this model

    def accept(i: int) -> bool:
        report, result = reports[i], results[i]
        if not result.ok:
            report.verdict, report.reason = "rejected", result.error
            return False
        report.precision = result.precision
        report.median_ms, report.p90_ms = result.median_ms, result.percentile(90)
        _take_spare_core(report, result, policy)
        report.peak_rss_mb = round(result.peak_rss_mb, 1)
        _name, reference, unusable = reference_for(sample_of[i] or 0)
        if reference is None:
            report.verdict = "passed"
            return True
        if unusable:  # not finite: a candidate matching it would be checked against nothing
            report.verdict, report.reason = "rejected", unusable
            return False
        sample = inputs[sample_of[i] or 0]
        rules = judged_by(sample, policy)
        # Judged on the reports unless the sample declares tensor tolerances (or makes no report).
        verdict = judge(result.outputs, reference) if judge is not None and rules is policy else None
        by_report = verdict is not None
        diff, problem = (
            verdict
            if verdict is not None
            else compare_outputs(result.outputs, reference, rules, computed=not sample.expected)
        )
        report.max_abs_diff = diff
        if problem:
            report.verdict, report.reason = "rejected", problem
            report.unlock = what_would_pass(report.backend, result, reference, rules, tolerance=not by_report)
            wrong_backends.add(report.backend)
            return False
        report.verdict = "passed"
        return True

    first = triable[: policy.max_trials]
    for i in first:
        run(i)
    passed = [i for i in first if accept(i)]
    # None of the top candidates is right: keep going down the ranking until one is.
    for i in triable[len(first) :]:
        if passed:
            break
        unusable = references.get(sample_of[i] or 0, (None, None, ""))[2]
        if unusable:  # its sample has no reference to prove it against: not worth a trial
            reports[i].verdict, reports[i].reason = "rejected", unusable
            continue
        run(i)
        if accept(i):
            passed.append(i)
    if not passed:
        raise NoBackendError([r for r in reports if r.verdict == "rejected"] + rejected)
    # A backend shown wrong on this model is no fallback, not even on another artifact.
    for report in reports:
        if report.verdict == "untried" and report.backend in wrong_backends:
            report.verdict = "rejected"
            report.reason = "not tried: this backend computed wrong outputs on another artifact of this model"
    best = _fastest(passed, ranked, reports)
    reports[best].verdict = "chosen"
    backend, artifact = ranked[best]
    sample = sample_of[best] or 0
    reference_name, reference, _unusable = reference_for(sample)
    return Decision(
        backend.name,
        artifact.sha256,
        artifact.label,
        reports[best].precision,
        found + reports + others,
        reference=reference_name,
        checked=reference is not None,
        inputs=inputs[sample].origin,
    )


# Candidates this close to the fastest count as equally fast: one short trial each cannot tell them
# apart on a busy box, so the better-ranked one is taken (fewer flip-flops between restarts).
TIE_MARGIN = 0.05


def _take_spare_core(report: CandidateReport, result: TrialResult, policy: SelectionPolicy) -> None:
    """Run the candidate with one core fewer when its trial timed that at most SPARE_CORE_SLOWDOWN
    slower than on the runtime's default threads (for a small model, often faster); its median and
    p90 are then those with one core fewer."""
    variant = spare_core_variant(report.backend, policy)
    if not variant or not result.variant_ms or result.median_ms is None:
        if result.variant_error:
            log.debug("%s: one core fewer was not timed: %s", report.backend, result.variant_error)
        return
    # Compared on the faster tenth of each's runs (timed in turn): a neighbour stealing a core for a
    # moment slows two threads more than one, and must not cost a large model half its speed for good.
    fast, fast_fewer = result.percentile(10), result.percentile(10, result.variant_ms)
    if fast is None or fast_fewer is None or fast >= SPARE_CORE_MAX_MS:
        return
    if fast_fewer > SPARE_CORE_SLOWDOWN * fast:
        return
    fewer = statistics.median(result.variant_ms)
    report.threads = next(iter(variant.values()))
    report.default_threads_ms = result.median_ms
    report.median_ms, report.p90_ms = fewer, result.percentile(90, result.variant_ms)


def _fastest(
    passed: list[int], ranked: list[tuple[Backend, ModelArtifact]], reports: list[CandidateReport]
) -> int:
    """The fastest correct candidate: native formats first (a .tflite model goes to LiteRT when it
    works), near-ties to the better rank."""

    def foreign(i: int) -> bool:
        return not ranked[i][0].is_native(ranked[i][1].format)

    tier = min(foreign(i) for i in passed)
    pool = [i for i in passed if foreign(i) == tier]
    fastest = min(reports[i].median_ms or float("inf") for i in pool)
    return min(i for i in pool if (reports[i].median_ms or float("inf")) <= fastest * (1 + TIE_MARGIN))


def _reference(
    sample: Sample,
    tried: Mapping[str, TrialResult],
    policy: SelectionPolicy,
    trial: Trial,
    artifacts: Sequence[ModelArtifact],
    backends: Sequence[Backend],
    say: Progress,
) -> tuple[str | None, Mapping[str, np.ndarray] | None]:
    """(what the reference is, its outputs) for one sample, or (None, None) when none can be had.

    The outputs shipped with the test data come first, else `computed_reference`.
    """
    if sample.expected:
        return f"the expected outputs in {sample.origin}", sample.expected
    return computed_reference(sample, policy, trial, artifacts, backends, tried, say)


def computed_reference(
    sample: Sample,
    policy: SelectionPolicy,
    trial: Trial,
    artifacts: Sequence[ModelArtifact],
    backends: Sequence[Backend],
    tried: Mapping[str, TrialResult] | None = None,
    say: Progress | None = None,
) -> tuple[str | None, Mapping[str, np.ndarray] | None]:
    """(backend, its outputs) of the plainest CPU backend that runs an artifact this sample fits, or
    (None, None) when none does. When it was among the trials (`tried`, by backend name), its run
    is the reference (no second run). The policy's deny and fixed do not apply: they say where
    the model may run, not what is right, and a candidate checked only against itself would not
    be checked at all. Outputs with NaN or infinities are still returned: `reference_problem` says
    whether they can be a reference (the next CPU backend is not asked instead: the plainest one's
    NaN says the model is broken, not the backend)."""
    fitting = [a for a in artifacts if sample.fits_artifact(a)]
    for name in REFERENCE_BACKENDS:
        result = (tried or {}).get(name)
        if result is None:
            usable, _ = screen(fitting, SelectionPolicy(), [b for b in backends if b.name == name])
            if not usable:
                continue
            if say is not None:
                say(f"reference outputs: {name} on {usable[0][1].label}")
            request = TrialRequest(
                name, usable[0][1], sample.feeds, {}, warmup=1, runs=1, budget_s=policy.budget_s
            )
            result = trial(request, policy.timeout_s)
        if result.ok:
            return name, result.outputs
    return None, None


def reference_problem(reference: str, outputs: Mapping[str, np.ndarray], sample: Sample) -> str:
    """Why `outputs`, the reference `_reference` found for `sample` (its expected outputs when it has
    any, else a CPU backend's), cannot be a reference; "" when they can.

    A reference that is not finite is not a reference: a candidate whose NaN "matched" it would be
    checked against nothing (a model made all NaN passed every backend so, "max diff 0"). A
    backend's outputs must be finite (`non_finite_reference`). Expected outputs may hold NaN, the
    publisher's contract (onnx's backend tests of Pow and Sqrt expect NaN for negative bases), but
    not in every value of an output: an output all NaN proves nothing.
    """
    if sample.expected:  # then they are the reference (`_reference`)
        for name, value in sample.expected.items():
            array = np.asarray(value)
            if array.dtype.kind in "fc" and array.size and not np.isfinite(array).any():
                return f"the reference, {reference}, has no finite value in output {name!r}"
        return ""
    return non_finite_reference(reference, outputs, sample)


def non_finite_reference(backend: str, outputs: Mapping[str, np.ndarray], sample: Sample) -> str:
    """Why a CPU backend's `outputs` on `sample` are no reference ("the reference BACKEND gives NaN
    or infinite values in output 'x' on ORIGIN ..."): NaN or infinities where the sample's expected
    outputs, if it has any, are finite. "" when there are none."""
    pairs: list[tuple[str, np.ndarray, np.ndarray | None]]
    if sample.expected:
        # Only the outputs the publisher vouches for; their count not pairing is compare_outputs' business.
        pairs = [(n, o, r) for n, o, r in output_pairs(outputs, sample.expected) or []]
    else:
        pairs = [(name, value, None) for name, value in outputs.items()]
    for name, value, expected in pairs:
        out = np.asarray(value)
        if out.dtype.kind not in "fc":
            continue
        bad = ~np.isfinite(out)
        ref = None if expected is None else np.asarray(expected)
        if ref is not None and ref.shape == out.shape and ref.dtype.kind in "fc":
            bad &= np.isfinite(ref)  # NaN the publisher expects there is its contract
        if bad.any():
            where = " where the expected outputs have finite values" if sample.expected else ""
            return (
                f"the reference {backend} gives NaN or infinite values in output {name!r} on "
                f"{sample.origin}{where} ({int(bad.sum())} of {out.size} values): a reference that is "
                "not finite checks nothing"
            )
    return ""


def published_non_finite_met(out: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Where expected outputs hold NaN or an infinity (a publisher's contract: onnx's Pow and Sqrt
    tests expect NaN for negative bases) and the output has the same value there."""
    return ~np.isfinite(expected) & ((np.isnan(out) & np.isnan(expected)) | (out == expected))


FULL_PRECISION = frozenset({"f32", "fp32", "FP32", "float32", ""})


def what_would_pass(
    backend: str,
    result: TrialResult,
    reference: Mapping[str, np.ndarray],
    rules: SelectionPolicy,
    tolerance: bool = True,
) -> str:
    """For a candidate rejected for its outputs: the settings that would let it through, so a user
    can choose speed over exactness knowingly (or "" when no setting would: wrong shapes, NaNs)."""
    ways = []
    if result.precision not in FULL_PRECISION:
        option = '{"precision": "f32"}' if backend.startswith("openvino/") else '{"fp16": false}'
        ways.append(f"full precision: it ran at {result.precision}; backends.options {backend}: {option}")
    needed = _tolerance_needed(result.outputs, reference, rules) if tolerance else None
    if needed is not None:
        ways.append(f"a tolerance of atol {needed:.3g} (backends.atol, or the test data's atol)")
    return " or ".join(ways)


def _tolerance_needed(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], rules: SelectionPolicy
) -> float | None:
    """The smallest atol (with the rules' rtol and max_mismatch) at which these outputs would pass."""
    pairs = output_pairs(outputs, reference)
    if pairs is None:
        return None
    worst = 0.0
    for _name, out, ref in pairs:
        if np.shape(out) != np.shape(ref) or np.asarray(ref).dtype.kind not in "fc":
            return None
        out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        out_finite, ref_finite = np.isfinite(out64), np.isfinite(ref64)
        same = published_non_finite_met(out64, ref64)
        if not (out_finite & ref_finite | same).all():
            return None  # NaN or infinities no tolerance lets through
        excess = np.zeros(out64.shape)  # published NaN matched at its place: within any tolerance
        both = out_finite & ref_finite
        excess[both] = np.abs(out64[both] - ref64[both]) - rules.rtol * np.abs(ref64[both])
        if excess.size:
            # The atol that leaves at most max_mismatch of the values outside.
            worst = max(worst, float(np.quantile(excess, 1.0 - rules.max_mismatch)))
    return worst * 1.0001 if worst > 0 else None


def judged_by(sample: Sample, policy: SelectionPolicy) -> SelectionPolicy:
    """The policy outputs on `sample` are judged by: the tolerances its expected outputs declare
    (every value within them), else the selection policy's."""
    if not sample.expected or (sample.rtol is None and sample.atol is None):
        return policy
    return replace(
        policy,
        rtol=sample.rtol if sample.rtol is not None else policy.rtol,
        atol=sample.atol if sample.atol is not None else policy.atol,
        max_mismatch=0.0,
    )


def output_pairs(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> list[tuple[str, np.ndarray, np.ndarray]] | None:
    """(name, output, reference) for each reference output: by name (the reference may name only
    some), else by position; None when neither pairs them."""
    if set(reference) <= set(outputs):  # expected outputs may name only some of them
        return [(name, outputs[name], reference[name]) for name in reference]
    if len(outputs) == len(reference):
        return [
            (name, out, ref) for (name, ref), out in zip(reference.items(), outputs.values(), strict=True)
        ]
    return None


def compare_outputs(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    policy: SelectionPolicy,
    computed: bool = False,
) -> tuple[float | None, str]:
    """(max abs difference, "" or what is wrong). Outputs are matched by name (the reference may
    name only some), else by position.

    An element matches when |out - ref| <= atol + rtol * |ref|. Up to `max_mismatch` of the
    elements of an output may miss (reduced precision moves a few pixels of a large map a lot
    while the map as a whole agrees); a small output (a few scores) must match everywhere.

    NaN never matches by itself. `computed`: the reference is a backend's outputs, and any NaN or
    infinity in it is a problem (it checks nothing). Else it is expected outputs a publisher ships:
    NaN or an infinity there is its contract (onnx's backend tests of Pow and Sqrt expect NaN for
    negative bases), matched only by the same value at the same place, and an output with no finite
    value at all is no reference either. An output NaN or infinite where the reference is finite
    is always wrong, however few such values.
    """
    pairs = output_pairs(outputs, reference)
    if pairs is None:
        return None, f"{len(outputs)} outputs, the reference has {len(reference)}"
    worst = 0.0
    for name, out, ref in pairs:
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return None, f"output {name!r} has shape {list(out.shape)}, the reference {list(ref.shape)}"
        if ref.dtype.kind not in "fc":
            if not np.array_equal(out, ref):
                return None, f"output {name!r} differs from the reference"
            continue
        out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
        out_finite, ref_finite = np.isfinite(out64), np.isfinite(ref64)
        if not ref_finite.all() and (computed or not ref_finite.any()):
            what = "NaN or infinite values" if computed else "no finite value"
            return None, f"the reference has {what} in output {name!r}"
        if (ref_finite & ~out_finite).any():
            where = "none" if ref_finite.all() else "finite values"
            return None, f"output {name!r} has NaN or infinite values where the reference has {where}"
        if not out.size:
            continue
        both = ref_finite & out_finite  # only the expected outputs' own NaN/infinities are left out
        diff = np.abs(out64[both] - ref64[both])
        largest = float(diff.max()) if diff.size else 0.0
        worst = max(worst, largest)
        # Published NaN matches NaN at the same place (infinities match themselves in isclose).
        close = np.isclose(out64, ref64, rtol=policy.rtol, atol=policy.atol, equal_nan=not computed)
        missed = float(np.mean(~close))
        if missed > policy.max_mismatch:
            return worst, (
                f"output {name!r} differs from the reference: {missed:.1%} of values off by more than "
                f"atol {policy.atol:g} + rtol {policy.rtol:g}, up to {largest:.3g}"
            )
    return worst, ""


def spare_core_note(report: CandidateReport) -> str:
    """ "1 thread, one core left to the pipeline (1.53 ms on the default threads)" where its trial chose
    one core fewer, else ""."""
    if report.threads is None or report.default_threads_ms is None:
        return ""
    threads = f"{report.threads} thread" + ("s" if report.threads > 1 else "")
    default = f"{report.default_threads_ms:.2f} ms on the default threads"
    return f"{threads}, one core left to the pipeline ({default})"


def _spare_core(report: CandidateReport) -> str:
    note = spare_core_note(report)
    return f", {note}" if note else ""


def _numbers(report: CandidateReport) -> str:
    parts = []
    if report.median_ms is not None:
        parts.append(f"{report.median_ms:.2f} ms")
    if report.precision:
        parts.append(report.precision + _spare_core(report))
    if report.max_abs_diff is not None:
        parts.append(f"max diff {report.max_abs_diff:.2g}")
    return f" ({', '.join(parts)})" if parts else ""


def reference_first(
    artifacts: Sequence[ModelArtifact], policy: SelectionPolicy, backends: Sequence[Backend]
) -> Decision | None:
    """The decision `decide` makes without a sample (serve on the full-precision CPU reference until a
    sample proves a candidate), made without screening the other candidates: their operator checks
    load every runtime (in a child process, seconds on a first start), and the proof on a frame
    screens them anyway. None where the policy rules the reference out; where the reference cannot
    run the model after all, loading it fails and `decide` says why."""
    by_name = {b.name: b for b in backends}
    # A derived twin (an upgraded opset) exists because the reference refuses its original as it is.
    refused = {a.derived_from for a in artifacts if a.derived_from}
    for name in FULL_PRECISION_REFERENCES:
        backend = by_name.get(name)
        if backend is None or _ruled_out(backend, policy, {}):
            continue
        readable = sorted(
            (
                a
                for a in artifacts
                if a.format in backend.formats
                and not (name == REFERENCE_BACKENDS[0] and not a.derived_from and a.name in refused)
            ),
            key=lambda a: not backend.is_native(a.format),
        )  # as screen() ranks them: the format the runtime reads natively first
        if readable:
            artifact = readable[0]
            chosen = _report(name, artifact, "chosen")
            chosen.rank = 1
            note = (
                "outputs not checked: no sample input; serving on the full-precision reference until a "
                "sample proves a candidate (the others are screened then)"
            )
            return Decision(name, artifact.sha256, artifact.label, None, [chosen], note=note)
    return None


def load_decided(
    decision: Decision,
    artifacts: Sequence[ModelArtifact],
    policy: SelectionPolicy,
    backends: Sequence[Backend] | None = None,
    progress: Progress | None = None,
    load: Loader | None = None,
) -> tuple[Session, CandidateReport, list[str]]:
    """Load the chosen backend here; when it fails, the next usable one. Returns the failures too.

    Loading builds the backend's compiled engine (TensorRT engine, OpenVINO blob) unless its cache
    has it: `progress` hears of each load before it starts. `load` replaces Backend.load (a pool).
    """
    by_name = {b.name: b for b in (backends if backends is not None else all_backends())}
    by_sha = {a.sha256: a for a in artifacts}
    failures: list[str] = []
    for report in decision.order():
        backend, artifact = by_name.get(report.backend), by_sha.get(report.sha256)
        if backend is None or artifact is None:
            continue
        options = serving_options(policy, report)
        if progress:
            cache = options.get("cache_dir") or options.get("engine_cache_dir")
            progress(
                f"loading {artifact.label} on {backend.name}"
                + (f" (compiled engine cached in {cache})" if cache else "")
            )
        try:
            session = load(backend, artifact, options) if load else backend.load(artifact, options)
            return session, report, failures
        except BackendError as exc:
            failures.append(f"{report.backend}: {exc}")
    raise BackendError(f"no decided backend could load the model: {'; '.join(failures) or 'none left'}")


def reference_session(
    artifacts: Sequence[ModelArtifact], backends: Sequence[Backend] | None = None
) -> Session:
    """A plain CPU session in this process, on the first artifact one of REFERENCE_BACKENDS reads:
    to learn a model's inputs (for preprocessing, or to check test data against them)."""
    by_name = {b.name: b for b in (backends if backends is not None else all_backends())}
    problems = []
    for name in REFERENCE_BACKENDS:
        backend = by_name.get(name)
        if backend is None:
            continue
        for artifact in artifacts:
            if artifact.format in backend.formats:
                try:
                    return backend.load(artifact)
                except BackendError as exc:
                    problems.append(str(exc))
    raise BackendError(f"no CPU backend can read this model: {'; '.join(problems) or 'no readable artifact'}")


def feeds_problem(specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray]) -> str:
    """What keeps `feeds` from being a model's inputs (names, ranks, fixed sizes, dtypes); "" if
    nothing."""
    wanted = {spec.name for spec in specs}
    if set(feeds) != wanted:
        missing, extra = sorted(wanted - set(feeds)), sorted(set(feeds) - wanted)
        parts = [f"missing input {', '.join(map(repr, missing))}" if missing else ""]
        parts.append(f"no model input named {', '.join(map(repr, extra))}" if extra else "")
        return f"{'; '.join(p for p in parts if p)} (the model's inputs: {', '.join(sorted(wanted))})"
    for spec in specs:
        value = np.asarray(feeds[spec.name])
        if value.ndim != len(spec.shape) or any(
            isinstance(dim, int) and dim > 0 and dim != size
            for dim, size in zip(spec.shape, value.shape, strict=True)
        ):
            shown = [d if isinstance(d, int) and d > 0 else "?" for d in spec.shape]
            return f"input {spec.name!r} has shape {list(value.shape)}, the model wants {shown}"
        wanted_dtype = np.dtype(spec.dtype)
        if wanted_dtype.kind == "U" and value.dtype.kind in "UO":
            continue  # strings: any length (object arrays of str too)
        if value.dtype != wanted_dtype:
            return f"input {spec.name!r} is {value.dtype}, the model wants {spec.dtype}"
    return ""
