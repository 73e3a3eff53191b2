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
   A reduced-precision variant (VariantArtifact: an int8 model made from a float one) is one more
   candidate, tried beside the float model on the same backends: proven on the reports against the
   float model's reference (never its own), chosen only when faster, refused with what differs.
5. The Decision lists every candidate with its verdict and numbers (`explain()`).

This package is data in, data out: no files, no hardware access; tests feed it backends. Its
modules, each building on those before: `reports` (CandidateReport, Decision, NoBackendError),
`policy` (SelectionPolicy, preferences, Sample), `compare` (outputs against the reference, the
tolerances), `candidates` (screening and ranking), `decide` (trials and the choice), `load`
(sessions from a decision).
"""

from __future__ import annotations

from providers.select.candidates import preference_index, reference_first, screen
from providers.select.compare import (
    FULL_PRECISION,
    compare_outputs,
    judged_by,
    non_finite_reference,
    output_pairs,
    published_non_finite_met,
    reference_problem,
    what_would_pass,
)
from providers.select.decide import TIE_MARGIN, ReportJudge, Trial, computed_reference, decide, trial_request
from providers.select.load import Loader, feeds_problem, load_decided, reference_session
from providers.select.policy import (
    CPU_THREAD_OPTIONS,
    DEFAULT_PREFERENCE,
    FULL_PRECISION_REFERENCES,
    REFERENCE_BACKENDS,
    SPARE_CORE_MAX_MS,
    SPARE_CORE_SLOWDOWN,
    Progress,
    Sample,
    Samples,
    SelectionPolicy,
    VariantArtifact,
    as_samples,
    serving_options,
    spare_core_variant,
    usable_cores,
    variant_precision,
)
from providers.select.reports import (
    CandidateReport,
    Decision,
    NoBackendError,
    reports_within,
    spare_core_note,
)

__all__ = [
    "CPU_THREAD_OPTIONS",
    "DEFAULT_PREFERENCE",
    "FULL_PRECISION",
    "FULL_PRECISION_REFERENCES",
    "REFERENCE_BACKENDS",
    "SPARE_CORE_MAX_MS",
    "SPARE_CORE_SLOWDOWN",
    "TIE_MARGIN",
    "CandidateReport",
    "Decision",
    "Loader",
    "NoBackendError",
    "Progress",
    "ReportJudge",
    "Sample",
    "Samples",
    "SelectionPolicy",
    "Trial",
    "VariantArtifact",
    "as_samples",
    "compare_outputs",
    "computed_reference",
    "decide",
    "feeds_problem",
    "judged_by",
    "load_decided",
    "non_finite_reference",
    "output_pairs",
    "preference_index",
    "published_non_finite_met",
    "reference_first",
    "reference_problem",
    "reference_session",
    "reports_within",
    "screen",
    "serving_options",
    "spare_core_note",
    "spare_core_variant",
    "trial_request",
    "usable_cores",
    "variant_precision",
    "what_would_pass",
]
