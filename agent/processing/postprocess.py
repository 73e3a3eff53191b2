"""Raw model outputs -> plain, JSON-ready dicts. Output layouts are documented per family."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

import cv2
import numpy as np

from agent.config import (
    ClassificationPostprocess,
    DetectionPostprocess,
    PluginPostprocess,
    PostprocessConfig,
    RawPostprocess,
    RegionsPostprocess,
    ThresholdPostprocess,
)
from agent.config.processing import CtcPostprocess, EmbeddingPostprocess
from agent.errors import ModelError
from agent.processing.preprocess import Geometry
from providers import TensorSpec


class Postprocessor(ABC):
    @abstractmethod
    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        """`geometry`: how the frame was fitted into the model input (to map positions back)."""


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

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
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
                    "label": _label(labels, int(i)),
                    "score": round(float(scores[i]), 6),
                }
                for i in best
            ]
        }


class Detection(Postprocessor):
    """YOLO- or SSD-style boxes -> scored, labelled boxes in source-image pixels, after per-class NMS.

    yolov8: [1, 4+C, N] rows of (cx, cy, w, h, C class scores); yolov5: [1, N, 5+C] rows of
    (cx, cy, w, h, objectness, C class scores), score = objectness x class score; ssd: [1, 1, N, 7]
    rows of (image id, class, score, x1, y1, x2, y2) in 0..1 of the input (Caffe/OpenVINO
    DetectionOutput; image id -1 ends the list); tensors: boxes [1, N, 4], scores [1, N], classes
    [1, N] and a valid-row count as separate outputs (TensorFlow Object Detection API, TFLite SSD).
    Box units are model-input pixels; the preprocessing's Geometry (letterbox padding and scale)
    maps them back.

    Result: {"detections": [{"index", "label", "score", "box": [x1, y1, x2, y2]}, ...]}, best first.
    """

    def __init__(self, config: DetectionPostprocess, outputs: list[TensorSpec]) -> None:
        self.config = config
        self.output = _pick_output(config.output, outputs)
        shape = self.output.shape
        self.classes: int | None = None
        if config.format == "tensors":
            self.tensors = _detection_tensors(config, outputs)
            return
        if config.format == "ssd":
            if len(shape) != 4 or shape[-1] not in (7, None) or isinstance(shape[-1], str):
                raise ModelError(
                    f"output {self.output.name!r} has shape {list(shape)}; ssd detections are [1, 1, N, 7]"
                )
            return
        if len(shape) != 3:
            raise ModelError(
                f"output {self.output.name!r} has shape {list(shape)}; {config.format} detections are 3-D"
            )
        row = shape[1] if config.format == "yolov8" else shape[2]
        self.classes = row - (4 if config.format == "yolov8" else 5) if isinstance(row, int) else None
        if self.classes is not None and self.classes < 1:
            raise ModelError(
                f"output {self.output.name!r} has shape {list(shape)}: no room for class scores in "
                f"{config.format} format (check postprocess.format)"
            )
        if config.labels is not None and self.classes is not None and len(config.labels) != self.classes:
            raise ModelError(
                f"postprocess.labels has {len(config.labels)} names but output {self.output.name!r} "
                f"has {self.classes} classes"
            )

    def _yolo(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x1, y1, x2, y2) in model-input pixels, scores, class ids: every box above the threshold."""
        if raw.ndim != 3 or raw.shape[0] != 1:
            raise ModelError(f"output {self.output.name!r} has shape {list(raw.shape)}, expected [1, ., .]")
        yolov8 = self.config.format == "yolov8"
        rows = raw[0].T if yolov8 else raw[0]
        first = 4 if yolov8 else 5
        if rows.shape[1] <= first:
            raise ModelError(f"output {self.output.name!r} rows have {rows.shape[1]} values, no class scores")
        class_scores = rows[:, first:] if yolov8 else rows[:, first:] * rows[:, 4:5]
        class_ids = class_scores.argmax(axis=1)
        scores = class_scores[np.arange(len(rows)), class_ids]
        keep = scores >= self.config.score_threshold  # NaN compares false: dropped
        boxes = rows[keep, :4]
        corners = np.empty_like(boxes)  # (cx, cy, w, h) -> (x1, y1, x2, y2)
        corners[:, :2] = boxes[:, :2] - boxes[:, 2:] / 2
        corners[:, 2:] = boxes[:, :2] + boxes[:, 2:] / 2
        return corners, scores[keep], class_ids[keep]

    def _ssd(self, raw: np.ndarray, geometry: Geometry | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if raw.ndim != 4 or raw.shape[:2] != (1, 1) or raw.shape[3] != 7:
            raise ModelError(
                f"output {self.output.name!r} has shape {list(raw.shape)}, expected [1, 1, N, 7]"
            )
        rows = raw[0, 0]
        ended = np.flatnonzero(rows[:, 0] < 0)  # image id -1 ends the list
        rows = rows[: ended[0]] if ended.size else rows
        keep = rows[:, 2] >= self.config.score_threshold
        corners = rows[keep, 3:7].copy()
        _to_input_pixels(corners, geometry)
        return corners, rows[keep, 2], rows[keep, 1].astype(np.int64)

    def _separate(
        self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        names = self.tensors
        boxes = np.asarray(outputs[names["boxes"]], dtype=np.float32)
        scores = np.asarray(outputs[names["scores"]], dtype=np.float32).reshape(-1)
        if boxes.ndim < 2 or boxes.shape[-1] != 4 or boxes.size != 4 * scores.size:
            raise ModelError(
                f"outputs {names['boxes']!r} {list(boxes.shape)} and {names['scores']!r} [{scores.size}] "
                "are not N boxes of 4 and N scores"
            )
        boxes = boxes.reshape(-1, 4)
        class_ids = np.zeros(len(scores), np.int64)
        if "classes" in names:
            class_ids = np.asarray(outputs[names["classes"]]).reshape(-1).astype(np.int64)[: len(scores)]
        if "count" in names:
            valid = int(np.asarray(outputs[names["count"]]).reshape(-1)[0])
            boxes, scores, class_ids = boxes[:valid], scores[:valid], class_ids[:valid]
        keep = scores >= self.config.score_threshold
        corners = boxes[keep][:, [1, 0, 3, 2]] if self.config.box_order == "yxyx" else boxes[keep].copy()
        if self.config.normalized:
            _to_input_pixels(corners, geometry)
        return corners, scores[keep], class_ids[keep]

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        if self.config.format == "tensors":
            corners, scores, class_ids = self._separate(outputs, geometry)
        elif self.config.format == "ssd":
            corners, scores, class_ids = self._ssd(
                np.asarray(outputs[self.output.name], np.float32), geometry
            )
        else:
            corners, scores, class_ids = self._yolo(np.asarray(outputs[self.output.name], np.float32))
        if not np.isfinite(corners).all():
            raise ModelError(f"output {self.output.name!r} has NaN or infinite box coordinates")
        boxes = np.concatenate([corners[:, :2], corners[:, 2:] - corners[:, :2]], axis=1)  # (x, y, w, h)
        kept = cv2.dnn.NMSBoxesBatched(
            boxes.tolist(),
            scores.tolist(),
            class_ids.tolist(),
            self.config.score_threshold,
            self.config.iou_threshold,
        )
        chosen = np.asarray(kept, dtype=np.int64).reshape(-1)
        chosen = chosen[np.argsort(-scores[chosen], kind="stable")][: self.config.max_detections]
        mapped = geometry.to_source(corners[chosen]) if geometry is not None else corners[chosen]
        labels = self.config.labels
        return {
            "detections": [
                {
                    "index": int(class_ids[i]),
                    "label": _label(labels, int(class_ids[i])),
                    "score": round(float(scores[i]), 4),
                    "box": [round(float(v), 1) for v in box],
                }
                for i, box in zip(chosen, mapped, strict=True)
            ]
        }


class Regions(Postprocessor):
    """A probability map [1, 1, H, W] (or [1, H, W], [H, W]) -> connected regions above `threshold`.

    Each region: its bounding box (grown by `unclip_ratio`, as DB text detectors need), mapped from
    map pixels to model-input pixels (the map may be smaller) and through the preprocessing's
    Geometry to source pixels; its mean map value as the score; its area in map pixels.

    Result: {"regions": [{"score", "area", "box": [x1, y1, x2, y2]}, ...]} in reading order (top to
    bottom, then left to right), at most `max_regions` (the best-scored ones).
    """

    def __init__(self, config: RegionsPostprocess, outputs: list[TensorSpec]) -> None:
        self.config = config
        self.output = _pick_output(config.output, outputs)
        shape = self.output.shape
        if len(shape) < 2 or any(isinstance(d, int) and d > 1 for d in shape[:-2]):
            raise ModelError(
                f"output {self.output.name!r} has shape {list(self.output.shape)}; "
                "a probability map is [1, 1, H, W], [1, H, W] or [H, W]"
            )

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        raw = np.asarray(outputs[self.output.name], dtype=np.float32)
        if raw.ndim < 2 or int(np.prod(raw.shape[:-2])) != 1:
            raise ModelError(f"output {self.output.name!r} has shape {list(raw.shape)}, not one map")
        height, width = raw.shape[-2], raw.shape[-1]
        probability = raw.reshape(height, width)
        if not np.isfinite(probability).all():
            raise ModelError(f"output {self.output.name!r} contains NaN or infinite values")
        above = (probability > self.config.threshold).astype(np.uint8)
        # Labelling only the rectangle around the pixels above the threshold: text covers a small part
        # of most frames, and OpenCV's per-component statistics cost ~1 ms on a whole 256x640 map.
        left, top, crop_w, crop_h = cv2.boundingRect(above)
        window = (slice(top, top + crop_h), slice(left, left + crop_w))
        count, labels, stats = 0, np.zeros((0, 0), np.int32), np.zeros((0, 5), np.int32)
        if crop_w and crop_h:  # else nothing is above the threshold
            count, found_labels, found_stats, _ = cv2.connectedComponentsWithStats(
                above[window], connectivity=4
            )
            labels, stats = np.asarray(found_labels, np.int32), np.asarray(found_stats, np.int32)
        in_window = probability[window]
        found = []
        for i in range(1, count):  # 0 is the background
            x, y, w, h, area = (int(v) for v in stats[i])
            x, y = x + left, y + top
            if area < self.config.min_area:
                continue
            score = float(in_window[labels == i].mean())
            if score < self.config.min_score:
                continue
            grow = w * h * self.config.unclip_ratio / (2 * (w + h))
            corners = self._polygon(labels == i, (left, top)) if self.config.polygons else None
            found.append((score, area, [x - grow, y - grow, x + w + grow, y + h + grow], corners))
        found = sorted(found, key=lambda r: -r[0])[: self.config.max_regions]
        boxes = self._to_source(
            np.array([r[2] for r in found], dtype=np.float64).reshape(-1, 4), geometry, width, height
        )
        rounded = [[round(float(v), 1) for v in box] for box in boxes]
        order = sorted(range(len(found)), key=lambda i: (rounded[i][1], rounded[i][0]))  # reading order
        regions = [{"score": round(found[i][0], 4), "area": found[i][1], "box": rounded[i]} for i in order]
        if self.config.polygons:
            for region, i in zip(regions, order, strict=True):
                corners = found[i][3]
                assert corners is not None
                # Each corner as a box of no size: the same mapping (and clipping) as the boxes.
                mapped = self._to_source(np.tile(corners, (1, 2)), geometry, width, height)[:, :2]
                region["polygon"] = [[round(float(x), 1), round(float(y), 1)] for x, y in mapped]
        return {"regions": regions}

    def _polygon(self, member: np.ndarray, offset: tuple[int, int]) -> np.ndarray:
        """A region's rotated rectangle (4 corners, map pixels), grown as its box is (unclip_ratio)."""
        ys, xs = np.nonzero(member)
        (cx, cy), (w, h), angle = cv2.minAreaRect(np.column_stack([xs, ys]).astype(np.float32))
        w, h = w + 1, h + 1  # pixel centres -> pixel edges
        grow = w * h * self.config.unclip_ratio / (2 * (w + h))
        rect = ((cx + offset[0] + 0.5, cy + offset[1] + 0.5), (w + 2 * grow, h + 2 * grow), angle)
        return np.asarray(cv2.boxPoints(rect), dtype=np.float64)

    @staticmethod
    def _to_source(boxes: np.ndarray, geometry: Geometry | None, width: int, height: int) -> np.ndarray:
        """Boxes in map pixels -> model-input pixels -> source pixels."""
        if geometry is None:
            return boxes
        boxes = boxes.copy()
        boxes[:, 0::2] *= geometry.input_width / width
        boxes[:, 1::2] *= geometry.input_height / height
        return geometry.to_source(boxes)


class Threshold(Postprocessor):
    """A score per run -> active or not, with hysteresis: active from `on_score` up, inactive again
    below `off_score`, so a score that wavers around one threshold does not flicker.

    Result: {"active": bool, "score": float, "event": "start" | "end" | null} (the event on the run
    where the state changed). Stateful: one pipeline's runs in order.
    """

    def __init__(self, config: ThresholdPostprocess, outputs: list[TensorSpec]) -> None:
        self.output = _pick_output(config.output, outputs)
        self.on_score = config.on_score
        self.off_score = config.off_score if config.off_score is not None else config.on_score - 0.15
        self.active = False

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        values = np.asarray(outputs[self.output.name], dtype=np.float64).reshape(-1)
        if values.size == 0 or not np.isfinite(values[0]):
            raise ModelError(f"output {self.output.name!r} has no finite score (shape {list(values.shape)})")
        score = float(values[0])
        event = None
        if not self.active and score >= self.on_score:
            self.active, event = True, "start"
        elif self.active and score < self.off_score:
            self.active, event = False, "end"
        return {"active": self.active, "score": round(score, 4), "event": event}


class Ctc(Postprocessor):
    """A CTC recognizer's per-step class probabilities [N, T, C] (or [T, C]) -> text, greedy: the best
    class of each step, repeats merged, then blanks dropped ("hh-e-ll-ll-oo" reads "hello"). Classes
    are the characters in order with the blank at index `blank`: C = len(characters) + 1 (PP-OCR
    rec: the blank, its 6623 dictionary lines, ' ').

    Result: {"text": str, "score": float}: the text without spaces at either end (a recognizer
    reads the margin around a crop as spaces), the score the mean of its characters' steps' best
    probability (0 for no text). `__call__` reads a batch of one; `rows` one result per batch row.
    """

    def __init__(self, config: CtcPostprocess, outputs: list[TensorSpec]) -> None:
        self.config = config
        self.output = _pick_output(config.output, outputs)
        shape = self.output.shape
        if len(shape) not in (2, 3):
            raise ModelError(
                f"output {self.output.name!r} has shape {list(shape)}; a CTC output is [N, T, C] or [T, C]"
            )
        if config.characters is None:
            raise ModelError(
                "postprocess.characters is not set and the model names none of its own (ONNX metadata "
                "`character`): write the character list, the blank left out"
            )
        if isinstance(shape[-1], int):
            _check_classes(len(config.characters), config.blank, shape[-1], self.output.name)
        chars = config.characters
        # Class index -> its character; the blank reads "" (it is dropped anyway).
        self.table = np.array([*chars[: config.blank], "", *chars[config.blank :]], dtype=object)

    def rows(self, outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """One {"text", "score"} per batch row."""
        probs = np.asarray(outputs[self.output.name], dtype=np.float32)
        probs = probs[None] if probs.ndim == 2 else probs
        if probs.ndim != 3:
            raise ModelError(f"output {self.output.name!r} has shape {list(probs.shape)}, not [N, T, C]")
        _check_classes(len(self.table) - 1, self.config.blank, probs.shape[2], self.output.name)
        if not np.isfinite(probs).all():
            raise ModelError(f"output {self.output.name!r} contains NaN or infinite values")
        if self.config.softmax:
            probs = np.exp(probs - probs.max(axis=2, keepdims=True))  # the max subtracted: no overflow
            probs /= probs.sum(axis=2, keepdims=True)
        best = probs.argmax(axis=2)  # [N, T]
        top = np.take_along_axis(probs, best[..., None], axis=2)[..., 0]
        kept = best != self.config.blank
        kept[:, 1:] &= best[:, 1:] != best[:, :-1]  # a run of one class is one character
        results = []
        for row in range(len(best)):
            characters, scores = self.table[best[row][kept[row]]], top[row][kept[row]]
            # Spaces at either end are the margin around the crop, read as spaces: not the text's.
            inked = np.flatnonzero([not c.isspace() for c in characters])
            ends = slice(inked[0], inked[-1] + 1) if inked.size else slice(0, 0)
            score = float(scores[ends].mean()) if inked.size else 0.0
            results.append({"text": "".join(characters[ends]), "score": round(score, 4)})
        return results

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        return _one_row(self.rows(outputs), self.output.name)


def ctc_class_problem(characters: int, blank: int, classes: int, output: str) -> tuple[str, str] | None:
    """(the postprocess key, what is wrong) when `characters` and a blank at `blank` are not the
    `classes` of a CTC output; None when they fit."""
    if characters + 1 != classes:
        return "characters", (
            f"{characters} characters and the blank make {characters + 1} classes, but output {output!r} "
            f"has {classes}"
        )
    if blank >= classes:
        return "blank", f"{blank} is no class of output {output!r} (0..{classes - 1})"
    return None


def _check_classes(characters: int, blank: int, classes: int, output: str) -> None:
    found = ctc_class_problem(characters, blank, classes, output)
    if found is not None:
        raise ModelError(f"postprocess.{found[0]}: {found[1]}")


class Embedding(Postprocessor):
    """An embedding vector [1, D] (or [D], or [1, D, 1, 1]) -> the vector, L2-normalised unless
    `normalize` is off, and its length before that.

    Result: {"embedding": [float, ...] (5 decimal places), "norm": float}. `__call__` reads a batch
    of one; `rows` one result per batch row.
    """

    def __init__(self, config: EmbeddingPostprocess, outputs: list[TensorSpec]) -> None:
        self.config = config
        self.output = _pick_output(config.output, outputs)
        if not self.output.shape or any(d == 0 for d in self.output.shape):
            raise ModelError(f"output {self.output.name!r} has shape {list(self.output.shape)}, not a vector")

    def vectors(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The output as [N, D] float64 vectors, as the model gave them (not normalised)."""
        raw = np.asarray(outputs[self.output.name], dtype=np.float64)
        vectors = raw.reshape(1, -1) if raw.ndim <= 1 else raw.reshape(raw.shape[0], -1)
        if vectors.shape[1] == 0:
            raise ModelError(f"output {self.output.name!r} has shape {list(raw.shape)}, not a vector")
        if not np.isfinite(vectors).all():
            raise ModelError(f"output {self.output.name!r} contains NaN or infinite values")
        return vectors

    def rows(self, outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """One {"embedding", "norm"} per batch row."""
        vectors = self.vectors(outputs)
        norms = np.linalg.norm(vectors, axis=1)
        if self.config.normalize:  # an all-zero vector has no direction: it stays zero
            vectors = vectors / np.where(norms > 0, norms, 1.0)[:, None]
        return [
            {"embedding": np.round(vector, 5).tolist(), "norm": round(float(norm), 6)}
            for vector, norm in zip(vectors, norms, strict=True)
        ]

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        return _one_row(self.rows(outputs), self.output.name)


def _one_row(rows: list[dict[str, Any]], output: str) -> dict[str, Any]:
    if len(rows) != 1:
        raise ModelError(f"output {output!r} has batch size {len(rows)}, expected 1 (read batches by rows)")
    return rows[0]


class Raw(Postprocessor):
    """Every output as {"shape", "dtype", "values" (flattened, at most max_values), "truncated"}."""

    def __init__(self, config: RawPostprocess) -> None:
        self.max_values = config.max_values

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
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


PLUGIN_GROUP = "edge_agent.postprocessors"


def load_plugin(config: PluginPostprocess, outputs: list[TensorSpec]) -> Postprocessor:
    """The plugin's postprocessor: its entry point is a factory `(options, outputs) -> callable`, the
    callable taking (outputs, geometry) and returning a JSON-ready dict (docs/plugins.md)."""
    found = {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}
    if config.name not in found:
        installed = ", ".join(sorted(found)) or "none"
        raise ModelError(
            f"no postprocessor plugin named {config.name!r} (installed in {PLUGIN_GROUP}: {installed})"
        )
    try:
        factory = found[config.name].load()
        made = factory(dict(config.options), list(outputs))
    except ModelError:
        raise
    except Exception as exc:  # a plugin's own error, at import or set-up: say whose
        raise ModelError(
            f"postprocessor plugin {config.name!r} failed to set up: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(made):
        raise ModelError(
            f"postprocessor plugin {config.name!r} returned {type(made).__name__}, not a callable"
        )
    return _PluginPostprocessor(config.name, made)


class _PluginPostprocessor(Postprocessor):
    def __init__(self, name: str, function: Any) -> None:
        self.name, self.function = name, function

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        result = self.function(outputs, geometry)
        if not isinstance(result, dict):
            raise ModelError(
                f"postprocessor plugin {self.name!r} returned {type(result).__name__}, not a dict"
            )
        return result


def build_postprocessor(config: PostprocessConfig, outputs: list[TensorSpec]) -> Postprocessor:
    if isinstance(config, ClassificationPostprocess):
        return Classification(config, outputs)
    if isinstance(config, DetectionPostprocess):
        return Detection(config, outputs)
    if isinstance(config, RegionsPostprocess):
        return Regions(config, outputs)
    if isinstance(config, ThresholdPostprocess):
        return Threshold(config, outputs)
    if isinstance(config, PluginPostprocess):
        return load_plugin(config, outputs)
    if isinstance(config, CtcPostprocess):
        return Ctc(config, outputs)
    if isinstance(config, EmbeddingPostprocess):
        return Embedding(config, outputs)
    return Raw(config)


def _to_input_pixels(corners: np.ndarray, geometry: Geometry | None) -> None:
    """Scale (x1, y1, x2, y2) rows given in 0..1 of the model input to its pixels, in place."""
    if geometry is not None:
        corners[:, 0::2] *= geometry.input_width
        corners[:, 1::2] *= geometry.input_height


_TENSOR_NAME_HINTS = {  # role -> substrings of output names that usually carry it
    "boxes": ("box",),
    "scores": ("score",),
    "classes": ("class", "label"),
    "count": ("num", "count"),
}


def _detection_tensors(config: DetectionPostprocess, outputs: list[TensorSpec]) -> dict[str, str]:
    """Output name per role (boxes, scores, and if present classes, count): as configured, else by name."""
    names = [spec.name for spec in outputs]
    found: dict[str, str] = {}
    for role, hints in _TENSOR_NAME_HINTS.items():
        chosen: str | None = getattr(config, role)
        if chosen is not None and chosen not in names:
            raise ModelError(f"postprocess.{role} {chosen!r} is not a model output; outputs: {names}")
        if chosen is None:
            chosen = next((n for n in names if any(h in n.lower() for h in hints)), None)
        if chosen is not None:
            found[role] = chosen
    for role in ("boxes", "scores"):
        if role not in found:
            raise ModelError(
                f"no model output looks like the detection {role} (outputs: {names}); "
                f"set postprocess.{role} to its name"
            )
    return found


def _label(labels: list[str] | None, index: int) -> str | None:
    return labels[index] if labels is not None and index < len(labels) else None


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
