"""Candidates: every backend x artifact screened with a reason, the survivors ranked by format and
preference; and the reference-first decision made without screening."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from providers.base import Backend, ModelArtifact
from providers.registry import all_backends
from providers.select.policy import (
    DEFAULT_PREFERENCE,
    FULL_PRECISION_REFERENCES,
    REFERENCE_BACKENDS,
    SelectionPolicy,
    variant_precision,
)
from providers.select.reports import CandidateReport, Decision


def preference_index(name: str, policy: SelectionPolicy) -> tuple[int, int]:
    """Sort key: the policy's prefer list first, then the default preference."""
    for i, pattern in enumerate(policy.prefer):
        if fnmatch.fnmatchcase(name, pattern):
            return (0, i)
    for i, pattern in enumerate(DEFAULT_PREFERENCE):
        if fnmatch.fnmatchcase(name, pattern):
            return (1, i)
    return (2, 0)


def candidate_report(
    backend: str, artifact: ModelArtifact, verdict: str, reason: str = ""
) -> CandidateReport:
    report = CandidateReport(backend, artifact.label, artifact.format, artifact.sha256, verdict, reason)
    if variant_precision(artifact):
        report.variant_of = artifact.derived_from
        report.precision = variant_precision(artifact)
        # What an untried variant is; a trial replaces it with its verdict's reason.
        report.reason = reason or f"{report.precision} variant of {artifact.derived_from}"
    return report


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
            rejected.append(candidate_report(name, artifact, "rejected", reason))
    known = {b.name for b in backends}
    for name, found in notes.items():  # hardware that no backend of edge-agent can drive
        if name not in known:
            reason = f"{found}, but edge-agent has no {name} backend"
            rejected.extend(candidate_report(name, a, "rejected", reason) for a in artifacts)
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


def reference_first(
    artifacts: Sequence[ModelArtifact], policy: SelectionPolicy, backends: Sequence[Backend]
) -> Decision | None:
    """The decision `decide` makes without a sample (serve on the full-precision CPU reference until a
    sample proves a candidate), made without screening the other candidates: their operator checks
    load every runtime (in a child process, seconds on a first start), and the proof on a frame
    screens them anyway. None where the policy rules the reference out; where the reference cannot
    run the model after all, loading it fails and `decide` says why."""
    by_name = {b.name: b for b in backends}
    # A derived twin (an upgraded opset) exists because the reference refuses its original as it is;
    # a reduced-precision variant is never the reference (it is proven against the float model).
    refused = {a.derived_from for a in artifacts if a.derived_from and not variant_precision(a)}
    for name in FULL_PRECISION_REFERENCES:
        backend = by_name.get(name)
        if backend is None or _ruled_out(backend, policy, {}):
            continue
        readable = sorted(
            (
                a
                for a in artifacts
                if a.format in backend.formats
                and not variant_precision(a)
                and not (name == REFERENCE_BACKENDS[0] and not a.derived_from and a.name in refused)
            ),
            key=lambda a: not backend.is_native(a.format),
        )  # as screen() ranks them: the format the runtime reads natively first
        if readable:
            artifact = readable[0]
            chosen = candidate_report(name, artifact, "chosen")
            chosen.rank = 1
            note = (
                "outputs not checked: no sample input; serving on the full-precision reference until a "
                "sample proves a candidate (the others are screened then)"
            )
            return Decision(name, artifact.sha256, artifact.label, None, [chosen], note=note)
    return None
