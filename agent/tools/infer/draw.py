"""`infer --draw`: the picture the model saw with its boxes and labels drawn, over the pipeline's zones
and lines (each zone with how many of the boxes it holds, each box's anchor point marked), written to
a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.config import LineConfig, ZoneConfig
from agent.errors import EdgeAgentError
from agent.processing.drawing import Labels, anchor_radius, draw_zones, mark_anchor
from agent.processing.zones import LineShape, ZoneShape, anchor_points

# BGR colours of boxes by class index: bright, and far from each other.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (0, 255, 0),  # green
    (255, 0, 255),  # magenta
    (255, 255, 0),  # cyan
    (0, 255, 255),  # yellow
    (0, 128, 255),  # orange
    (255, 128, 0),  # azure
    (128, 0, 255),  # pink
    (0, 0, 255),  # red
)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def box_colour(index: int) -> tuple[int, int, int]:
    return PALETTE[index % len(PALETTE)]


def line_width(image: np.ndarray) -> int:
    """Box lines 2 px wide up to 800 px images, wider on larger ones."""
    return max(2, round(max(image.shape[:2]) / 400))


def draw(
    image: np.ndarray,
    output: Mapping[str, Any],
    zones: Sequence[ZoneConfig] = (),
    lines: Sequence[LineConfig] = (),
) -> tuple[np.ndarray, str]:
    """A copy of `image` with the output drawn (detections and regions: boxes and labels in their
    class colour; classification: the top label) over `zones` and `lines` (a zone coloured by whether
    any box is in it, by its anchor and labels, with how many; each box's anchor point marked), and
    what was drawn."""
    height, width = image.shape[:2]
    zone_shapes = [ZoneShape.from_config(zone, width, height) for zone in zones]
    line_shapes = [LineShape.from_config(line, width, height) for line in lines]
    labels = Labels()
    limits = {zone.name: zone.max_objects for zone in zones}
    entries = output.get("detections", output.get("regions", []))
    canvas = image.copy()
    if zone_shapes or line_shapes:
        canvas = draw_zones(
            canvas, zone_shapes, line_shapes, occupancy=_occupancy(zone_shapes, entries, limits),
            limits=limits, labels=labels,
        )  # fmt: skip
    points = [z.anchor for z in zone_shapes if z.anchor != "box"] + [ln.anchor for ln in line_shapes]
    anchors = list(dict.fromkeys(points))  # the points the zones and lines count by
    drawn = f" over {len(zone_shapes)} zone(s) and {len(line_shapes)} line(s)" if zones or lines else ""
    if "detections" in output:
        for detection in output["detections"]:
            label = detection["label"] if detection["label"] is not None else f"class {detection['index']}"
            caption, colour = f"{label} {detection['score']:.2f}", box_colour(detection["index"])
            _box(canvas, detection["box"], caption, colour, labels, anchors)
        return canvas, f"{len(output['detections'])} detection(s) drawn{drawn}"
    if "regions" in output:
        for region in output["regions"]:
            _box(canvas, region["box"], f"{region['score']:.2f}", box_colour(0), labels, anchors)
        return canvas, f"{len(output['regions'])} region(s) drawn{drawn}"
    if output.get("top"):
        top = output["top"][0]
        label = top["label"] if top["label"] is not None else f"class {top['index']}"
        _banner(canvas, f"{label} {top['score']:.2f}")
        return canvas, f"top label {label!r} written{drawn}"
    if drawn:
        return canvas, f"nothing to draw for this output: the image with its{drawn[5:]}"
    return canvas, "nothing to draw for this output: the image is as it came"


def _occupancy(
    zones: Sequence[ZoneShape], entries: Sequence[Mapping[str, Any]], limits: Mapping[str, int | None]
) -> dict[str, dict[str, Any]]:
    """How many of the boxes each zone holds (its anchor, its labels), as a tracking pipeline counts
    them on one frame (no min_frames: one frame is all there is), and whether that is more than its
    max_objects."""
    boxes = [entry["box"] for entry in entries]
    occupancy: dict[str, dict[str, Any]] = {}
    for zone in zones:
        wanted = [zone.labels is None or entry.get("label") in zone.labels for entry in entries]
        inside = zone.contains(np.asarray(boxes, np.float64).reshape(-1, 4)) if boxes else np.zeros(0, bool)
        count = int(np.sum(inside & np.asarray(wanted, bool)))
        limit = limits.get(zone.name)
        occupancy[zone.name] = {"count": count, "overcrowded": limit is not None and count > limit}
    return occupancy


def _text_size(image: np.ndarray) -> tuple[float, int]:
    scale = max(0.5, max(image.shape[:2]) / 1000)
    return scale, max(1, round(scale * 2))


def _box(
    image: np.ndarray,
    box: Sequence[float],
    label: str,
    colour: tuple[int, int, int],
    labels: Labels | None = None,
    anchors: Sequence[str] = (),
) -> None:
    x1, y1, x2, y2 = (round(float(v)) for v in box)
    width = line_width(image)
    cv2.rectangle(image, (x1, y1), (x2, y2), colour, width)
    for anchor in anchors:
        mark_anchor(image, anchor_points([box], anchor)[0], colour, anchor_radius(image))  # type: ignore[arg-type]
    scale, thickness = _text_size(image)
    (text_w, text_h), baseline = cv2.getTextSize(label, _FONT, scale, thickness)
    box_w, box_h = text_w + 2 * width, text_h + baseline + 2 * width
    top = y1 - box_h
    if top < 0:  # no room above: inside, under the top edge
        top = y1
    # Where another label is, beside it instead (`Labels`).
    placed = labels if labels is not None else Labels()
    left, top, right, bottom = placed.place(label, x1, top, box_w, box_h, image.shape[1], image.shape[0])
    cv2.rectangle(image, (left, top), (right, bottom), colour, cv2.FILLED)
    origin = (left + width, top + text_h + width)
    cv2.putText(image, label, origin, _FONT, scale, (0, 0, 0), thickness, cv2.LINE_AA)


def _banner(image: np.ndarray, text: str) -> None:
    scale, thickness = _text_size(image)
    (text_w, text_h), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    pad = 4
    cv2.rectangle(image, (0, 0), (text_w + 2 * pad, text_h + baseline + 2 * pad), (0, 0, 0), cv2.FILLED)
    cv2.putText(image, text, (pad, pad + text_h), _FONT, scale, (255, 255, 255), thickness, cv2.LINE_AA)


def check_picture_path(path: Path) -> None:
    """EdgeAgentError unless an image can be written at `path` (checked before the model runs)."""
    if not cv2.haveImageWriter(str(path)):
        raise EdgeAgentError(
            f"--draw {path}: OpenCV writes no such image type", hint="use a .jpg or .png name"
        )
    if not path.parent.is_dir():
        raise EdgeAgentError(f"--draw {path}: folder {path.parent} does not exist")


def write_picture(path: Path, image: np.ndarray) -> None:
    """Write an image file (its type by suffix: .jpg at quality 95, .png, ...); EdgeAgentError when
    it cannot be."""
    check_picture_path(path)
    write_image(path, image, "--draw", quality=95)


def write_image(path: Path, image: np.ndarray, option: str, quality: int) -> None:
    """cv2.imwrite (a .jpg at `quality`), its failure an EdgeAgentError naming the `option` that
    asked for the file."""
    try:
        written = cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    except cv2.error as exc:
        raise EdgeAgentError(f"{option} {path}: cannot write it: {exc}") from None
    if not written:
        raise EdgeAgentError(f"{option} {path}: cannot write it (permissions?)")
