"""Raw model outputs -> plain, JSON-ready dicts. Output layouts are documented per family."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from agent.config import ClassificationPostprocess, PostprocessConfig, RawPostprocess
from agent.errors import ModelError
from providers import TensorSpec


class Postprocessor(ABC):
    @abstractmethod
    def __call__(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]: ...


class Classification(Postprocessor):
    """Scores [1, C] (or [1, C, 1, 1], or [C]) -> top-k classes with labels.

    Result: {"top": [{"index": int, "label": str | None, "score": float}, ...]}, best first.
    """

    def __init__(self, config: ClassificationPostprocess, outputs: list[TensorSpec]) -> None:
        self.config = config
        self.output = _pick_output(config.output, outputs)
        classes = _static_class_count(self.output)
        if config.labels is not None and classes is not None and len(config.labels) != classes:
            raise ModelError(
                f"postprocess.labels has {len(config.labels)} names but output {self.output.name!r} "
                f"has {classes} classes"
            )

    def __call__(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        scores = np.asarray(outputs[self.output.name], dtype=np.float64)
        if scores.ndim > 1 and scores.shape[0] != 1:
            raise ModelError(f"output {self.output.name!r} has batch size {scores.shape[0]}, expected 1")
        scores = scores.reshape(-1)
        if not np.isfinite(scores).all():
            raise ModelError(f"output {self.output.name!r} contains NaN or infinite values")
        if self.config.softmax:
            shifted = np.exp(scores - scores.max())  # subtract the max so exp cannot overflow
            scores = shifted / shifted.sum()
        k = min(self.config.top_k, scores.size)
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        labels = self.config.labels
        return {
            "top": [
                {
                    "index": int(i),
                    "label": labels[i] if labels is not None and i < len(labels) else None,
                    "score": round(float(scores[i]), 6),
                }
                for i in best
            ]
        }


class Raw(Postprocessor):
    """Every output as {"shape", "dtype", "values" (flattened, at most max_values), "truncated"}."""

    def __init__(self, config: RawPostprocess) -> None:
        self.max_values = config.max_values

    def __call__(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        result = {}
        for name, value in outputs.items():
            array = np.asarray(value)
            flat = array.reshape(-1)
            values: list[Any] = flat[: self.max_values].tolist()
            if array.dtype.kind == "f":
                # JSON has no NaN/Infinity: such values become null.
                values = [v if math.isfinite(v) else None for v in values]
            result[name] = {
                "shape": list(array.shape),
                "dtype": str(array.dtype),
                "values": values,
                "truncated": bool(flat.size > self.max_values),
            }
        return {"outputs": result}


def build_postprocessor(config: PostprocessConfig, outputs: list[TensorSpec]) -> Postprocessor:
    if isinstance(config, ClassificationPostprocess):
        return Classification(config, outputs)
    return Raw(config)


def _pick_output(name: str | None, outputs: list[TensorSpec]) -> TensorSpec:
    if name is None:
        return outputs[0]
    for spec in outputs:
        if spec.name == name:
            return spec
    raise ModelError(
        f"postprocess.output {name!r} is not a model output; outputs: {[o.name for o in outputs]}"
    )


def _static_class_count(spec: TensorSpec) -> int | None:
    """Number of classes when the output shape fixes it ([N, C] or [N, C, 1, 1])."""
    dims = [d for d in spec.shape[1:]] if len(spec.shape) > 1 else list(spec.shape)
    if not dims or not all(isinstance(d, int) for d in dims):
        return None
    count = 1
    for d in dims:
        count *= int(d)  # type: ignore[arg-type]
    return count
