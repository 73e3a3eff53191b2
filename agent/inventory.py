"""What this box has and can run: hardware, backends (available or not, and why), model support.

The functions behind `edge-agent providers`, `models check` and `bench`; plain data out, so the
CLI only formats it and tests call the same code.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import EdgeAgentError, StoreError
from agent.registry.file_registry import SUFFIX_FORMATS, version_sort_key
from agent.store import ModelStore
from agent.testdata import TestData, load_testdata
from agent.transform import with_upgraded_twins
from providers import (
    Backend,
    ModelArtifact,
    TensorSpec,
    TrialRequest,
    TrialResult,
    all_backends,
    run_trial_isolated,
)
from providers.select import feeds_problem, reference_session


@dataclass(frozen=True)
class ResolvedModel:
    ref: str  # name@version, or the file path given
    artifacts: list[ModelArtifact]  # the model files
    testdata: list[TestData]  # test data files, each with its model file and tolerances


def resolve_model(spec: str, store: ModelStore) -> ResolvedModel:
    """A model file path, or NAME[@VERSION] installed in the store (the newest version by default)."""
    path = Path(spec)
    if path.is_file():
        fmt = SUFFIX_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise EdgeAgentError(
                f"{path}: unknown model format {path.suffix!r}; expected one of {', '.join(SUFFIX_FORMATS)}"
            )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        artifact = ModelArtifact(path.resolve(), fmt, digest, name=path.name)
        # A file that is not what its name says: one clear error (ModelError), not a table of every
        # backend failing to read it with the runtimes' own parse errors on stderr.
        from agent.model_formats import format_details  # (imports onnx: only for a file)

        format_details(artifact, path.with_suffix(".bin") if fmt == "openvino-ir" else None)
        return ResolvedModel(str(path), [artifact], [])
    name, _, version = spec.partition("@")
    if not version:
        versions = sorted((m.version for m in store.list() if m.name == name), key=version_sort_key)
        if not versions:
            raise StoreError(
                f"{spec!r} is neither a model file nor a model installed in {store.root}",
                hint="give a path, or pull it first: edge-agent models pull -c CONFIG",
            )
        version = versions[-1]
    installed = store.get(name, version)
    return ResolvedModel(installed.ref, installed.model_artifacts(), installed.testdata_artifacts())


def check_model(
    artifacts: Sequence[ModelArtifact],
    backends: Sequence[Backend] | None = None,
    derived_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Per backend and artifact: can it run it, and if not, why (naming unsupported operators).

    An ONNX file with an old opset that a backend refuses as it is gets an opset-upgraded twin (made
    in `derived_dir`, a temporary folder by default), checked too: the row of the original then
    says whether the upgrade fixes it, as selection would use the twin."""
    backends = list(backends if backends is not None else all_backends())
    with contextlib.ExitStack() as stack:
        if derived_dir is None:
            derived_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edge-agent-check-")))
        candidates = with_upgraded_twins(artifacts, backends, derived_dir)
        rows = [_support_row(backend, artifact) for backend in backends for artifact in candidates]
    for row in rows:
        refuses_the_model = row.pop("_read")  # the backend is here and reads the format, but not this file
        if row["supported"] or row["derived_from"] or not refuses_the_model:
            continue
        twin = next(
            (r for r in rows if r["backend"] == row["backend"] and r["derived_from"] == row["artifact"]), None
        )
        if twin is not None:
            upgrade = twin["artifact"].rsplit("(", 1)[-1].rstrip(")")  # "upgraded from opset 6 to 13"
            fixed = "which fixes it" if twin["supported"] else "which does not fix it"
            row["reason"] += f" (an old opset: selection uses a copy {upgrade}, {fixed})"
            row["upgrade_fixes"] = bool(twin["supported"])
    return rows


def _support_row(backend: Backend, artifact: ModelArtifact) -> dict[str, Any]:
    probe = backend.probe()
    ops: tuple[str, ...] = ()
    read = False
    if not probe.available:
        ok, reason = False, f"backend not available: {probe.reason}"
    elif artifact.format not in backend.formats:
        ok, reason = False, f"cannot read {artifact.format} files"
    else:
        support = backend.supports(artifact)
        ok, reason, ops, read = support.ok, support.reason, support.unsupported_ops, True
    return {
        "backend": backend.name,
        "artifact": artifact.label,
        "format": artifact.format,
        "supported": ok,
        "reason": reason,
        "unsupported_ops": list(ops),
        "derived_from": artifact.derived_from,
        "upgrade_fixes": None,
        "_read": read,
    }


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
) -> list[dict[str, Any]]:
    """Time every (available backend x readable artifact) in its own process."""
    rows = []
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
    return rows


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
