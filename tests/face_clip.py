"""A clip rendered for the tracking tests (tests/test_infer_track.py, test_status_tracking.py): a real
photo's face (the astronaut's) moving left to right across the frame over MOVING frames, then GONE frames
without it; where the face is in each frame; and the YOLOv8n face detector's pipeline over it with a zone
(the right part) and a line (down the middle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from tests.media_fixtures import FACE_BOX, astronaut_bgr

WIDTH, HEIGHT, FPS = 480, 320, 10
MOVING, GONE = 30, 15  # frames with the face moving across, then frames without it
HEAD = (30, 250, 120, 330)  # the photo's rows y0:y1 and columns x0:x1 pasted into the clip
TOP = 50  # the row the head's top is pasted at
ZONE_X = 0.65  # the zone: the right part of the frame from here
LINE_X = 0.5  # the line: down the middle


def head_left(frame: int) -> int:
    """The column the head's left edge is pasted at in a frame where it is there."""
    return round(frame * (WIDTH - (HEAD[3] - HEAD[2])) / (MOVING - 1))


def face_box(frame: int) -> np.ndarray:
    """Where the face (MODELS.md's box in the photo) is in the clip's frame."""
    dx, dy = head_left(frame) - HEAD[2], TOP - HEAD[0]
    return FACE_BOX + np.array([dx, dy, dx, dy], dtype=np.float64)


def first_frame_past(x: float) -> int:
    """The first frame whose face's centre is right of column x."""
    return next(i for i in range(MOVING) if (face_box(i)[0] + face_box(i)[2]) / 2 > x)


def write_clip(path: Path) -> Path:
    """The clip: the photo's head moving left to right over MOVING frames, then GONE frames without it."""
    head = astronaut_bgr()[HEAD[0] : HEAD[1], HEAD[2] : HEAD[3]]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    assert writer.isOpened()
    try:
        for i in range(MOVING + GONE):
            frame = np.full((HEIGHT, WIDTH, 3), 90, np.uint8)
            if i < MOVING:
                x = head_left(i)
                frame[TOP : TOP + head.shape[0], x : x + head.shape[1]] = head
            writer.write(frame)
    finally:
        writer.release()
    return path


def faces_pipeline(yolo_path: Path, labels: list[str], source: dict[str, Any]) -> dict[str, Any]:
    """The detector as the Home Assistant test runs it, with a zone (the right part) and a line (down
    the middle, `eastbound` from left to right)."""
    return {
        "name": "faces",
        "model": {"path": str(yolo_path)},
        "source": source,
        "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": labels},
        "zones": [
            {"name": "right", "points": [[ZONE_X, 0], [1, 0], [1, 1], [ZONE_X, 1]], "anchor": "center"}
        ],
        "lines": [
            {
                "name": "middle",
                "points": [[LINE_X, 0], [LINE_X, 1]],  # walking down it, `in` is from left to right
                "in": "eastbound",
                "out": "westbound",
                "anchor": "center",
            }
        ],
    }
