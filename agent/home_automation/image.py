"""The annotated image of a detection pipeline: the frame with its boxes drawn, as a bounded JPEG."""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.processing.drawing import draw_boxes, encode_jpeg

_JPEG_QUALITY = 80


def annotated_jpeg(frame: np.ndarray, detections: list[dict[str, Any]], max_bytes: int) -> bytes | None:
    """`frame` (BGR) with each detection's box and label drawn, as JPEG of at most `max_bytes` (scaled
    down until it fits; None when even a quarter-size image does not)."""
    return encode_jpeg(draw_boxes(frame, detections), _JPEG_QUALITY, max_bytes)
