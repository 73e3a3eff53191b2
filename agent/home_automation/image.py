"""The annotated image of a detection pipeline: the frame with its boxes drawn, as a bounded JPEG."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from agent.home_automation.views import label_of

_JPEG_QUALITY = 80


def annotated_jpeg(frame: np.ndarray, detections: list[dict[str, Any]], max_bytes: int) -> bytes | None:
    """`frame` (BGR) with each detection's box and label drawn, as JPEG of at most `max_bytes` (scaled
    down until it fits; None when even a quarter-size image does not)."""
    image = frame.copy()
    height, width = image.shape[:2]
    thickness = max(1, round(max(width, height) / 400))
    scale = max(0.4, max(width, height) / 1200)
    for d in detections:
        x1, y1, x2, y2 = (round(float(v)) for v in d.get("box", (0, 0, 0, 0)))
        cv2.rectangle(image, (x1, y1), (x2, y2), (0, 200, 255), thickness)
        text = f"{label_of(d)} {float(d.get('score', 0.0)):.2f}"
        cv2.putText(image, text, (x1, max(y1 - 4, 12)), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 200, 255),
                    thickness, cv2.LINE_AA)  # fmt: skip
    for shrink in (1, 2, 4):
        scaled = image if shrink == 1 else cv2.resize(image, (width // shrink, height // shrink))
        ok, data = cv2.imencode(".jpg", scaled, [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY])
        if ok and len(data) <= max_bytes:
            return bytes(data)
    return None
