"""A model as the operator's tools name it, and what this box can run it on.

`resolve_model`: a model file, or NAME[@VERSION] installed in the store, as its artifacts and test
data; `check_model`: per backend and artifact whether it runs it, and if not why (`models check`).
Plain data out, so the CLI only formats it and tests call the same code.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError, StoreError
from agent.registry.file_registry import SUFFIX_FORMATS, version_sort_key
from agent.store import ModelStore
from agent.testdata import TestData
from agent.transform import with_upgraded_twins
from providers import (
    Backend,
    ModelArtifact,
    all_backends,
)


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
