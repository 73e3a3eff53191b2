"""Derived artifacts: a model rewritten so that a backend that refuses it as it is can run it.

Today: old ONNX opsets upgraded with onnx's version converter (onnxruntime refuses many
opset < 7 models that run fine once upgraded). A derived artifact is only a further
candidate: selection checks its outputs against the reference like any other. Results are
kept in the store keyed by the source hash and the target opset, so each is made once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

from agent.fsutil import atomic_write_bytes, file_lock
from agent.onnx_wire import onnx_default_opset
from providers import Backend, ModelArtifact

log = logging.getLogger(__name__)

TARGET_OPSET = 13  # widely supported by onnxruntime, OpenVINO and TensorRT alike


def onnx_opset(path: Path) -> int | None:
    """The default-domain opset of an ONNX file, or None when it cannot be read."""
    try:
        return onnx_default_opset(path)
    except (OSError, ValueError):
        return None


def with_upgraded_twins(
    artifacts: Sequence[ModelArtifact], backends: Sequence[Backend], derived_dir: Path
) -> list[ModelArtifact]:
    """`artifacts` plus an opset-upgraded twin of each the CPU reference (onnxruntime CPU, when this
    box has it) refuses as it is: the candidates every selection chooses among."""
    from providers.select import REFERENCE_BACKENDS

    reference = next((b for b in backends if b.name == REFERENCE_BACKENDS[0] and b.probe().available), None)
    if reference is None:
        return list(artifacts)
    return [*artifacts, *upgraded_artifacts(artifacts, derived_dir, reference)]


def upgraded_artifacts(
    artifacts: Sequence[ModelArtifact], derived_dir: Path, reference: Backend
) -> list[ModelArtifact]:
    """Opset-upgraded copies of the ONNX artifacts that `reference` refuses as they are."""
    derived = []
    for artifact in artifacts:
        if artifact.format != "onnx":
            continue
        # The opset first: read from the file in microseconds, where asking the reference loads its
        # runtime (in a child process on a first start); a model at the target opset has no upgrade.
        opset = onnx_opset(artifact.path)
        if opset is None or opset >= TARGET_OPSET or reference.supports(artifact).ok:
            continue
        upgraded = _upgrade(artifact, opset, derived_dir)
        if upgraded is not None:
            derived.append(upgraded)
    return derived


def _upgrade(artifact: ModelArtifact, opset: int, derived_dir: Path) -> ModelArtifact | None:
    import onnx
    from onnx import version_converter

    target = derived_dir / f"{artifact.sha256}-opset{TARGET_OPSET}.onnx"
    label = f"{artifact.label} (upgraded from opset {opset} to {TARGET_OPSET})"
    with file_lock(
        derived_dir / ".locks" / f"{target.name}.lock", timeout_s=300, what=f"upgrading {artifact.label}"
    ):
        if not target.exists():
            try:
                model = version_converter.convert_version(onnx.load(str(artifact.path)), TARGET_OPSET)
                onnx.checker.check_model(model)
            except Exception as exc:  # the converter has gaps; the original stays the only candidate
                log.warning("cannot upgrade %s from opset %d: %s", artifact.label, opset, exc)
                return None
            derived_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, model.SerializeToString())
            log.info("upgraded %s from opset %d to %d", artifact.label, opset, TARGET_OPSET)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    return ModelArtifact(target, "onnx", digest, name=label, derived_from=artifact.name)
