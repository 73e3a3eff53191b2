"""How to feed a model and read it, as its publisher wrote into the manifest's metadata:

    "metadata": {
      "preprocess": {"color": "bgr", "mean": [0.5], "std": [0.5], "resize": {"width": 192, "height": 48}},
      "state": [{"input": "state", "output": "stateN"}],
      "labels": ["upright", "upside-down"]
    }

A pipeline then needs only its source and postprocess type. What the pipeline's YAML says wins,
key by key (preprocess), or as a whole (state, labels); the manifest fills what the YAML leaves
out. Hints that do not make a valid pipeline are an error naming the manifest key.

The model file's own metadata fills what both leave out (`embedded_hints`):
- ONNX `metadata_props` as Ultralytics exports write them: `names` ("{0: 'person', ...}") become
  the labels, `imgsz` ("[640, 640]") the input size (letterboxed with 114 for detect, segment, pose
  and obb tasks, as Ultralytics does; centre-cropped for classify), which a model exported with an
  open input size needs; pixels are RGB scaled to 0..1 (Ultralytics' own preprocessing).
- ONNX `metadata_props` as PaddleOCR exports write them: `character` (a text recognizer's
  dictionary, one per line) becomes a ctc postprocess's `characters`, with the ' ' PaddleOCR appends
  (its `use_space_char`): the classes are the blank, the lines, ' '.
- TFLite files with metadata carry their associated files in a zip appended to the flatbuffer:
  a labels file (`labels.txt`, `*label*.txt`, one label per line) becomes the labels.
"""

from __future__ import annotations

import ast
import logging
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.errors import ModelError
from agent.model_labels import check_against, own_labels
from agent.onnx_wire import onnx_metadata_props
from agent.registry.manifest import Manifest, key_path
from providers import ModelArtifact

log = logging.getLogger(__name__)

HINT_KEYS = ("preprocess", "state", "labels", "characters")
_LETTERBOX_TASKS = ("detect", "segment", "pose", "obb")


def with_model_hints(
    config: PipelineConfig, manifest: Manifest | None, embedded: Mapping[str, Any] | None = None
) -> PipelineConfig:
    """`config` completed from the manifest's hints, then from the model file's own (`embedded`,
    from `embedded_hints`); the same object when there are none. `manifest` None: a bare model
    file (`edge-agent infer`), only its own metadata."""
    metadata = manifest.metadata if manifest is not None else {}
    hints = {key: metadata[key] for key in HINT_KEYS if key in metadata}
    for key, value in (embedded or {}).items():
        if key == "preprocess" and isinstance(hints.get("preprocess"), dict) and isinstance(value, dict):
            hints["preprocess"] = {**value, **hints["preprocess"]}
        else:
            hints.setdefault(key, value)
    if not hints:
        return config
    # The pipeline's labels against the model's own first: said as the config's errors are (its
    # file:line), where the generic "do not fit" below would blame hints nobody wrote.
    labels = own_labels(manifest, embedded or {})
    if labels is not None:
        check_against(config, *labels)
    source = _source(manifest, set(metadata) & set(HINT_KEYS), set(embedded or {}))
    raw = config.model_dump(exclude_unset=True)
    if "preprocess" in hints:
        if not isinstance(hints["preprocess"], dict):
            owner = manifest.ref if manifest is not None else "the model file"
            raise ModelError(f"{owner}: metadata.preprocess must be an object of preprocess settings")
        raw["preprocess"] = {**hints["preprocess"], **raw.get("preprocess", {})}
    if "state" in hints and "state" not in raw:
        raw["state"] = hints["state"]
    for key in ("labels", "characters"):  # where the postprocess takes them (characters: ctc)
        if key in hints and key in type(config.postprocess).model_fields:
            raw["postprocess"].setdefault(key, hints[key])
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ModelError(f"pipeline {config.name}: the hints in {source} do not fit it: {problems}") from None


def _source(manifest: Manifest | None, from_manifest: set[str], from_file: set[str]) -> str:
    """Where the hints came from: the version's manifest, the model file's own metadata, or both."""
    own = "the model file's own metadata"
    if manifest is None or not from_manifest:
        return own
    return f"{manifest.ref}'s manifest" + (f" and {own}" if from_file - from_manifest else "")


def _describe(error: Any) -> str:
    location = tuple(part for part in error.get("loc", ()) if part not in ("image", "audio"))  # union tags
    return f"{key_path(location)}: {str(error.get('msg', 'invalid value')).removeprefix('Value error, ')}"


def embedded_hints(artifacts: Sequence[ModelArtifact]) -> dict[str, Any]:
    """Hints from the model files' own metadata (see the module docstring); {} when they carry none.
    Metadata that cannot be read is logged and skipped: it only fills gaps."""
    for artifact in artifacts:
        try:
            if artifact.format == "onnx":
                hints = _onnx_hints(artifact)
            elif artifact.format == "tflite":
                hints = _tflite_hints(artifact)
            else:
                continue
        except Exception as exc:  # metadata written by anyone: never a reason not to serve
            log.warning("ignoring the metadata of %s: %s", artifact.label, exc)
            continue
        if hints:
            log.info("%s carries %s in its own metadata", artifact.label, ", ".join(sorted(hints)))
            return hints
    return {}


def _onnx_hints(artifact: ModelArtifact) -> dict[str, Any]:
    props = onnx_metadata_props(artifact.path)
    return {**_ultralytics_hints(props), **_paddle_hints(props)}


def _paddle_hints(props: Mapping[str, str]) -> dict[str, Any]:
    lines = props.get("character", "").splitlines()
    return {"characters": [*lines, " "]} if lines else {}


def _ultralytics_hints(props: Mapping[str, str]) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    if "names" in props:
        names = ast.literal_eval(props["names"])  # a Python dict literal: {0: 'person', ...}
        if isinstance(names, dict) and names and all(isinstance(k, int) for k in names):
            hints["labels"] = [str(names.get(i, i)) for i in range(max(names) + 1)]
        elif isinstance(names, list):
            hints["labels"] = [str(n) for n in names]
    if "imgsz" in props:
        size = ast.literal_eval(props["imgsz"])
        if isinstance(size, int):
            size = [size, size]
        if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
            task = props.get("task", "detect")
            mode = "letterbox" if task in _LETTERBOX_TASKS else "crop"
            resize = {"height": size[0], "width": size[1], "mode": mode}
            hints["preprocess"] = {"resize": resize, "color": "rgb", "scale": 1 / 255}
    return hints


def _tflite_hints(artifact: ModelArtifact) -> dict[str, Any]:
    if not zipfile.is_zipfile(artifact.path):  # no associated files packed in
        return {}
    with zipfile.ZipFile(artifact.path) as packed:
        names = [n for n in packed.namelist() if n.lower().endswith(".txt") and "label" in n.lower()]
        if not names:
            return {}
        text = packed.read(names[0]).decode("utf-8", errors="replace")
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    return {"labels": labels} if labels else {}
