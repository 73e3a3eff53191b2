"""Derived artifacts: a model rewritten so that a backend that refuses it as it is can run it, and
the reduced-precision variants a version ships (marked so that selection proves them against the
float model they were made from: with_variants_marked).

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
from agent.onnx_wire import onnx_default_opset, onnx_metadata_props
from providers import Backend, ModelArtifact

log = logging.getLogger(__name__)

TARGET_OPSET = 13  # widely supported by onnxruntime, OpenVINO and TensorRT alike
# A reduced-precision variant's own metadata_props (agent/quantize.py writes them): what it is and
# what it was made from, so the file says so wherever it is copied.
META_PRECISION = "edge_agent.precision"
META_MADE_FROM = "edge_agent.made_from"  # the float model's file name in its version
META_KEPT_FLOAT = "edge_agent.kept_float"  # what stayed in float, in words


def onnx_opset(path: Path) -> int | None:
    """The default-domain opset of an ONNX file, or None when it cannot be read."""
    try:
        return onnx_default_opset(path)
    except (OSError, ValueError):
        return None


def with_variants_marked(artifacts: Sequence[ModelArtifact]) -> list[ModelArtifact]:
    """`artifacts` with each reduced-precision variant of another of them (an int8 model `registry
    publish --quantize` made: its own metadata says so, agent/quantize.py) as a VariantArtifact:
    selection proves it against the float model, never the other way round. A variant whose float
    model is not among them is left a plain model file."""
    from providers.select import VariantArtifact

    names = {a.name for a in artifacts}
    marked = []
    for artifact in artifacts:
        found = variant_of(artifact.path) if artifact.format == "onnx" else None
        if found is not None and found[1] in names and found[1] != artifact.name:
            precision, made_from = found
            artifact = VariantArtifact(
                artifact.path, "onnx", artifact.sha256, artifact.name, made_from, precision=precision
            )
        marked.append(artifact)
    return marked


def variant_of(path: Path) -> tuple[str, str] | None:
    """(precision, the float model's file name) of a variant `registry publish --quantize` made;
    None for any other file (or one that cannot be read: then it is no variant)."""
    try:
        props = onnx_metadata_props(path)
    except (OSError, ValueError):
        return None
    if META_PRECISION not in props or META_MADE_FROM not in props:
        return None
    return props[META_PRECISION], props[META_MADE_FROM]


def with_upgraded_twins(
    artifacts: Sequence[ModelArtifact], backends: Sequence[Backend], derived_dir: Path
) -> list[ModelArtifact]:
    """`artifacts` (their reduced-precision variants marked: with_variants_marked) plus an
    opset-upgraded twin of each the CPU reference (onnxruntime CPU, when this box has it) refuses as
    it is: the candidates every selection chooses among."""
    from providers.select import REFERENCE_BACKENDS

    artifacts = with_variants_marked(artifacts)

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
