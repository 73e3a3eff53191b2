"""Object filters and masks in a frame's pixels (a pipeline's `filters:`, agent/config/filters.py;
docs/analytics.md "Object filters and masks"): which of a frame's boxes are kept, and for each one
dropped the rule that dropped it. numpy only, vectorised over the frame's boxes.

A box is [x1, y1, x2, y2] in source-image pixels as the detection and regions postprocessors give
it; its area is (x2 - x1) * (y2 - y1) square pixels, its ratio (x2 - x1) / (y2 - y1) (a box of no
height has an infinite ratio). A label's rule is the default's with the label's own keys over it.
The rules are tried in `RULES`' order and a box is counted under the first that drops it; a score
or box value a rule cannot judge (no score given) keeps the box.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.config.filters import RULES, FiltersConfig, ObjectRule
from agent.filter_counts import Drops
from agent.processing.postprocess import Postprocessor
from agent.processing.preprocess import Geometry
from agent.processing.scene import boxes_of, label_of
from agent.processing.zones import ZoneGroup, ZoneShape, to_pixels

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

KEPT = -1  # `judge`'s answer for a box no rule drops
_LIMITS = RULES[:-1]  # the per-label thresholds, the columns of a rule table (RULES ends with "mask")


class ObjectFilter:
    """A pipeline's filters, turned into arrays once per frame size (fractions need the frame's)."""

    def __init__(self, config: FiltersConfig) -> None:
        self.config = config
        # A row per rule: the default first, then each configured label's (the default's keys under it).
        self._rows = {label: i + 1 for i, label in enumerate(config.labels)}
        self._merged = [
            _over(config.default, config.default),
            *(_over(config.default, rule) for rule in config.labels.values()),
        ]
        self._size: tuple[int, int] | None = None
        self._table: Array = np.empty((0, len(_LIMITS)))
        self._masks: ZoneGroup | None = None
        self._mask_labels: list[frozenset[str] | None] = []

    def _for_size(self, width: int, height: int) -> None:
        """The rule table and the masks in this frame size's pixels (unknown size, 0: only what is
        given in pixels applies)."""
        if self._size == (width, height):
            return
        known = width > 0 and height > 0
        table = np.full((len(self._merged), len(_LIMITS)), np.nan)
        for row, merged in enumerate(self._merged):
            for column, key in enumerate(_LIMITS):
                value, units = merged[key]
                if value is None or (key.endswith("area") and units == "fraction" and not known):
                    continue
                scale = width * height if key.endswith("area") and units == "fraction" else 1.0
                table[row, column] = value * scale
        masks = [(i, m) for i, m in enumerate(self.config.masks) if known or m.units == "pixels"]
        shapes = [
            ZoneShape(f"masks[{i}]", to_pixels(m.points, m.units, width, height), m.anchor, None)
            for i, m in masks
        ]
        self._table, self._size = table, (width, height)
        self._masks = ZoneGroup(shapes) if shapes else None
        self._mask_labels = [frozenset(m.labels) if m.labels is not None else None for _, m in masks]

    def judge(
        self, boxes: npt.ArrayLike, scores: npt.ArrayLike, labels: Sequence[str], width: int, height: int
    ) -> IntArray:
        """(N,) for N boxes (N, 4), their scores (NaN: none) and labels: the index in `RULES` of the
        rule that drops each box, or KEPT."""
        self._for_size(width, height)
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        score = np.asarray(scores, dtype=np.float64).reshape(-1)
        limits = self._table[[self._rows.get(label, 0) for label in labels]].reshape(-1, len(_LIMITS))
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        area = w * h
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(h > 0, w / np.where(h > 0, h, 1.0), np.inf)
        # NaN (a rule not set, a score not given) compares false: it drops nothing.
        dropped = np.stack(
            [
                score < limits[:, 0],
                area < limits[:, 1],
                area > limits[:, 2],
                ratio < limits[:, 3],
                ratio > limits[:, 4],
                self._masked(b, labels),
            ],
            axis=1,
        )
        first: IntArray = np.where(dropped.any(axis=1), dropped.argmax(axis=1), KEPT).astype(np.int64)
        return first

    def _masked(self, boxes: Array, labels: Sequence[str]) -> npt.NDArray[np.bool_]:
        """(N,) whether each box's anchor lies in a mask that applies to its label."""
        if self._masks is None or not len(boxes):
            return np.zeros(len(boxes), dtype=bool)
        inside = self._masks.contains(boxes)  # (N, M)
        applies = np.array(
            [[only is None or label in only for only in self._mask_labels] for label in labels], dtype=bool
        ).reshape(inside.shape)
        result: npt.NDArray[np.bool_] = (inside & applies).any(axis=1)
        return result

    def apply(
        self, output: Mapping[str, Any], width: int, height: int
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """`output` (a postprocessed frame) with only the boxes the filters keep, and (label, rule) of
        each box dropped. An output without boxes (a plugin's frame without any) is given back as it is."""
        entries = boxes_of(output)
        if not entries:
            return dict(output), []
        labels = [label_of(entry) for entry in entries]  # the scene's names: counts match its labels
        boxes = [entry["box"] for entry in entries]
        scores = [_score(entry) for entry in entries]
        verdicts = self.judge(boxes, scores, labels, width, height)
        kept = [entry for entry, verdict in zip(entries, verdicts, strict=True) if verdict == KEPT]
        dropped = [(labels[i], RULES[int(v)]) for i, v in enumerate(verdicts) if v != KEPT]
        key = "detections" if "detections" in output else "regions"
        return {**output, key: kept}, dropped


def _score(entry: Mapping[str, Any]) -> float:
    score = entry.get("score")
    return float(score) if isinstance(score, int | float) else float("nan")


def _over(default: ObjectRule, rule: ObjectRule) -> dict[str, tuple[float | None, str]]:
    """A label's rule over the default, key by key: (value, the units of the rule it came from)."""
    merged: dict[str, tuple[float | None, str]] = {
        key: (getattr(default, key), default.units) for key in _LIMITS
    }
    merged.update({key: (getattr(rule, key), rule.units) for key in rule.given()})
    return merged


class Filtered(Postprocessor):
    """A postprocessor whose boxes go through the filters: `edge-agent infer` runs a stage's
    preprocess, model and postprocess (not the pipeline's steps), and drops what the pipeline's
    filter step would."""

    def __init__(self, postprocess: Postprocessor, config: FiltersConfig) -> None:
        self.postprocess = postprocess
        self.filter = ObjectFilter(config)
        self.drops = Drops()

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None = None) -> dict[str, Any]:
        size = (geometry.source_width, geometry.source_height) if geometry is not None else (0, 0)
        output, dropped = self.filter.apply(self.postprocess(outputs, geometry), *size)
        self.drops.count(len(boxes_of(output) or []), dropped)
        return output
