"""`infer --draw`: the picture the model saw with its boxes and labels drawn, written to a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.errors import EdgeAgentError

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


def draw(image: np.ndarray, output: Mapping[str, Any]) -> tuple[np.ndarray, str]:
    """A copy of `image` with the output drawn (detections and regions: boxes and labels in their
    class colour; classification: the top label), and what was drawn."""
    canvas = image.copy()
    if "detections" in output:
        for detection in output["detections"]:
            label = detection["label"] if detection["label"] is not None else f"class {detection['index']}"
            _box(
                canvas, detection["box"], f"{label} {detection['score']:.2f}", box_colour(detection["index"])
            )
        return canvas, f"{len(output['detections'])} detection(s) drawn"
    if "regions" in output:
        for region in output["regions"]:
            _box(canvas, region["box"], f"{region['score']:.2f}", box_colour(0))
        return canvas, f"{len(output['regions'])} region(s) drawn"
    if output.get("top"):
        top = output["top"][0]
        label = top["label"] if top["label"] is not None else f"class {top['index']}"
        _banner(canvas, f"{label} {top['score']:.2f}")
        return canvas, f"top label {label!r} written"
    return canvas, "nothing to draw for this output: the image is as it came"


def _text_size(image: np.ndarray) -> tuple[float, int]:
    scale = max(0.5, max(image.shape[:2]) / 1000)
    return scale, max(1, round(scale * 2))


def _box(image: np.ndarray, box: Sequence[float], label: str, colour: tuple[int, int, int]) -> None:
    x1, y1, x2, y2 = (round(float(v)) for v in box)
    width = line_width(image)
    cv2.rectangle(image, (x1, y1), (x2, y2), colour, width)
    scale, thickness = _text_size(image)
    (text_w, text_h), baseline = cv2.getTextSize(label, _FONT, scale, thickness)
    top = y1 - text_h - baseline - 2 * width
    if top < 0:  # no room above: inside, under the top edge
        top = y1
    right = x1 + text_w + 2 * width
    cv2.rectangle(image, (x1, top), (right, top + text_h + baseline + 2 * width), colour, cv2.FILLED)
    origin = (x1 + width, top + text_h + width)
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
    try:
        written = cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    except cv2.error as exc:
        raise EdgeAgentError(f"--draw {path}: cannot write it: {exc}") from None
    if not written:
        raise EdgeAgentError(f"--draw {path}: cannot write it (permissions?)")
