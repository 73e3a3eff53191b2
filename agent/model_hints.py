"""How to feed a model and read it, as its publisher wrote into the manifest's metadata:

    "metadata": {
      "preprocess": {"color": "bgr", "mean": [0.5], "std": [0.5], "resize": {"width": 192, "height": 48}},
      "state": [{"input": "state", "output": "stateN"}],
      "labels": ["upright", "upside-down"]
    }

A pipeline then needs only its source and postprocess type. What the pipeline's YAML says wins,
key by key (preprocess), or as a whole (state, labels); the manifest fills what the YAML leaves
out. Hints that do not make a valid pipeline are an error naming the manifest key.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.errors import ModelError
from agent.registry.manifest import Manifest, key_path

HINT_KEYS = ("preprocess", "state", "labels")


def with_model_hints(config: PipelineConfig, manifest: Manifest) -> PipelineConfig:
    """`config` completed from the manifest's hints (the same object when there are none)."""
    hints = {key: manifest.metadata[key] for key in HINT_KEYS if key in manifest.metadata}
    if not hints:
        return config
    raw = config.model_dump(exclude_unset=True)
    if "preprocess" in hints:
        if not isinstance(hints["preprocess"], dict):
            raise ModelError(f"{manifest.ref}: metadata.preprocess must be an object of preprocess settings")
        raw["preprocess"] = {**hints["preprocess"], **raw.get("preprocess", {})}
    if "state" in hints and "state" not in raw:
        raw["state"] = hints["state"]
    if "labels" in hints and "labels" in type(config.postprocess).model_fields:
        raw["postprocess"].setdefault("labels", hints["labels"])
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ModelError(
            f"pipeline {config.name}: the hints in {manifest.ref}'s manifest do not fit it: {problems}"
        ) from None


def _describe(error: Any) -> str:
    location = tuple(part for part in error.get("loc", ()) if part not in ("image", "audio"))  # union tags
    return f"{key_path(location)}: {str(error.get('msg', 'invalid value')).removeprefix('Value error, ')}"
