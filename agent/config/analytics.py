"""A pipeline's zones (polygons) and lines, in fractions of the frame or source-image pixels: what
tracking and analytics count objects in and across (docs/analytics.md). The checks here need no
frame: a point outside 0..1, a polygon whose edges cross, a zero-length line; the pipeline checks
names and labels across its zones and lines (agent/config/pipeline.py)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, field_validator

from agent.config.base import Name, StrictModel

MAX_POINTS = 100  # vertices of a zone; far beyond a hand-drawn polygon, and the geometry is O(points)
MAX_PIXELS = 100_000.0

Coordinate = Annotated[float, Field(ge=0, le=MAX_PIXELS, allow_inf_nan=False)]
Point = tuple[Coordinate, Coordinate]
Units = Literal["fraction", "pixels"]


def _units_field() -> Any:
    return Field(
        "fraction",
        description="fraction: points are 0..1 of the frame's width and height (from the top-left corner), "
        "so the zone fits any resolution; pixels: points are pixels of the source image.",
    )


Label = Annotated[str, Field(min_length=1)]


def labels_field() -> Any:
    return Field(
        None,
        min_length=1,
        description="Only objects of these labels (names from postprocess.labels, else the model's own); "
        "default: every one.",
    )


def _fractions_only(schema: dict[str, Any]) -> None:
    """JSON Schema: with units fraction (the default) every coordinate is at most 1."""
    schema["if"] = {"properties": {"units": {"const": "pixels"}}, "required": ["units"]}
    at_most_1 = {"prefixItems": [{"maximum": 1}, {"maximum": 1}]}
    schema["else"] = {"properties": {"points": {"items": at_most_1}}}


def _point_text(point: Point) -> str:
    return f"({point[0]:g}, {point[1]:g})"


def _fractions_problem(points: list[Point], info: ValidationInfo) -> None:
    if info.data.get("units", "fraction") != "fraction":
        return
    for i, point in enumerate(points):
        if max(point) > 1:
            raise ValueError(
                f"point {i} {_point_text(point)} is outside the frame: with units: fraction (the default) "
                "coordinates are 0..1 of the frame's width and height; write units: pixels for pixels"
            )


def _repeats(points: list[Point]) -> None:
    for i, point in enumerate(points):
        if point in points[:i]:
            raise ValueError(f"point {i} {_point_text(point)} repeats point {points.index(point)}")


def _orientation(a: Point, b: Point, c: Point) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _on_segment(a: Point, b: Point, p: Point) -> bool:
    return min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= p[1] <= max(a[1], b[1])


def _edges_meet(a: Point, b: Point, c: Point, d: Point) -> bool:
    """Segments ab and cd share a point (crossing, touching or overlapping)."""
    o1, o2, o3, o4 = (
        _orientation(a, b, c),
        _orientation(a, b, d),
        _orientation(c, d, a),
        _orientation(c, d, b),
    )
    if ((o1 > 0 and o2 < 0) or (o1 < 0 and o2 > 0)) and ((o3 > 0 and o4 < 0) or (o3 < 0 and o4 > 0)):
        return True
    return (
        (o1 == 0 and _on_segment(a, b, c))
        or (o2 == 0 and _on_segment(a, b, d))
        or (o3 == 0 and _on_segment(c, d, a))
        or (o4 == 0 and _on_segment(c, d, b))
    )


def polygon_problem(points: list[Point]) -> str | None:
    """Why `points` (in order, the last joined to the first) is not a simple polygon, or None."""
    n = len(points)
    edges = [(points[i], points[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):  # neighbours share a corner
                continue
            if _edges_meet(*edges[i], *edges[j]):
                return (
                    f"edge {i}-{(i + 1) % n} meets edge {j}-{(j + 1) % n}: a zone's edges must not cross "
                    "or touch (list the corners in order around the zone)"
                )
    area = sum(_orientation(points[0], points[i], points[i + 1]) for i in range(1, n - 1))
    if area == 0:
        return "the points lie on one line: the zone has no area"
    return None


def checked_polygon(points: list[Point], info: ValidationInfo, what: str = "zone") -> list[Point]:
    """`points` as a zone, a motion mask or an object mask takes them: inside the frame in fractions,
    no point twice, a simple polygon; the message names `what` it is."""
    _fractions_problem(points, info)
    _repeats(points)
    problem = polygon_problem(points)
    if problem:
        raise ValueError(problem.replace("a zone's", f"a {what}'s").replace("the zone", f"the {what}"))
    return points


def area_fractions_only(*keys: str) -> Callable[[dict[str, Any]], None]:
    """JSON Schema: with units fraction (the default) these area keys are at most 1."""

    def extra(schema: dict[str, Any]) -> None:
        schema["if"] = {"properties": {"units": {"const": "pixels"}}, "required": ["units"]}
        schema["else"] = {"properties": {key: {"maximum": 1} for key in keys}}

    return extra


def area_problem(key: str, value: float | None, units: Units) -> str | None:
    """Why an area `value` of `key` cannot be in `units`: a fraction of the frame above 1."""
    if units != "fraction" or value is None or value <= 1:
        return None
    return (
        f"{key} {value:g} is more than the whole frame: with units: fraction (the default) areas are 0..1 "
        "of the frame's area; write units: pixels for square pixels"
    )


class MaskConfig(StrictModel):
    """A polygon of the frame in fractions or pixels, as a zone's: what a motion mask and an object
    mask are made of."""

    units: Units = _units_field()  # before `points`, whose check reads it
    points: list[Point] = Field(
        min_length=3,
        max_length=MAX_POINTS,
        json_schema_extra={"uniqueItems": True},
        description="The polygon's corners [x, y] in order around it (the last joins the first), as a "
        "zone's: its edges must not cross. x grows to the right, y downwards.",
    )

    model_config = ConfigDict(json_schema_extra=_fractions_only)

    @field_validator("points")
    @classmethod
    def _simple_polygon(cls, points: list[Point], info: ValidationInfo) -> list[Point]:
        return checked_polygon(points, info, "mask")


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    return pattern


Regex = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_regex)]


class _Drawn(StrictModel):
    """What a zone and a line share: a name, their points' units, a label filter and an attribute
    condition."""

    name: Name
    units: Units = _units_field()  # before `points`, whose check reads it
    labels: list[Label] | None = labels_field()
    attributes: dict[Name, Regex] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="Only objects whose attributes match: attribute name (of the pipeline's `attributes:`) "
        "-> regular expression, searched in the attribute's value as text (e.g. {text: '^[A-Z]{2}'}). "
        "An object not read yet does not count; it may once its value matches.",
    )

    model_config = ConfigDict(json_schema_extra=_fractions_only)


class ZoneConfig(_Drawn):
    """A polygon zone: an object is in it when its anchor point is (or, anchor box, its box overlaps it)."""

    points: list[Point] = Field(
        min_length=3,
        max_length=MAX_POINTS,
        json_schema_extra={"uniqueItems": True},
        description="The polygon's corners [x, y] in order around it (the last joins the first); its edges "
        "must not cross. x grows to the right, y downwards.",
    )
    anchor: Literal["bottom_center", "center", "box"] = Field(
        "bottom_center",
        description="What must be inside: bottom_center (where an object stands; DeepStream's and "
        "supervision's default), center, or box (the box overlaps the zone: they share some area).",
    )
    min_frames: int = Field(1, ge=1, le=10_000, description="Inside this many frames in a row ...")
    min_seconds: float = Field(
        0.0, ge=0, le=86_400, description="... and for at least this long before 'entered'."
    )
    dwell_s: float | None = Field(
        None, gt=0, le=86_400 * 7, description="An event when an object stays inside longer than this."
    )
    max_objects: int | None = Field(
        None, ge=1, le=100_000, description="Overcrowding: an event when more objects than this are inside."
    )

    @field_validator("points")
    @classmethod
    def _simple_polygon(cls, points: list[Point], info: ValidationInfo) -> list[Point]:
        return checked_polygon(points, info)


class LineConfig(_Drawn):
    """A line objects cross, in one of two named directions."""

    points: list[Point] = Field(
        min_length=2,
        max_length=2,
        json_schema_extra={"uniqueItems": True},
        description="Its two ends [x, y]. Walking from the first to the second, crossing from the right "
        "side to the left is `in`, from the left to the right `out` (x grows to the right, y downwards).",
    )
    in_: Name = Field("in", alias="in", description="The name of the direction right-to-left.")
    out: Name = Field("out", description="The name of the direction left-to-right.")
    anchor: Literal["bottom_center", "center"] = Field(
        "bottom_center", description="The point of a box whose path is tested: bottom_center or center."
    )

    # `in` is a Python keyword: the field is in_, its key `in`, in the YAML and in every dump.
    model_config = ConfigDict(serialize_by_alias=True)

    @field_validator("points")
    @classmethod
    def _a_line(cls, points: list[Point], info: ValidationInfo) -> list[Point]:
        _fractions_problem(points, info)
        if points[0] == points[1]:
            raise ValueError(f"both ends are {_point_text(points[0])}: a line needs two different points")
        return points

    @field_validator("out")
    @classmethod
    def _two_directions(cls, out: str, info: ValidationInfo) -> str:
        if out == info.data.get("in_"):
            raise ValueError(f"in and out are both {out!r}: the two directions need different names")
        return out


class SnapshotsConfig(StrictModel):
    """Each tracked object's best picture (docs/analytics.md): kept on disk under the state dir (bounded
    by the agent's `snapshots:` retention), named by the object's events and published retained on
    state/<pipeline>/snapshot/<label>."""

    enabled: bool = Field(False, description="Take snapshots (video sources only).")
    crop: bool = Field(False, description="Also keep a clean crop of the object (no box drawn).")
    interval_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="A better picture of an object replaces its snapshot at most this often.",
    )
    quality: int = Field(80, ge=10, le=100, description="JPEG quality.")


class TrackConfig(StrictModel):
    """Object tracking (ByteTrack: agent/processing/tracking.py): stable ids across frames, which zones,
    lines, dwell and the events need. Zones or lines turn it on with these defaults."""

    per_label: bool = Field(
        True, description="Match a detection only to tracks of its own label; false: class-agnostic."
    )
    high_score: float = Field(
        0.5, ge=0, le=1, description="Detections from this score are matched first and can start tracks."
    )
    low_score: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Detections between this and high_score only keep a track going (a partly hidden "
        "object); the detector's score_threshold must be this low for them to reach the tracker.",
    )
    new_track_score: float = Field(0.6, ge=0, le=1, description="A new track needs a detection this good.")
    min_iou: float = Field(
        0.2, gt=0, le=1, description="The least overlap between a track's predicted box and its detection."
    )
    min_hits: int = Field(
        2, ge=1, le=100, description="Frames in a row a new track must be seen before it gets an id."
    )
    max_lost_s: float = Field(
        1.0, gt=0, le=3600, description="A track not seen for longer than this ends (an `end` event)."
    )
    snapshots: SnapshotsConfig = Field(default_factory=SnapshotsConfig)

    @field_validator("new_track_score")
    @classmethod
    def _scores_in_order(cls, new_track_score: float, info: ValidationInfo) -> float:
        low, high = info.data.get("low_score", 0.1), info.data.get("high_score", 0.5)
        if low > high:
            raise ValueError(f"low_score ({low:g}) is above high_score ({high:g})")
        if new_track_score < high:
            raise ValueError(
                f"new_track_score ({new_track_score:g}) is below high_score ({high:g}): only detections "
                "from high_score start tracks"
            )
        return new_track_score


class SnapshotRetentionConfig(StrictModel):
    """How many snapshots the state dir keeps (<state_dir>/snapshots): the oldest go first."""

    max_count: int = Field(1000, ge=1, le=10_000_000, description="At most this many snapshot files.")
    max_bytes: int = Field(
        256 * 1024 * 1024, ge=1024 * 1024, description="At most this many bytes of snapshot files."
    )


def zones_and_lines(
    zones: Sequence[ZoneConfig], lines: Sequence[LineConfig]
) -> Iterator[tuple[str, int, ZoneConfig | LineConfig]]:
    """(key, index, config) of every zone, then every line: `zones[i]` or `lines[i]` in messages."""
    for i, zone in enumerate(zones):
        yield "zones", i, zone
    for i, line in enumerate(lines):
        yield "lines", i, line


Problems = list[tuple[tuple[str | int, ...], str]]


def analytics_problems(
    zones: list[ZoneConfig],
    lines: list[LineConfig],
    labels: list[str] | None,
    boxes: bool,
    attributes: Sequence[str] = (),
) -> Problems:
    """(key path below the pipeline, message) for what the zones and lines of one pipeline get wrong
    together or with its postprocess: `labels` the postprocess declares (None: not known), `boxes`
    whether it gives boxes with labels (detection, plugin) or without (regions: False); `attributes`
    the names of the pipeline's attributes, which conditions may name."""
    problems: Problems = []
    first: dict[str, str] = {}
    for key, i, item in zones_and_lines(zones, lines):
        if item.name in first:
            taken = f"{item.name!r} is already the name of {first[item.name]}: zones and lines need "
            taken += "names of their own"
            problems.append(((key, i, "name"), taken))
        first.setdefault(item.name, f"{key}[{i}]")
        problems += label_problems((key, i), item.labels or [], labels, boxes)
        for name in item.attributes or {}:
            if name not in attributes:
                problems.append(((key, i, "attributes", name), _unread(name, list(attributes))))
    return problems


def _unread(name: str, attributes: list[str]) -> str:
    if not attributes:
        return f"the pipeline reads no attributes: add an `attributes:` entry named {name!r} to match on"
    close = difflib.get_close_matches(name, attributes, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{name!r} is not one of the pipeline's attributes ({', '.join(attributes)}){hint}"


def label_problems(
    where: tuple[str, int], wanted: list[str], labels: list[str] | None, boxes: bool
) -> Problems:
    if wanted and not boxes:
        return [((*where, "labels"), "a regions postprocess gives no labels to filter on")]
    problems: Problems = []
    for j, label in enumerate(wanted):
        if labels is not None and label not in labels:
            close = difflib.get_close_matches(label, labels, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(
                (
                    (*where, "labels", j),
                    f"{label!r} is not one of postprocess.labels ({', '.join(labels)}){hint}",
                )
            )
    return problems


def model_label_problems(
    zones: list[ZoneConfig],
    lines: list[LineConfig],
    written: list[str] | None,
    watch: list[str],
    model_labels: list[str],
) -> Problems:
    """What a pipeline's labels get wrong against the model's own (`model_labels`, from its manifest
    or its file's metadata: agent/model_labels.py), checked once the model is at hand. `written`:
    the pipeline's own postprocess.labels, which replace the model's (the pipeline validator checks
    names against those); a shorter list leaves classes without a name."""
    if written is not None:
        if len(written) >= len(model_labels):
            return []
        count = f"{len(written)} name{'s' if len(written) != 1 else ''}"
        return [
            (
                ("postprocess", "labels"),
                f"{count} for the model's {len(model_labels)} classes: delete postprocess.labels to use "
                f"the model's own names ({', '.join(model_labels)}), or name all {len(model_labels)} "
                "in the model's order",
            )
        ]
    problems: Problems = []
    for key, i, item in zones_and_lines(zones, lines):
        problems += unknown_labels((key, i, "labels"), item.labels or [], model_labels)
    return problems + unknown_labels(("home_automation", "watch"), watch, model_labels)


def unknown_labels(where: tuple[str | int, ...], wanted: list[str], labels: list[str]) -> Problems:
    problems: Problems = []
    for j, label in enumerate(wanted):
        if label not in labels:
            close = difflib.get_close_matches(label, labels, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            message = f"{label!r} is not one of the model's labels ({', '.join(labels)}){hint}"
            problems.append(((*where, j), message))
    return problems
