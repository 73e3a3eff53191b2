"""Drawing on frames: boxes with captions, zones and lines, and a size-bounded JPEG. numpy and OpenCV.

Used by the Home Assistant image (agent/home_automation/image.py), the snapshots (agent/snapshots.py)
and `infer --draw`. Images are BGR uint8 (OpenCV's order); boxes are [x1, y1, x2, y2] in the image's
pixels, as the detection postprocessor gives them. The drawing functions return a drawn copy and
leave their input alone (a frame may be shared with other readers).
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from agent.processing.zones import LineShape, ZoneShape

Colour = tuple[int, int, int]  # B, G, R

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
    """'person #12 0.87': the label (the class index without labels), the track id when the entry has
    one, the score when it has one."""
    label = entry.get("label")
    parts = [str(label) if label is not None else str(entry.get("index"))]
    if entry.get("track_id") is not None:
        parts.append(f"#{entry['track_id']}")
    if entry.get("score") is not None:
        parts.append(f"{float(entry['score']):.2f}")
    return " ".join(parts)


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


def _label(
    image: np.ndarray, text: str, x: int, y: int, colour: Colour, scale: float, thickness: int
) -> None:
    """`text` on a filled `colour` background whose bottom-left corner is at (x, y), moved inside
    the image where it would leave it."""
    height, width = image.shape[:2]
    (tw, th), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    pad = max(2, thickness)
    box_w, box_h = tw + 2 * pad, th + baseline + 2 * pad
    x = min(max(x, 0), max(width - box_w, 0))
    y = min(max(y, box_h), height)
    cv2.rectangle(image, (x, y - box_h), (x + box_w, y), colour, cv2.FILLED)
    cv2.putText(image, text, (x + pad, y - pad - baseline), _FONT, scale, _text_colour(colour), thickness,
                cv2.LINE_AA)  # fmt: skip


def draw_boxes(
    image_bgr: np.ndarray,
    entries: Sequence[Mapping[str, Any]],
    *,
    colour: Colour | None = None,
    captions: bool = True,
    thickness: int | None = None,
) -> np.ndarray:
    """A copy of `image_bgr` with each entry's box and caption ('person #12 0.87': `caption_of`).

    An entry with a `track_id` is drawn in that track's colour (`track_colour`), others in `colour`
    (default DEFAULT_COLOUR). The caption sits on a filled strip of the box's colour just above the
    box (inside its top where the box touches the frame's top). Entries without a usable box (none,
    not 4 finite numbers, wholly outside the image) are left out. `thickness` defaults to one that
    suits the image's size."""
    _check_image(image_bgr)
    image = image_bgr.copy()
    height, width = image.shape[:2]
    auto_thickness, scale = _sizes(image)
    line = thickness if thickness is not None else auto_thickness
    text_thickness = max(1, auto_thickness // 2 + auto_thickness % 2)
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
        if captions:
            _label(image, caption_of(entry), min(x1, x2) - line // 2, min(y1, y2) - line // 2 - 1, drawn,
                   scale, text_thickness)  # fmt: skip
    return image


def _outlined_text(image: np.ndarray, text: str, centre: tuple[float, float], colour: Colour, scale: float,
                   thickness: int) -> None:  # fmt: skip
    """`text` centred on `centre`, in `colour` with a dark outline (legible on any background)."""
    (tw, th), _ = cv2.getTextSize(text, _FONT, scale, thickness)
    origin = (round(centre[0] - tw / 2), round(centre[1] + th / 2))
    cv2.putText(image, text, origin, _FONT, scale, (0, 0, 0), thickness + 2, cv2.LINE_AA)
    cv2.putText(image, text, origin, _FONT, scale, colour, thickness, cv2.LINE_AA)


def zone_colour(index: int) -> Colour:
    """The colour of a pipeline's index-th zone or line (a hue sequence of its own, offset from the
    tracks' so a zone and the first tracks do not share a colour)."""
    return track_colour(index + 1000)


def _ints(points: np.ndarray) -> np.ndarray:
    return np.round(np.clip(points, -(2**20), 2**20)).astype(np.int32)


def draw_zones(
    image: np.ndarray, zones: Sequence[ZoneShape], lines: Sequence[LineShape], *, fill_alpha: float = 0.25
) -> np.ndarray:
    """A copy of `image` with each zone's polygon (outlined, filled at `fill_alpha`, its name in the
    middle) and each line (its name at its start; an arrow from its middle towards the side an `in`
    crossing goes to, the `in` name at the arrow's tip and the `out` name on the other side).

    Sides as agent/processing/zones.py defines them: walking from the line's first point to its
    second, `in` crosses from the right to the left."""
    _check_image(image)
    if not 0 <= fill_alpha <= 1:
        raise ValueError(f"fill_alpha {fill_alpha} is not between 0 and 1")
    thickness, scale = _sizes(image)
    out = image.copy()
    if zones:
        overlay = out.copy()
        for i, zone in enumerate(zones):
            cv2.fillPoly(overlay, [_ints(zone.polygon)], zone_colour(i))
        # The fill is see-through; outlines and names go on top at full strength.
        out = cv2.addWeighted(overlay, fill_alpha, out, 1 - fill_alpha, 0)
        for i, zone in enumerate(zones):
            cv2.polylines(out, [_ints(zone.polygon)], True, zone_colour(i), thickness, cv2.LINE_AA)
            cx, cy = zone.polygon.mean(axis=0)
            _outlined_text(out, zone.name, (cx, cy), zone_colour(i), scale, max(1, thickness // 2))
    arrow = max(20.0, max(out.shape[:2]) / 20)
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
        (_, th), _ = cv2.getTextSize(line.directions[0], _FONT, scale, thickness)
        text_thickness = max(1, thickness // 2)
        _outlined_text(
            out, line.directions[0], tuple(mid + normal * (arrow + th)), colour, scale, text_thickness
        )
        _outlined_text(
            out, line.directions[1], tuple(mid - normal * (arrow + th)), colour, scale, text_thickness
        )
        _outlined_text(out, line.name, tuple(start - d / length * th * 2), colour, scale, text_thickness)
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
