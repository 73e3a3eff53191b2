"""Sessions: the decided backend loaded (the next usable one when it fails), a plain CPU reference
session, and whether feeds fit a model's inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from providers.base import Backend, BackendError, ModelArtifact, Session, TensorSpec
from providers.registry import all_backends
from providers.select.policy import REFERENCE_BACKENDS, Progress, SelectionPolicy, serving_options
from providers.select.reports import CandidateReport, Decision

# Loads a backend's session (a pool may hand out one it already has): Backend.load by default.
Loader = Callable[[Backend, ModelArtifact, Mapping[str, Any]], Session]


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
