"""`edge-agent bench`: what a model is timed on (its test data, a file given, random inputs of
the shapes given or the model's own), and the timing of every backend x artifact in its own process."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import EdgeAgentError
from agent.testdata import load_testdata
from agent.tools.inventory import ResolvedModel
from providers import (
    Backend,
    ModelArtifact,
    TensorSpec,
    TrialRequest,
    TrialResult,
    run_trial_isolated,
)
from providers.cpu_load import CpuUse
from providers.rounds import time_in_rounds
from providers.select import feeds_problem, reference_session

OPEN_DIM_SIZE = 224  # an image side most vision models accept


def synthetic_feeds(
    inputs: Sequence[TensorSpec], seed: int = 0, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, np.ndarray]:
    """Inputs for timing only (not for output checks), of `shapes` where given; else an open batch
    (first) dimension becomes 1, other open dimensions OPEN_DIM_SIZE (many convolutional models fail
    on a 1x1 image, and timing one would say nothing)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        shape = (shapes or {}).get(spec.name) or tuple(
            d if isinstance(d, int) and d > 0 else (1 if i == 0 else OPEN_DIM_SIZE)
            for i, d in enumerate(spec.shape)
        )
        if np.dtype(spec.dtype).kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def parse_shapes(texts: Sequence[str], inputs: Sequence[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """--shape values ("1x3x48x192", or "NAME=1x3x48x192" when the model has several inputs)."""
    names = [spec.name for spec in inputs]
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, sep, dims = text.rpartition("=")
        if not sep:
            if len(names) != 1:
                raise EdgeAgentError(
                    f"--shape {text!r}: the model has {len(names)} inputs ({', '.join(names)}); "
                    "say which: --shape NAME=DIMS"
                )
            name = names[0]
        elif name not in names:
            raise EdgeAgentError(
                f"--shape {text!r}: the model has no input {name!r} (it has: {', '.join(names)})"
            )
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise EdgeAgentError(
                f"--shape {text!r}: dimensions must be positive integers joined by x, e.g. 1x3x224x224"
            )
        shapes[name] = shape
    return shapes


def bench_feeds(
    resolved: ResolvedModel, shapes: Sequence[str], inputs: Path | None
) -> tuple[dict[str, np.ndarray], str]:
    """What `edge-agent bench` times on, and a description of it: the test data file given, else
    the model's own test data, else random tensors (of `shapes` where given)."""
    session = reference_session(resolved.artifacts)
    try:
        specs = session.inputs
    finally:
        session.close()
    if inputs is not None:
        sample = load_testdata(inputs)
        problem = feeds_problem(specs, sample.feeds)
        if problem:
            raise EdgeAgentError(f"--inputs {inputs}: does not fit {resolved.ref}: {problem}")
        return dict(sample.feeds), str(inputs)
    if not shapes:
        for artifact in (t.artifact for t in resolved.testdata):
            try:
                sample = load_testdata(artifact.path, artifact.label)
            except EdgeAgentError:
                continue
            if not feeds_problem(specs, sample.feeds):
                return dict(sample.feeds), sample.origin
    feeds = synthetic_feeds(specs, shapes=parse_shapes(shapes, specs))
    problem = feeds_problem(specs, feeds)
    if problem:
        raise EdgeAgentError(f"--shape: {problem}")
    described = ", ".join(f"{name} {'x'.join(map(str, value.shape))}" for name, value in feeds.items())
    return feeds, f"random inputs ({described})"


def bench(
    artifacts: Sequence[ModelArtifact],
    feeds: dict[str, np.ndarray],
    backends: Sequence[Backend],
    runs: int,
    warmup: int,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = None,
    rounds: int = 5,
    turn_s: float = 0.2,
) -> tuple[list[dict[str, Any]], CpuUse | None]:
    """Time every (available backend x readable artifact) in its own process, one after another
    (load time, memory, the runtime's own timer); then, where two or more ran, all of them again side
    by side in `rounds` interleaved rounds (providers/rounds.py): `side_by_side_ms` and `spread_ms`,
    the figures to compare on a busy box. Returns the rows and the box's CPU use during the rounds
    (None: no rounds)."""
    rows, requests = [], []
    for backend in backends:
        if not backend.probe().available:
            continue
        for artifact in artifacts:
            if artifact.format not in backend.formats:
                continue
            if progress:
                progress(f"{backend.name} on {artifact.label}")
            request = TrialRequest(backend.name, artifact, feeds, {}, warmup=warmup, runs=runs, budget_s=3600)
            rows.append(_bench_row(run_trial_isolated(request, timeout_s), artifact))
            requests.append(request)
    timed = [(row, request) for row, request in zip(rows, requests, strict=True) if row["ok"]]
    if len(timed) < 2 or rounds < 1:
        return rows, None
    if progress:
        progress(f"{len(timed)} side by side, {rounds} rounds")
    together = time_in_rounds([request for _, request in timed], rounds, turn_s, timeout_s)
    for (row, _), result in zip(timed, together.results, strict=True):
        if result.ok and result.median_ms is not None:
            row["side_by_side_ms"] = round(result.median_ms, 3)
            row["spread_ms"] = round(result.spread_ms or 0.0, 3)
        else:
            row["side_by_side_error"] = result.error
    return rows, together.cpu


def _bench_row(result: TrialResult, artifact: ModelArtifact) -> dict[str, Any]:
    row: dict[str, Any] = {
        "backend": result.backend,
        "artifact": artifact.label,
        "ok": result.ok,
        "error": result.error,
    }
    if result.ok and result.latencies_ms:
        mean = sum(result.latencies_ms) / len(result.latencies_ms)
        row.update(
            precision=result.precision,
            runs=len(result.latencies_ms),
            p50_ms=round(result.percentile(50) or 0, 3),
            p90_ms=round(result.percentile(90) or 0, 3),
            p99_ms=round(result.percentile(99) or 0, 3),
            throughput_per_s=round(1000 / mean, 1) if mean > 0 else None,
            peak_rss_mb=round(result.peak_rss_mb, 1),
            load_s=round(result.load_s, 3),
        )
        if result.compute_ms:  # the runtime's own timer: comparable with the vendor's benchmark tools
            row["compute_p50_ms"] = round(result.percentile(50, result.compute_ms) or 0, 3)
    return row
