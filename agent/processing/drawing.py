"""Drawing on frames: boxes with captions, zones and lines, and a size-bounded JPEG. numpy and OpenCV.

Used by the Home Assistant image (agent/home_automation/image.py), the snapshots (agent/snapshots.py),
`infer --draw` and `source --save`. Images are BGR uint8 (OpenCV's order); boxes are [x1, y1, x2, y2]
in the image's pixels, as the detection postprocessor gives them. The drawing functions return a drawn
copy and leave their input alone (a frame may be shared with other readers).

A drawn frame explains itself: each object's anchor point (the point a zone or line counts) is
marked, a zone is coloured by its state (empty, occupied, overcrowded) with its live count, a line
shows its count per direction, and no label covers another or a line's arrowhead (`Labels`).
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from agent.processing.scene import label_of
from agent.processing.zones import LineShape, ZoneShape, anchor_points

Colour = tuple[int, int, int]  # B, G, R
Rect = tuple[int, int, int, int]  # x1, y1, x2, y2 (x2, y2 excluded)

# Boxes without a track id: the amber the Home Assistant image has always used.
DEFAULT_COLOUR: Colour = (0, 200, 255)
_GOLDEN = (math.sqrt(5) - 1) / 2  # hue step: consecutive ids land far apart on the colour wheel
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def track_colour(track_id: int) -> Colour:
    """A bright colour of its own for a track id: the same on every frame and run, and consecutive ids
    (the usual neighbours on screen) far apart in hue."""
    hue = (int(track_id) * _GOLDEN) % 1.0
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, 1.0)
    return round(b * 255), round(g * 255), round(r * 255)


def caption_of(entry: Mapping[str, Any]) -> str:
    """'person #12 0.87': the label (the class index without labels, 'object' for a region: as zones
    and events name it, `label_of`), the track id when the entry has one, the score when it has one;
    then what second models read on the object, when it carries `attributes` ('object #3 0.91 |
    direction: 180; text: GATE 42': `attributes_text`)."""
    parts = [label_of(entry)]
    if entry.get("track_id") is not None:
        parts.append(f"#{entry['track_id']}")
    if entry.get("score") is not None:
        parts.append(f"{float(entry['score']):.2f}")
    read = attributes_text(entry.get("attributes"))
    return " ".join(parts) + (f" | {read}" if read else "")


def attributes_text(attributes: Any) -> str:
    """An object's attributes in a caption: 'direction: 180; text: GATE 42' (a vector as its length;
    what OpenCV's font cannot draw as '?'). Each attribute is {value, score, ...} as objects carry it
    (agent/processing/scene.py), or the bare value."""
    if not isinstance(attributes, Mapping):
        return ""
    shown = []
    for name, attribute in attributes.items():
        value = attribute.get("value") if isinstance(attribute, Mapping) else attribute
        if isinstance(value, list | tuple):
            text = f"[{len(value)} values]"
        else:
            text = "".join(c if " " <= c <= "~" else "?" for c in str(value))
        shown.append(f"{name}: {text}")
    return "; ".join(shown)


def _sizes(image: np.ndarray) -> tuple[int, float]:
    """Line thickness and font scale for the image's size, so a 4K frame's drawing is as legible
    scaled down as a VGA one's."""
    longest = max(image.shape[:2])
    return max(1, round(longest / 400)), max(0.4, longest / 1200)


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.size == 0:
        what = f"{image.dtype} array" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"cannot draw on a {what} of shape {getattr(image, 'shape', '?')}: need uint8 BGR")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"cannot draw on an image of shape {image.shape}: need height x width x 3 (BGR)")


def _pixel_box(box: Any, width: int, height: int) -> tuple[int, int, int, int] | None:
    """The box as whole pixels, or None when it is not 4 finite numbers. Clamped a little beyond the
    frame: OpenCV takes 32-bit ints, and an edge outside the frame must stay outside."""
    try:
        values = [float(v) for v in box]
    except (TypeError, ValueError):
        return None
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        return None
    x1, y1, x2, y2 = values
    pad = 16
    return (
        round(min(max(x1, -pad), width + pad)),
        round(min(max(y1, -pad), height + pad)),
        round(min(max(x2, -pad), width + pad)),
        round(min(max(y2, -pad), height + pad)),
    )


def _text_colour(background: Colour) -> Colour:
    """Black on light colours, white on dark ones."""
    b, g, r = background
    return (0, 0, 0) if 0.114 * b + 0.587 * g + 0.299 * r > 140 else (255, 255, 255)


class Labels:
    """Where the labels of one picture went: each new label is placed near where it was asked for,
    where it covers no earlier label and no area kept clear (a line's arrowhead). Share one between
    `draw_zones` and `draw_boxes` so a caption does not cover a zone's name either."""

    # Tried in order of distance from the place asked for: up to this many label sizes away.
    _REACH_X, _REACH_Y = 3, 6

    def __init__(self) -> None:
        self.placed: list[tuple[str, Rect]] = []  # text, rectangle: what `place` gave, in order
        self.clear: list[Rect] = []

    def keep_clear(self, rect: Rect) -> None:
        self.clear.append(rect)

    def place(self, text: str, x: int, y: int, w: int, h: int, width: int, height: int) -> Rect:
        """A w x h rectangle inside the width x height picture, its top-left corner as near (x, y) as
        there is room for; where every place within reach is taken, the one asked for."""
        taken = [rect for _, rect in self.placed] + self.clear
        offsets = sorted(
            ((dx * (w // 2 + 1), dy * (h + 1)) for dx in range(-self._REACH_X, self._REACH_X + 1)
             for dy in range(-self._REACH_Y, self._REACH_Y + 1)),
            key=lambda o: (o[0] / max(w, 1)) ** 2 + (o[1] / max(h, 1)) ** 2,
        )  # fmt: skip
        first: Rect | None = None
        for dx, dy in offsets:
            left = min(max(x + dx, 0), max(width - w, 0))
            top = min(max(y + dy, 0), max(height - h, 0))
            rect = (left, top, left + w, top + h)
            if first is None:
                first = rect
            if not any(_overlaps(rect, other) for other in taken):
                break
        else:
            rect = first if first is not None else (x, y, x + w, y + h)
        self.placed.append((text, rect))
        return rect


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label(
    image: np.ndarray,
    text: str,
    x: int,
    y: int,
    colour: Colour,
    scale: float,
    thickness: int,
    labels: Labels | None = None,
) -> Rect:
    """`text` on a filled `colour` background whose bottom-left corner is at (x, y), moved inside
    the image where it would leave it (and, with `labels`, off the labels placed before); its
    rectangle."""
    height, width = image.shape[:2]
    (tw, th), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    pad = max(2, thickness)
    box_w, box_h = tw + 2 * pad, th + baseline + 2 * pad
    if labels is None:
        labels = Labels()
    x1, y1, x2, y2 = labels.place(text, x, y - box_h, box_w, box_h, width, height)
    cv2.rectangle(image, (x1, y1), (x2 - 1, y2 - 1), colour, cv2.FILLED)
    cv2.putText(image, text, (x1 + pad, y2 - pad - baseline), _FONT, scale, _text_colour(colour), thickness,
                cv2.LINE_AA)  # fmt: skip
    return x1, y1, x2, y2


def mark_anchor(image: np.ndarray, point: Sequence[float], colour: Colour, radius: int) -> None:
    """A dot in `colour` ringed in black and white at `point` (in place): the point of an object a
    zone or a line counts, legible on any background."""
    centre = (round(float(point[0])), round(float(point[1])))
    cv2.circle(image, centre, radius + 2, (255, 255, 255), cv2.FILLED, cv2.LINE_AA)
    cv2.circle(image, centre, radius + 1, (0, 0, 0), cv2.FILLED, cv2.LINE_AA)
    cv2.circle(image, centre, radius, colour, cv2.FILLED, cv2.LINE_AA)


def anchor_radius(image: np.ndarray) -> int:
    return max(3, _sizes(image)[0] + 2)


def draw_boxes(
    image_bgr: np.ndarray,
    entries: Sequence[Mapping[str, Any]],
    *,
    colour: Colour | None = None,
    captions: bool = True,
    thickness: int | None = None,
    anchors: Sequence[str] = (),
    labels: Labels | None = None,
) -> np.ndarray:
    """A copy of `image_bgr` with each entry's box and caption ('person #12 0.87': `caption_of`).

    An entry with a `track_id` is drawn in that track's colour (`track_colour`), others in `colour`
    (default DEFAULT_COLOUR). The caption sits on a filled strip of the box's colour just above the
    box (inside its top where the box touches the frame's top), moved where it would cover another
    caption (or a label of `labels`). `anchors` ("bottom_center", "center": those the pipeline's
    zones and lines count by) are marked on each box (`mark_anchor`). Entries without a usable box
    (none, not 4 finite numbers, wholly outside the image) are left out. `thickness` defaults to
    one that suits the image's size."""
    _check_image(image_bgr)
    image = image_bgr.copy()
    height, width = image.shape[:2]
    auto_thickness, scale = _sizes(image)
    line = thickness if thickness is not None else auto_thickness
    text_thickness = max(1, auto_thickness // 2 + auto_thickness % 2)
    placed = labels if labels is not None else Labels()
    kept: list[tuple[tuple[int, int, int, int], Colour, str]] = []
    for entry in entries:
        box = _pixel_box(entry.get("box"), width, height)
        if box is None:
            continue
        x1, y1, x2, y2 = box
        if max(x1, x2) < 0 or max(y1, y2) < 0 or min(x1, x2) >= width or min(y1, y2) >= height:
            continue  # wholly outside: its caption, pulled into the frame, would point at nothing
        track_id = entry.get("track_id")
        drawn = track_colour(track_id) if track_id is not None else (colour or DEFAULT_COLOUR)
        cv2.rectangle(image, (x1, y1), (x2, y2), drawn, line)
        kept.append((box, drawn, caption_of(entry)))
    # Anchors over every box's lines, captions over everything: none is hidden by a later box.
    radius = anchor_radius(image)
    for anchor in dict.fromkeys(a for a in anchors if a in ("bottom_center", "center")):
        for box, drawn, _ in kept:
            mark_anchor(image, anchor_points([box], anchor)[0], drawn, radius)  # type: ignore[arg-type]
    if captions:
        for (x1, y1, x2, y2), drawn, text in kept:
            _label(image, text, min(x1, x2) - line // 2, min(y1, y2) - line // 2 - 1, drawn, scale,
                   text_thickness, placed)  # fmt: skip
    return image


def zone_colour(index: int) -> Colour:
    """The colour of a pipeline's index-th zone or line (a hue sequence of its own, offset from the
    tracks' so a zone and the first tracks do not share a colour)."""
    return track_colour(index + 1000)


# A zone's colour by its state, where the state is known (`infer --track`): blue when empty, green
# when occupied, red when overcrowded (the scene's own verdict, as its events say).
ZONE_STATE_COLOURS: dict[str, Colour] = {
    "empty": (230, 150, 40),
    "occupied": (60, 200, 60),
    "overcrowded": (40, 40, 235),
}


def zone_state(occupancy: Mapping[str, Any] | None) -> str:
    """empty, occupied or overcrowded, from a zone's entry of `Scene.summary()["zones"]`."""
    if not occupancy:
        return "empty"
    if occupancy.get("overcrowded"):
        return "overcrowded"
    return "occupied" if int(occupancy.get("count") or 0) > 0 else "empty"


def _ints(points: np.ndarray) -> np.ndarray:
    return np.round(np.clip(points, -(2**20), 2**20)).astype(np.int32)


def _label_at(
    image: np.ndarray,
    text: str,
    centre: Sequence[float] | np.ndarray,
    colour: Colour,
    scale: float,
    thickness: int,
    labels: Labels,
) -> Rect:
    """A label (`_label`) centred on `centre`, where there is room."""
    (tw, th), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    pad = max(2, thickness)
    x = round(float(centre[0]) - (tw + 2 * pad) / 2)
    y = round(float(centre[1]) + (th + baseline + 2 * pad) / 2)
    return _label(image, text, x, y, colour, scale, thickness, labels)


def draw_zones(
    image: np.ndarray,
    zones: Sequence[ZoneShape],
    lines: Sequence[LineShape],
    *,
    fill_alpha: float = 0.25,
    occupancy: Mapping[str, Mapping[str, Any]] | None = None,
    limits: Mapping[str, int | None] | None = None,
    counts: Mapping[str, Mapping[str, int]] | None = None,
    labels: Labels | None = None,
) -> np.ndarray:
    """A copy of `image` with each zone's polygon (outlined, filled at `fill_alpha`, its name on its
    top edge, away from the people inside) and each line (its name at its start; an arrow from its
    middle towards the side an `in` crossing goes to, the `in` name beyond the arrow's tip and the
    `out` name on the other side).

    With `occupancy` (`Scene.summary()["zones"]`), a zone is coloured by its state (`zone_state`:
    ZONE_STATE_COLOURS) and its label says how many are in it (`2/3` with `limits`, the zones'
    `max_objects`); without, each zone has its own colour (`zone_colour`). With `counts`
    (`Scene.summary()["lines"]`), each direction's name carries its count. Labels never cover each
    other nor an arrowhead (`labels`, shared with `draw_boxes`, keeps their places).

    Sides as agent/processing/zones.py defines them: walking from the line's first point to its
    second, `in` crosses from the right to the left."""
    _check_image(image)
    if not 0 <= fill_alpha <= 1:
        raise ValueError(f"fill_alpha {fill_alpha} is not between 0 and 1")
    thickness, scale = _sizes(image)
    text_thickness = max(1, thickness // 2)
    placed = labels if labels is not None else Labels()
    out = image.copy()
    zone_colours = [
        ZONE_STATE_COLOURS[zone_state(occupancy.get(zone.name))] if occupancy is not None else zone_colour(i)
        for i, zone in enumerate(zones)
    ]
    if zones:
        overlay = out.copy()
        for zone, colour in zip(zones, zone_colours, strict=True):
            cv2.fillPoly(overlay, [_ints(zone.polygon)], colour)
        # The fill is see-through; outlines and names go on top at full strength.
        out = cv2.addWeighted(overlay, fill_alpha, out, 1 - fill_alpha, 0)
        for zone, colour in zip(zones, zone_colours, strict=True):
            cv2.polylines(out, [_ints(zone.polygon)], True, colour, thickness, cv2.LINE_AA)
    arrow = max(20.0, max(out.shape[:2]) / 20)
    drawn_lines = []
    for j, line in enumerate(lines):
        colour = zone_colour(len(zones) + j)
        start, end = np.asarray(line.start, np.float64), np.asarray(line.end, np.float64)
        cv2.line(out, tuple(_ints(start)), tuple(_ints(end)), colour, thickness, cv2.LINE_AA)
        d = end - start
        length = float(np.hypot(d[0], d[1]))
        if length == 0:
            continue
        # y grows downwards, so (dy, -dx) points to the walker's left: the `in` side.
        normal = np.array([d[1], -d[0]]) / length
        mid = (start + end) / 2
        tip = mid + normal * arrow
        cv2.arrowedLine(out, tuple(_ints(mid)), tuple(_ints(tip)), colour, thickness, cv2.LINE_AA,
                        tipLength=0.3)  # fmt: skip
        head = 0.3 * arrow + 2 * thickness  # the arrowhead's reach around its tip: no label there
        placed.keep_clear(
            (
                math.floor(min(mid[0], tip[0]) - head),
                math.floor(min(mid[1], tip[1]) - head),
                math.ceil(max(mid[0], tip[0]) + head),
                math.ceil(max(mid[1], tip[1]) + head),
            )
        )
        drawn_lines.append((line, colour, start, d / length, mid, normal))
    # Labels last, zones' first: they claim their places before the lines' (and the boxes' after).
    for zone, colour in zip(zones, zone_colours, strict=True):
        text = zone.name
        if occupancy is not None:
            count = int((occupancy.get(zone.name) or {}).get("count") or 0)
            limit = (limits or {}).get(zone.name)
            text = f"{zone.name} {count}" + (f"/{limit}" if limit is not None else "")
        # On the zone's top edge (its topmost corner, the leftmost of equals): people stand lower.
        top = min(range(len(zone.polygon)), key=lambda k: (zone.polygon[k][1], zone.polygon[k][0]))
        x, y = zone.polygon[top]
        _label(out, text, round(float(x)), round(float(y)), colour, scale, text_thickness, placed)
    for line, colour, start, along, mid, normal in drawn_lines:
        (_, th), _ = cv2.getTextSize(line.name, _FONT, scale, text_thickness)
        seen = (counts or {}).get(line.name)
        names = [f"{name} {seen.get(name, 0)}" if seen is not None else name for name in line.directions]
        _label_at(out, names[0], mid + normal * (arrow + 2 * th), colour, scale, text_thickness, placed)
        _label_at(out, names[1], mid - normal * (arrow + 2 * th), colour, scale, text_thickness, placed)
        _label_at(out, line.name, start - along * th * 2, colour, scale, text_thickness, placed)
    return out


def draw_scene(
    image: np.ndarray,
    entries: Sequence[Mapping[str, Any]],
    zones: Sequence[ZoneShape],
    lines: Sequence[LineShape],
    *,
    occupancy: Mapping[str, Mapping[str, Any]] | None = None,
    limits: Mapping[str, int | None] | None = None,
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> np.ndarray:
    """A frame of a tracking pipeline: its zones and lines (`draw_zones`, by state and count), then
    the boxes with their captions and the anchor points the zones and lines count by (`draw_boxes`),
    no label covering another."""
    labels = Labels()
    anchors = [zone.anchor for zone in zones] + [line.anchor for line in lines]
    canvas = image
    if zones or lines:
        canvas = draw_zones(
            image, zones, lines, occupancy=occupancy, limits=limits, counts=counts, labels=labels
        )
    return draw_boxes(canvas, entries, anchors=anchors, labels=labels)


# Where the motion gate saw movement: a thin grey-white outline, quieter than any box.
MOTION_COLOUR: Colour = (200, 200, 200)


def draw_motion_areas(image: np.ndarray, areas: Sequence[Sequence[int]]) -> np.ndarray:
    """A copy of `image` with each motion area (x1, y1, x2, y2 in its pixels: `FrameRecord.motion_areas`)
    outlined thinly in MOTION_COLOUR; draw it first, the boxes and zones go over it."""
    _check_image(image)
    out = image.copy()
    thickness = max(1, _sizes(out)[0] // 2)
    for x1, y1, x2, y2 in areas:
        cv2.rectangle(out, (int(x1), int(y1)), (int(x2) - 1, int(y2) - 1), MOTION_COLOUR, thickness)
    return out


GRID_STEP = 0.1  # `draw_grid`: a line every tenth of the width and of the height


def draw_grid(image: np.ndarray, step: float = GRID_STEP) -> np.ndarray:
    """A copy of `image` with a grid of fraction coordinates (the `units: fraction` a zone's points
    are given in): a thin line every `step` of the width and of the height, each labelled with its
    fraction along the top (x) and the left (y) edge."""
    _check_image(image)
    if not 0 < step < 1:
        raise ValueError(f"grid step {step} is not between 0 and 1")
    height, width = image.shape[:2]
    overlay = image.copy()
    marks = [round(k * step, 6) for k in range(1, math.ceil(1 / step - 1e-9))]
    for f in marks:
        x, y = round(f * width), round(f * height)
        cv2.line(overlay, (x, 0), (x, height - 1), (255, 255, 255), 1)
        cv2.line(overlay, (0, y), (width - 1, y), (255, 255, 255), 1)
    out = cv2.addWeighted(overlay, 0.5, image, 0.5, 0)  # see-through: the picture stays legible
    _, scale = _sizes(image)
    scale *= 0.8
    placed = Labels()
    for f in marks:
        text = f"{f:g}"
        (tw, _), _ = cv2.getTextSize(text, _FONT, scale, 1)
        _label(out, text, round(f * width - tw / 2) - 2, 0, (40, 40, 40), scale, 1, placed)
        _label_at(out, text, (tw / 2 + 4, f * height), (40, 40, 40), scale, 1, placed)
    return out


def encode_jpeg(image: np.ndarray, quality: int, max_bytes: int | None = None) -> bytes | None:
    """`image` (BGR uint8) as JPEG at `quality` (1-100). With `max_bytes`: scaled down to a half, then
    a quarter, until it fits; None when even the quarter does not (or the image is too small to
    halve). Raises ValueError on an image or quality it cannot encode."""
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality {quality} is not between 1 and 100")
    if (
        not isinstance(image, np.ndarray)
        or image.dtype != np.uint8
        or image.size == 0
        or image.ndim not in (2, 3)
    ):
        raise ValueError(f"cannot encode {getattr(image, 'shape', type(image).__name__)} as JPEG: need uint8")
    height, width = image.shape[:2]
    for shrink in (1, 2, 4) if max_bytes is not None else (1,):
        if width // shrink < 1 or height // shrink < 1:
            break
        scaled = image if shrink == 1 else cv2.resize(image, (width // shrink, height // shrink),
                                                      interpolation=cv2.INTER_AREA)  # fmt: skip
        ok, data = cv2.imencode(".jpg", scaled, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {scaled.shape} image as JPEG")
        if max_bytes is None or len(data) <= max_bytes:
            return bytes(data)
    return None
