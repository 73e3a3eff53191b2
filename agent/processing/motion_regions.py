"""Motion regions: where in a frame the detector runs, and its boxes from several crops made one list.

A 1280x720 frame letterboxed into a 320x320 input shrinks 4x: a 40-px face becomes 10 px and is lost.
With regions (`motion.regions`), the detector runs instead on crops around where the frame moved (the
motion gate's areas), each the size of the model's input, so a small far object is seen at full
resolution (Frigate's regions). An area bigger than the input gets a crop a little larger than it, of
the input's shape, scaled down. Crops that overlap much are merged, at most `max_regions` run (most
motion first), and the whole frame runs as usual when motion covers most of it or a crop cannot fit.

`plan_regions` chooses the crops; `merge_detections` makes one frame's detections of the crops' (one
object in two crops is one detection; the whole box wins over one a crop's border cut). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in frame pixels

MARGIN = 0.1  # an area bigger than the input gets a crop this much larger than it (context at its edges)
OVERLAP = 0.5  # crops whose overlap is this share of the smaller one are merged
# A detection this close to a crop's edge (share of the crop's width; 2 px at least) that is not the
# frame's edge was cut by the crop: it loses to a whole one of the same object from another crop.
CUT_MARGIN = 0.01


@dataclass(frozen=True)
class _Group:
    """Areas run in one crop: their bounding box, how much moved (their summed area), the crop."""

    bounds: Box
    motion: float
    crop: Box
    scale: float  # crop size / input size (1: the input's own resolution; more: scaled down)


def plan_regions(
    areas: Sequence[Box],
    frame_size: tuple[int, int],
    input_size: tuple[int, int],
    *,
    tracked: Sequence[Box] = (),
    max_regions: int = 4,
    full_frame_above: float = 0.5,
) -> list[Box] | None:
    """The crops (x1, y1, x2, y2 in frame pixels, of the input's shape) to run the detector on, most
    motion first; None: run on the whole frame.

    `areas`: where the frame moved; `tracked`: the live tracks' last boxes (an object that stopped
    moving is still looked at); `frame_size` and `input_size`: (width, height). The whole frame when
    motion covers more than `full_frame_above` of it, when nothing moved or is tracked, when the frame
    is not larger than the input, or when an area needs a crop larger than the frame.
    """
    width, height = frame_size
    input_w, input_h = input_size
    if input_w > width or input_h > height or (input_w, input_h) == (width, height):
        return None  # a crop of the input's shape would not fit the frame, or would be all of it
    moved = [box for box in (_clip(a, width, height) for a in areas) if box is not None]
    if _union_area(moved) > full_frame_above * width * height:
        return None
    boxes = moved + [box for box in (_clip(t, width, height) for t in tracked) if box is not None]
    groups: list[_Group] = []
    for box in boxes:
        group = _group(box, _area(box), frame_size, input_size)
        if group is None:
            return None  # an area larger than the frame can hold at the input's shape
        groups.append(group)
    if not groups:
        return None  # nothing to look at: the gate let the frame through for another reason
    groups = _merged(groups, frame_size, input_size)
    groups.sort(key=lambda g: -g.motion)
    return [g.crop for g in groups[:max_regions]]


def _merged(groups: list[_Group], frame_size: tuple[int, int], input_size: tuple[int, int]) -> list[_Group]:
    """Groups merged until no two should be: one crop covers both at no loss of resolution, or their
    crops overlap much (and one crop of both fits the frame). Each group joins the merged ones in
    turn, and a group that grew is checked again against the rest (no two of which merge)."""
    merged: list[_Group] = []
    for group in groups:
        while True:
            found = next(
                (
                    (k, joined)
                    for k, other in enumerate(merged)
                    if (joined := _join(group, other, frame_size, input_size)) is not None
                ),
                None,
            )
            if found is None:
                merged.append(group)
                break
            del merged[found[0]]
            group = found[1]
    return merged


def _join(a: _Group, b: _Group, frame_size: tuple[int, int], input_size: tuple[int, int]) -> _Group | None:
    bounds = (
        min(a.bounds[0], b.bounds[0]),
        min(a.bounds[1], b.bounds[1]),
        max(a.bounds[2], b.bounds[2]),
        max(a.bounds[3], b.bounds[3]),
    )
    joined = _group(bounds, a.motion + b.motion, frame_size, input_size)
    if joined is None:
        return None
    if joined.scale <= max(a.scale, b.scale):
        return joined  # one crop sees both as sharp as either did alone
    overlap = _area(_intersection(a.crop, b.crop))
    return joined if overlap >= OVERLAP * min(_area(a.crop), _area(b.crop)) else None


def _group(
    bounds: Box, motion: float, frame_size: tuple[int, int], input_size: tuple[int, int]
) -> _Group | None:
    """The crop of the input's shape centred on `bounds`, inside the frame: the input's size, or (for
    bounds larger than it) MARGIN larger than them; None when that is larger than the frame."""
    width, height = frame_size
    input_w, input_h = input_size
    box_w, box_h = bounds[2] - bounds[0], bounds[3] - bounds[1]
    scale = max(1.0, box_w * (1 + MARGIN) / input_w, box_h * (1 + MARGIN) / input_h)
    crop_w, crop_h = round(input_w * scale), round(input_h * scale)
    if crop_w > width or crop_h > height:
        return None
    x1 = min(max(round((bounds[0] + bounds[2] - crop_w) / 2), 0), width - crop_w)
    y1 = min(max(round((bounds[1] + bounds[3] - crop_h) / 2), 0), height - crop_h)
    return _Group(bounds, motion, (x1, y1, x1 + crop_w, y1 + crop_h), scale)


def merge_detections(
    crops: Sequence[tuple[Box, Sequence[Mapping[str, Any]]]],
    frame_size: tuple[int, int],
    iou_threshold: float,
    limit: int,
) -> list[dict[str, Any]]:
    """One frame's detections from each crop's (`box` already in frame pixels), best first, at most
    `limit`: per label (`index`), a box overlapping a kept one by more than `iou_threshold` is dropped
    (NMS), and a box a crop's inner border cut is dropped when a kept box holds most of it. Whole boxes
    are kept before cut ones, so the whole object from a neighbouring crop wins."""
    candidates: list[tuple[bool, float, int, Mapping[str, Any]]] = []
    for crop, detections in crops:
        for detection in detections:
            cut = _cut_by(detection["box"], crop, frame_size)
            candidates.append((cut, -float(detection["score"]), len(candidates), detection))
    candidates.sort(key=lambda c: c[:3])
    kept: list[Mapping[str, Any]] = []
    for cut, _, _, detection in candidates:
        box = detection["box"]
        same = [k["box"] for k in kept if k["index"] == detection["index"]]
        if any(_iou(box, other) > iou_threshold for other in same):
            continue
        if cut and any(_area(_intersection(box, other)) > OVERLAP * _area(box) for other in same):
            continue
        kept.append(detection)
    kept.sort(key=lambda d: -float(d["score"]))
    return [dict(d) for d in kept[:limit]]


def _cut_by(box: Sequence[float], crop: Box, frame_size: tuple[int, int]) -> bool:
    """Whether `box` touches an edge of `crop` that is inside the frame (the object may go on past it)."""
    width, height = frame_size
    near = max(2.0, CUT_MARGIN * (crop[2] - crop[0]))
    return bool(
        (crop[0] > 0 and box[0] - crop[0] < near)
        or (crop[1] > 0 and box[1] - crop[1] < near)
        or (crop[2] < width and crop[2] - box[2] < near)
        or (crop[3] < height and crop[3] - box[3] < near)
    )


def _clip(box: Sequence[float], width: int, height: int) -> Box | None:
    x1, y1 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


def _area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _intersection(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float, float]:
    return (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    inter = _area(_intersection(a, b))
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def _union_area(boxes: Sequence[Box]) -> int:
    """The area the boxes cover together (overlaps once): their edges cut the frame into cells, and
    the cells inside any box are summed (a few dozen boxes: a small grid)."""
    if not boxes:
        return 0
    xs = np.unique([v for b in boxes for v in (b[0], b[2])])
    ys = np.unique([v for b in boxes for v in (b[1], b[3])])
    covered = np.zeros((len(ys) - 1, len(xs) - 1), dtype=bool)
    for x1, y1, x2, y2 in boxes:
        covered[
            np.searchsorted(ys, y1) : np.searchsorted(ys, y2),
            np.searchsorted(xs, x1) : np.searchsorted(xs, x2),
        ] = True
    cell_w, cell_h = np.diff(xs), np.diff(ys)
    return int((covered * cell_h[:, None] * cell_w[None, :]).sum())
