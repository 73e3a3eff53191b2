"""Zones and lines in a frame's pixels: which boxes are in a zone, which anchors crossed a line and
which way (docs/analytics.md). numpy only, vectorised over a frame's objects.

Coordinates are source-image pixels, x to the right and y downwards from the top-left corner; a
box is [x1, y1, x2, y2] as the detection and regions postprocessors give it. Definitions:

- An anchor point is in a zone when it is inside the polygon or on its edge (the zone is closed).
- Anchor `box`: the box is in a zone when the two share some area (> 0: a box that only touches the
  zone's edge, or a box of no area, is not in it); `overlap_areas` gives that area exactly.
- A line's sides, walking from its first point to its second: `in` is crossing from the right side
  to the left, `out` from the left to the right. A line from [0, 0.5] to [1, 0.5] (left to right
  across the picture): `in` is moving up the picture, `out` moving down.
- An anchor moving from p0 to p1 crosses a line when p0 and p1 lie strictly on opposite sides and
  its path meets the line's segment (its ends included). A point on the line is on neither side:
  touching the line and going back is no crossing; pass the anchor's last position off the line as
  p0, so stopping on the line and going on counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from agent.config import LineConfig, ZoneConfig, zones_and_lines

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Anchor = Literal["bottom_center", "center", "box"]

# Pixels closer to a zone's edge or a line than this are on it (fractions scaled to pixels are not exact).
ON_EDGE_PX = 1e-6
MIN_OVERLAP_PX2 = 1e-6  # a shared area below this is a touch, not an overlap


def to_pixels(points: npt.ArrayLike, units: Literal["fraction", "pixels"], width: int, height: int) -> Array:
    """Points [[x, y], ...] as source-image pixels, float64 (n, 2): fractions scaled by the frame's size."""
    array = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    return array * np.array([width, height], dtype=np.float64) if units == "fraction" else array.copy()


def outside_frame(pixels: Array, width: int, height: int) -> list[int]:
    """Indices of the points outside the width x height frame (pixel units the config cannot check)."""
    x, y = pixels[:, 0], pixels[:, 1]
    return [int(i) for i in np.flatnonzero((x < 0) | (y < 0) | (x > width) | (y > height))]


def anchor_points(boxes: npt.ArrayLike, anchor: Literal["bottom_center", "center"]) -> Array:
    """(N, 2) anchor points of (N, 4) boxes: the middle of the bottom edge, or the centre."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x = (b[:, 0] + b[:, 2]) / 2
    y = b[:, 3] if anchor == "bottom_center" else (b[:, 1] + b[:, 3]) / 2
    return np.stack([x, y], axis=1)


def _edges(polygon: Array) -> tuple[Array, Array, Array, Array]:
    """Each edge's start (ax, ay) and end (bx, by) as (1, M) rows (the last corner joins the first)."""
    a = polygon
    b = np.roll(polygon, -1, axis=0)
    return a[None, :, 0], a[None, :, 1], b[None, :, 0], b[None, :, 1]


def _edge_tests(points: Array, ax: Array, ay: Array, bx: Array, by: Array) -> tuple[BoolArray, BoolArray]:
    """(N, E) for N points against E edges (rows (1, E) of their ends): whether the edge crosses the
    ray from the point to the right (the even-odd rule counts these), and whether the point is on
    the edge (within ON_EDGE_PX of the segment's line, and between its ends)."""
    px, py = points[:, 0:1], points[:, 1:2]  # (N, 1) against (1, E) edges
    straddles = (ay > py) != (by > py)
    dy = np.where(straddles, by - ay, 1.0)
    ray = straddles & (px < ax + (py - ay) * (bx - ax) / dy)
    ex, ey = bx - ax, by - ay
    length = np.hypot(ex, ey)
    cross = ex * (py - ay) - ey * (px - ax)
    along = ex * (px - ax) + ey * (py - ay)
    slack = ON_EDGE_PX * length
    on_edge = (np.abs(cross) <= slack) & (along >= -slack) & (along <= length * length + slack)
    return ray, on_edge


def points_in_polygon(points: npt.ArrayLike, polygon: Array) -> npt.NDArray[np.bool_]:
    """(N,) whether each point is inside the (simple, maybe concave) polygon or on its edge."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    ray, on_edge = _edge_tests(p, *_edges(polygon))
    result: npt.NDArray[np.bool_] = (np.count_nonzero(ray, axis=1) % 2 == 1) | on_edge.any(axis=1)
    return result


def overlap_areas(boxes: npt.ArrayLike, polygon: Array) -> Array:
    """(N,) the area each box shares with the polygon, in square pixels.

    Green's theorem over the polygon's edges with F(x, y) = [x1 <= x <= x2] * (clamp(y, y1, y2) - y1),
    whose dF/dy is the box's indicator: the area is |sum over edges of the integral of F dx|. Each
    edge's integral is closed-form (y is linear along it), so the whole is a few (N, M) operations."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x1, y1, x2, y2 = (b[:, i : i + 1] for i in range(4))  # (N, 1)
    ax, ay, bx, by = _edges(polygon)
    u = np.maximum(np.minimum(ax, bx), x1)  # the edge's x-range clipped to the box's
    v = np.minimum(np.maximum(ax, bx), x2)
    width = np.maximum(v - u, 0.0)
    slope = np.where(bx != ax, (by - ay) / np.where(bx != ax, bx - ax, 1.0), 0.0)
    yu, yv = ay + (u - ax) * slope, ay + (v - ax) * slope
    height = y2 - y1

    def integral_of_h(t: Array) -> Array:  # G(t) = integral from y1 to t of clamp(y, y1, y2) - y1
        c = np.clip(t, y1, y2) - y1
        return 0.5 * c * c + height * np.maximum(t - y2, 0.0)

    flat = np.abs(yv - yu) <= 1e-9
    mid = np.clip((yu + yv) / 2, y1, y2) - y1
    steep = (integral_of_h(yv) - integral_of_h(yu)) * width / np.where(flat, 1.0, yv - yu)
    integral = np.where(flat, mid * width, steep)
    areas: Array = np.abs(np.sum(np.sign(bx - ax) * integral, axis=1))
    return areas


def boxes_in_zone(boxes: npt.ArrayLike, polygon: Array, anchor: Anchor) -> npt.NDArray[np.bool_]:
    """(N,) whether each box is in the zone by the zone's anchor rule (the module's definitions)."""
    if anchor == "box":
        result: npt.NDArray[np.bool_] = overlap_areas(boxes, polygon) > MIN_OVERLAP_PX2
        return result
    return points_in_polygon(anchor_points(boxes, anchor), polygon)


def _points(points: npt.ArrayLike) -> Array:
    """Points [x, y] as float64 with x, y in the last axis: (N, 2) from a list or one point, or
    as given (e.g. (N, L, 2): each object's anchor for each of L lines)."""
    array = np.asarray(points, dtype=np.float64)
    return array.reshape(-1, 2) if array.ndim < 2 else array


def line_sides(points: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike) -> npt.NDArray[np.int8]:
    """+1 for points on the left (the `in` side) of the line walking from start to end, -1 on the
    right, 0 on it (its infinite extension: within ON_EDGE_PX). Points (N, 2) against one line
    (start, end (2,)): (N,); points (N, L, 2) against L lines (start, end (L, 2)): (N, L)."""
    p = _points(points)
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    d = e - s
    cross = d[..., 0] * (p[..., 1] - s[..., 1]) - d[..., 1] * (p[..., 0] - s[..., 0])
    slack = ON_EDGE_PX * np.hypot(d[..., 0], d[..., 1])
    # y grows downwards: the walker's left is where this cross product is negative.
    return np.where(cross < -slack, 1, np.where(cross > slack, -1, 0)).astype(np.int8)


def _crossed(
    p0: npt.ArrayLike, p1: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int8]]:
    """`crossings`, and p1's `line_sides` (the caller keeps an anchor's last position off the line)."""
    a, b = _points(p0), _points(p1)
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    before, after = line_sides(a, s, e), line_sides(b, s, e)  # NaN in p0 (no position yet): 0
    # The path meets the segment: the line's two ends are not strictly on one side of the path.
    dx, dy = b[..., 0] - a[..., 0], b[..., 1] - a[..., 1]
    slack = ON_EDGE_PX * np.hypot(dx, dy)
    at_start = dx * (s[..., 1] - a[..., 1]) - dy * (s[..., 0] - a[..., 0])
    at_end = dx * (e[..., 1] - a[..., 1]) - dy * (e[..., 0] - a[..., 0])
    apart = ((at_start > slack) & (at_end > slack)) | ((at_start < -slack) & (at_end < -slack))
    crossed = (before * after == -1) & ~apart
    return np.where(crossed, after, 0).astype(np.int8), after


def crossings(
    p0: npt.ArrayLike, p1: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike
) -> npt.NDArray[np.int8]:
    """For anchors moving from p0 to p1: +1 crossed the line `in` (right to left), -1 `out`, 0 not
    crossed (same side, touching, moving along it, passing beyond its ends, or no p0: NaN). Shapes
    as `line_sides`: (N, 2) paths against one line, or (N, L, 2) against L lines."""
    return _crossed(p0, p1, start, end)[0]


@dataclass(frozen=True)
class ZoneShape:
    """A configured zone in one frame size's pixels."""

    name: str
    polygon: Array
    anchor: Anchor
    labels: frozenset[str] | None

    @classmethod
    def from_config(cls, zone: ZoneConfig, width: int, height: int) -> ZoneShape:
        labels = frozenset(zone.labels) if zone.labels is not None else None
        return cls(zone.name, to_pixels(zone.points, zone.units, width, height), zone.anchor, labels)

    def contains(self, boxes: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        return boxes_in_zone(boxes, self.polygon, self.anchor)


@dataclass(frozen=True)
class LineShape:
    """A configured line in one frame size's pixels, with its directions' names."""

    name: str
    start: Array
    end: Array
    directions: tuple[str, str]  # (in, out)
    anchor: Literal["bottom_center", "center"]
    labels: frozenset[str] | None

    @classmethod
    def from_config(cls, line: LineConfig, width: int, height: int) -> LineShape:
        start, end = to_pixels(line.points, line.units, width, height)
        labels = frozenset(line.labels) if line.labels is not None else None
        return cls(line.name, start, end, (line.in_, line.out), line.anchor, labels)

    def crossings(self, boxes_before: npt.ArrayLike, boxes_now: npt.ArrayLike) -> npt.NDArray[np.int8]:
        """+1 (in), -1 (out) or 0 per object, from each one's box before and now (anchors: `crossings`)."""
        return crossings(
            anchor_points(boxes_before, self.anchor),
            anchor_points(boxes_now, self.anchor),
            self.start,
            self.end,
        )

    def direction(self, crossing: int) -> str:
        """The name of a crossing's direction (+1: in, -1: out)."""
        return self.directions[0] if crossing > 0 else self.directions[1]


def frame_problems(zones: list[ZoneConfig], lines: list[LineConfig], width: int, height: int) -> list[str]:
    """What a pixel-unit zone or line gets wrong in a width x height frame (its points outside it):
    the config cannot know the frame's size, so the pipeline says this once it sees the first frame."""
    problems = []
    for key, i, item in zones_and_lines(zones, lines):
        if item.units != "pixels":
            continue
        pixels = to_pixels(item.points, "pixels", width, height)
        for j in outside_frame(pixels, width, height):
            x, y = pixels[j]
            where = f"{key}[{i}] ({item.name}): point {j} ({x:g}, {y:g})"
            problems.append(f"{where} is outside the {width}x{height} frame")
    return problems


_PointAnchor = Literal["bottom_center", "center"]


class ZoneGroup:
    """All of a pipeline's zones at once: `contains` tests every box against every zone in a few
    array operations (the edges of all point-anchored zones side by side), not a call per zone."""

    def __init__(self, zones: list[ZoneShape]) -> None:
        self.zones = zones
        # Per anchor kind: the zones using it, their edges' ends (ax, ay, bx, by) side by side, and
        # where each zone's edges start among them.
        self._by_anchor: list[
            tuple[_PointAnchor, list[int], tuple[Array, Array, Array, Array], IntArray]
        ] = []
        anchors: tuple[_PointAnchor, ...] = ("bottom_center", "center")
        for anchor in anchors:
            members = [i for i, z in enumerate(zones) if z.anchor == anchor]
            if not members:
                continue
            polygons = [zones[i].polygon for i in members]
            starts: IntArray = np.cumsum([0] + [len(p) for p in polygons[:-1]], dtype=np.int64)
            each = [_edges(p) for p in polygons]
            ax, ay, bx, by = (np.concatenate([e[k] for e in each], axis=1) for k in range(4))
            edges = (ax, ay, bx, by)
            self._by_anchor.append((anchor, members, edges, starts))
        self._box_zones = [i for i, z in enumerate(zones) if z.anchor == "box"]

    def contains(self, boxes: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """(N, Z): whether each box is in each zone by that zone's anchor rule."""
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        result = np.zeros((len(b), len(self.zones)), dtype=bool)
        for anchor, members, edges, starts in self._by_anchor:
            ray, on_edge = _edge_tests(anchor_points(b, anchor), *edges)
            inside = np.add.reduceat(ray.astype(np.int32), starts, axis=1) % 2 == 1
            result[:, members] = inside | np.logical_or.reduceat(on_edge, starts, axis=1)
        for i in self._box_zones:
            result[:, i] = overlap_areas(b, self.zones[i].polygon) > MIN_OVERLAP_PX2
        return result


class LineGroup:
    """All of a pipeline's lines at once: anchors, sides and crossings as (N, L) arrays."""

    def __init__(self, lines: list[LineShape]) -> None:
        self.lines = lines
        self.start = np.array([line.start for line in lines], dtype=np.float64).reshape(-1, 2)
        self.end = np.array([line.end for line in lines], dtype=np.float64).reshape(-1, 2)
        self._centre = np.array([line.anchor == "center" for line in lines], dtype=bool)

    def anchors(self, boxes: npt.ArrayLike) -> Array:
        """(N, L, 2): each box's anchor point for each line."""
        bottom, centre = anchor_points(boxes, "bottom_center"), anchor_points(boxes, "center")
        result: Array = np.where(self._centre[None, :, None], centre[:, None, :], bottom[:, None, :])
        return result

    def crossings(self, p0: Array, p1: Array) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int8]]:
        """(N, L) `crossings` of (N, L, 2) paths from p0 to p1 (NaN in p0: no crossing), and p1's
        `line_sides`."""
        return _crossed(p0, p1, self.start, self.end)
