"""The decision: the top candidates proven in trials against a reference on a real sample, the
fastest correct one chosen (with one core fewer where that costs nothing)."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from providers.base import Backend, ModelArtifact
from providers.cpu_load import CpuLoad
from providers.registry import all_backends
from providers.rounds import Rounds, Timer, time_in_rounds
from providers.select.candidates import candidate_report, screen
from providers.select.compare import compare_outputs, judged_by, reference_problem, what_would_pass
from providers.select.policy import (
    FULL_PRECISION_REFERENCES,
    REFERENCE_BACKENDS,
    SPARE_CORE_MAX_MS,
    SPARE_CORE_SLOWDOWN,
    Progress,
    Sample,
    Samples,
    SelectionPolicy,
    as_samples,
    serving_options,
    spare_core_variant,
    variant_precision,
)
from providers.select.reports import CandidateReport, Decision, NoBackendError
from providers.trial import TrialRequest, TrialResult, run_trial_isolated

log = logging.getLogger(__package__)  # the package's logger, as before it was split


Trial = Callable[[TrialRequest, float], TrialResult]
# (candidate outputs, reference outputs) -> (largest difference, "" or what differs in the reports),
# or None when the reference makes no report (then the tensors are compared)
ReportJudge = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], tuple[float | None, str] | None]


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
    timer: Timer = time_in_rounds,
    judged_on: str = "",
) -> Decision:
    """Choose a backend. With samples and benchmarking on, the top candidates are proven.

    `judge` compares a candidate's outputs with the reference's as the pipeline would report them
    (agent/processing/judge.py); without one, or against test data that declares its tolerances
    (the publisher's own contract), outputs are compared as tensors. `judged_on` says what the judge
    compares ("detections": its differences are box pixels; Decision.judged_on).

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
    reports = [candidate_report(b.name, a, "untried") for b, a in ranked]
    for i, report in enumerate(reports):
        report.rank = i + 1
    # The explanation names what this box has hardware for (and what it lacks) before the fallbacks.
    found = [r for r in rejected if r.backend in (hardware or {})]
    others = [r for r in rejected if r.backend not in (hardware or {})]
    sample_of = [next((s for s, x in enumerate(inputs) if x.fits_artifact(a)), None) for _, a in ranked]
    triable = [i for i in range(len(ranked)) if sample_of[i] is not None]
    if not policy.benchmark or not triable:
        # Unproven, a reduced-precision variant never serves: the best ranked model file as published.
        plain = [i for i, (_b, a) in enumerate(ranked) if not variant_precision(a)] or [0]
        pick = plain[0]
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
                    if b.name == name and i in plain
                ),
                plain[0],
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
    load = CpuLoad()  # the box's CPU use while the candidates are timed

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
            # A reduced-precision variant is proven against the float model, never against itself.
            tried = {
                ranked[i][0].name: results[i]
                for i in results
                if sample_of[i] == s and not variant_precision(ranked[i][1])
            }
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
        variant = variant_precision(ranked[i][1])
        report.precision = variant or result.precision
        report.median_ms, report.p90_ms = result.median_ms, result.percentile(90)
        _take_spare_core(report, result, policy)
        report.peak_rss_mb = round(result.peak_rss_mb, 1)
        _name, reference, unusable = reference_for(sample_of[i] or 0)
        if reference is None and variant:  # a variant serves only proven against the float model
            report.verdict = "rejected"
            report.reason = f"{variant} variant: no reference from the float model to prove it against"
            return False
        if reference is None:
            report.verdict = "passed"
            return True
        if unusable:  # not finite: a candidate matching it would be checked against nothing
            report.verdict, report.reason = "rejected", unusable
            return False
        sample = inputs[sample_of[i] or 0]
        rules = judged_by(sample, policy)
        # Judged on the reports unless the sample declares tensor tolerances (or makes no report); a
        # variant on the reports always (its tensors are not the float model's by construction).
        reported = judge is not None and (rules is policy or bool(variant))
        verdict = judge(result.outputs, reference) if judge is not None and reported else None
        by_report = verdict is not None
        diff, problem = (
            verdict
            if verdict is not None
            else compare_outputs(result.outputs, reference, rules, computed=not sample.expected)
        )
        report.max_abs_diff = diff
        if problem and variant:  # the variant is wrong, not the backend: the float model serves
            report.verdict, report.reason = "rejected", f"{variant} variant: {problem}"
            return False
        if problem:
            report.verdict, report.reason = "rejected", problem
            report.unlock = what_would_pass(report.backend, result, reference, rules, tolerance=not by_report)
            wrong_backends.add(report.backend)
            return False
        report.verdict = "passed"
        return True

    first = _first_trials(triable, ranked, policy.max_trials)
    for i in first:
        run(i)
    passed = [i for i in first if accept(i)]
    # None of the top candidates is right: keep going down the ranking until one is.
    for i in (i for i in triable if i not in first):
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
    pool = _competing(passed, ranked)
    rounds = _time_side_by_side(pool, ranked, reports, inputs, sample_of, policy, timer, say)
    cpu = rounds.cpu if rounds is not None and rounds.cpu is not None else load.use()
    best = _fastest(pool, reports)
    reports[best].verdict = "chosen"
    _variant_speedups(pool, ranked, reports, best)
    backend, artifact = ranked[best]
    sample = sample_of[best] or 0
    reference_name, reference, _unusable = reference_for(sample)
    decision = Decision(
        backend.name,
        artifact.sha256,
        artifact.label,
        reports[best].precision,
        found + reports + others,
        reference=reference_name,
        checked=reference is not None,
        inputs=inputs[sample].origin,
        rounds=rounds.rounds if rounds is not None else 0,
        cpu_busy_percent=round(cpu.busy_percent, 1),
        cpu_others_percent=None if cpu.others_percent is None else round(cpu.others_percent, 1),
        judged_on=judged_on if judge is not None else "",
    )
    for report in reports:  # a variant that serves says so where candidates are listed
        if report.verdict == "chosen" and report.variant_of:
            report.reason = decision.variant_note(report)
    return decision


def _first_trials(triable: list[int], ranked: list[tuple[Backend, ModelArtifact]], count: int) -> list[int]:
    """The top `count` candidates as published, plus the reduced-precision variants on their backends
    (one more candidate each, not one fewer float candidate tried)."""
    floats = [i for i in triable if not variant_precision(ranked[i][1])][:count]
    backends = {ranked[i][0].name for i in floats}
    return [
        i
        for i in triable
        if i in floats or (variant_precision(ranked[i][1]) and ranked[i][0].name in backends)
    ]


def _variant_speedups(
    pool: list[int], ranked: list[tuple[Backend, ModelArtifact]], reports: list[CandidateReport], best: int
) -> None:
    """Each correct variant's speed against the float model on its backend; one not chosen (`best`
    was) says why."""
    for i in pool:
        report = reports[i]
        if not report.variant_of or report.median_ms is None:
            continue
        floats = [
            reports[j]
            for j in pool
            if not reports[j].variant_of and ranked[j][0].name == ranked[i][0].name and reports[j].median_ms
        ]
        if floats:
            report.speedup = round(min(f.median_ms or 0.0 for f in floats) / report.median_ms, 2)
        if report.verdict != "passed":
            continue
        speed = f"{report.speedup:.2f}x" if report.speedup is not None else "not timed against it"
        chosen = reports[best]
        if chosen.backend == report.backend and chosen.artifact == report.variant_of:
            report.reason = (
                f"{report.precision} variant: the same reports, not faster than {report.variant_of} ({speed})"
            )
        else:
            report.reason = (
                f"{report.precision} variant: the same reports, {speed} of {report.variant_of} on this "
                f"backend, but {chosen.backend} on {chosen.artifact} is as fast or faster"
            )


# Candidates this close to the fastest count as equally fast however steady their timings: a few
# per cent is not worth a switch (fewer flip-flops between restarts).
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


def _competing(passed: list[int], ranked: list[tuple[Backend, ModelArtifact]]) -> list[int]:
    """The correct candidates that compete on speed: native formats first (a .tflite model goes to
    LiteRT when it works; OpenVINO reading it competes only where no native one is correct)."""

    def foreign(i: int) -> bool:
        return not ranked[i][0].is_native(ranked[i][1].format)

    tier = min(foreign(i) for i in passed)
    return [i for i in passed if foreign(i) == tier]


def _time_side_by_side(
    pool: list[int],
    ranked: list[tuple[Backend, ModelArtifact]],
    reports: list[CandidateReport],
    inputs: list[Sample],
    sample_of: list[int | None],
    policy: SelectionPolicy,
    timer: Timer,
    say: Progress,
) -> Rounds | None:
    """Time the competing candidates again, side by side in interleaved rounds (providers/rounds.py),
    as they would serve (the threads their trial chose): their medians and spreads replace the
    trials' figures, timed one after another. None where fewer than two compete (or rounds are off).
    A candidate that fails there keeps its trial's figures, and the reason is logged."""
    if len(pool) < 2 or policy.rounds < 1:
        return None
    requests = [
        replace(
            trial_request(ranked[i][0].name, ranked[i][1], inputs[sample_of[i] or 0], policy),
            options=serving_options(policy, reports[i]),
            variant=None,
        )
        for i in pool
    ]
    say(f"timing {len(pool)} correct candidates side by side in {policy.rounds} rounds")
    rounds = timer(requests, policy.rounds, policy.turn_s, policy.timeout_s)
    for i, result in zip(pool, rounds.results, strict=True):
        if not result.ok or result.median_ms is None:
            log.warning(
                "%s: not timed side by side (its trial's figures count): %s", result.backend, result.error
            )
            continue
        report = reports[i]
        report.median_ms, report.p90_ms, report.spread_ms = (
            result.median_ms,
            result.percentile(90),
            result.spread_ms,
        )
    return rounds


def _fastest(pool: list[int], reports: list[CandidateReport]) -> int:
    """The fastest of the competing candidates; one slower by no more than the two spreads together
    (or TIE_MARGIN) counts as equally fast, and of those the better ranked wins."""
    fastest = min(pool, key=lambda i: reports[i].median_ms or float("inf"))
    best = reports[fastest]

    def as_fast(i: int) -> bool:
        report = reports[i]
        if report.median_ms is None or best.median_ms is None:
            return i == fastest
        margin = max(TIE_MARGIN * best.median_ms, (report.spread_ms or 0.0) + (best.spread_ms or 0.0))
        return report.median_ms - best.median_ms <= margin

    # Of equally fast ones a model file as published wins over a reduced-precision variant: a variant
    # serves only when it is faster.
    return min((i for i in pool if as_fast(i)), key=lambda i: (bool(reports[i].variant_of), i))


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
    fitting = [a for a in artifacts if sample.fits_artifact(a) and not variant_precision(a)]
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
