"""What is inside a model file or an installed model version, as plain data: a text Netron.

The function behind `edge-agent models inspect`; it returns JSON-serialisable dicts so the CLI
only formats them (and `--json` prints them as they are). Inspecting is cheap: a model is read,
never run (agent/model_formats.py reads each format).

Per model file: its format, size and sha256, inputs and outputs (dtype and shape; a symbolic
dimension by its name, an unknown one as "?"), and operator counts (most frequent first). ONNX
adds the IR version, producer, opset imports, initializers, parameter count and metadata_props;
TFLite the quantisation of its tensors. For a store version also: the manifest's metadata, every
artifact, the test sets (their arrays, inputs and `expected:` outputs) and the key that signed it.
A reduced-precision variant's artifact adds its `precision` and `made_from` (only a variant has them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import EdgeAgentError
from agent.model_formats import format_details, format_shape
from agent.registry.manifest import Artifact, Manifest
from agent.store import InstalledModel, ModelStore
from agent.store.listing import variant_fields
from agent.testdata import load_testdata
from agent.tools.inventory import resolve_model
from agent.transform import variant_of
from providers import ModelArtifact


def inspect_model(spec: str, store: ModelStore) -> dict[str, Any]:
    """MODEL as `edge-agent models inspect` shows it: a model file path, or NAME[@VERSION] in `store`
    (the newest version by default). ModelError for a file that is no valid model of its format."""
    resolved = resolve_model(spec, store)
    if Path(spec).is_file():
        [artifact] = resolved.artifacts
        size = artifact.path.stat().st_size
        entry = {"file": artifact.label, "format": artifact.format, "size": size, "sha256": artifact.sha256}
        weights = artifact.path.with_suffix(".bin") if artifact.format == "openvino-ir" else None
        # A variant file says what it is in its own metadata, wherever it was copied.
        variant = variant_of(artifact.path) if artifact.format == "onnx" else None
        precision, made_from = variant or (None, None)
        unset = {"target": None, "model_file": None, "rtol": None, "atol": None}
        return {
            "model": resolved.ref,
            "version": None,
            "artifacts": [{**entry, **unset, **variant_fields(precision, made_from)}],
            "models": [{**entry, **format_details(artifact, weights)}],
            "test_sets": [],
            "labels": _labels(None, resolved.artifacts),
        }
    name, _, version = resolved.ref.partition("@")
    return inspect_installed(store.get(name, version))


def inspect_installed(installed: InstalledModel) -> dict[str, Any]:
    """An installed version: its manifest, every model file inspected, its test sets and signer."""
    manifest = installed.manifest
    files = {a.file: a for a in manifest.artifacts}
    models = []
    for artifact in manifest.models():
        entry = {"file": artifact.file, "format": artifact.format, "size": artifact.size}
        entry["sha256"] = artifact.sha256
        owner = _ir_graph_of(artifact, files)
        if owner is not None:  # an OpenVINO IR's .bin: its weights, inspected with the .xml
            models.append({**entry, "weights_of": owner})
            continue
        weights = None
        if artifact.format == "openvino-ir":
            bin_file = files.get(Path(artifact.file).with_suffix(".bin").name)
            weights = installed.artifact_path(bin_file) if bin_file is not None else None
        model = ModelArtifact(
            installed.artifact_path(artifact), artifact.format, artifact.sha256, artifact.file
        )
        models.append({**entry, **format_details(model, weights)})
    return {
        "model": installed.ref,
        "version": {
            "name": manifest.name,
            "version": manifest.version,
            "created": manifest.created,
            "metadata": manifest.metadata,
            "signed_by": installed.signed_by,
        },
        "artifacts": [_artifact_entry(a) for a in manifest.artifacts],
        "models": models,
        "test_sets": [_test_set(installed, a) for a in manifest.testdata()],
        "labels": _labels(manifest, installed.model_artifacts()),
    }


def _labels(manifest: Manifest | None, artifacts: list[ModelArtifact]) -> dict[str, Any] | None:
    """Every label the model names itself, as a pipeline without postprocess.labels gets them
    (agent/model_labels.py): {"names": [...], "source": where they are}; None when it names none."""
    from agent.model_hints import embedded_hints
    from agent.model_labels import own_labels

    found = own_labels(manifest, embedded_hints(artifacts))
    return None if found is None else {"names": found[0], "source": found[1]}


def _artifact_entry(artifact: Artifact) -> dict[str, Any]:
    return {
        "file": artifact.file,
        "format": artifact.format,
        "size": artifact.size,
        "sha256": artifact.sha256,
        "target": artifact.target,
        "model_file": artifact.model_file,
        "rtol": artifact.rtol,
        "atol": artifact.atol,
        **variant_fields(artifact.precision, artifact.made_from),
    }


def _ir_graph_of(artifact: Artifact, files: dict[str, Artifact]) -> str | None:
    """For the .bin weights of an OpenVINO IR in the same version: the .xml's file name."""
    if artifact.format != "openvino-ir" or not artifact.file.endswith(".bin"):
        return None
    graph = Path(artifact.file).with_suffix(".xml").name
    return graph if graph in files else None


def _test_set(installed: InstalledModel, artifact: Artifact) -> dict[str, Any]:
    """The arrays a test-data archive holds: model inputs, and the outputs they must give."""
    entry: dict[str, Any] = {
        "file": artifact.file,
        "model_file": artifact.model_file,
        "rtol": artifact.rtol,
        "atol": artifact.atol,
        "inputs": [],
        "expected": [],
        "error": None,
    }
    try:
        sample = load_testdata(installed.artifact_path(artifact), artifact.file)
    except EdgeAgentError as exc:
        entry["error"] = exc.message
        return entry
    entry["inputs"] = [_array(name, value) for name, value in sample.feeds.items()]
    entry["expected"] = [_array(name, value) for name, value in (sample.expected or {}).items()]
    return entry


def _array(name: str, value: np.ndarray) -> dict[str, Any]:
    return {"name": name, "dtype": value.dtype.name, "shape": list(value.shape)}


__all__ = ["format_details", "format_shape", "inspect_installed", "inspect_model"]
