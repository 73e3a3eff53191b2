#!/usr/bin/env python3
"""Render the demo's input video: text signs shown upright or upside down, with ground truth.

The PP-OCR text-direction classifier (a real trained model from the rapidocr-onnxruntime
wheel) tells upright text from text rotated by 180 degrees; this video gives it both, and
the truth file says which is on screen when, so the demo and the tests can check the
agent's answers. Usage: make_demo_video.py OUT.mp4 [--truth OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np

# (sign text, shown upside down?) in screen order.
SIGNS: list[tuple[str, bool]] = [
    ("EDGE CAMERA 42", False),
    ("Gate B open", True),
    ("Parking bay 7", False),
    ("EXIT ONLY", True),
    ("Bike rack 4", False),
    ("Loading dock 3", True),
]
# A camera framed tight on one line of text: the classifier is trained on text-line crops
# (as a text detector cuts them), and wide empty margins make it unsure.
WIDTH, HEIGHT = 320, 80
FONT, THICKNESS = cv2.FONT_HERSHEY_SIMPLEX, 2


def render_sign(text: str, upside_down: bool, rng: np.random.Generator) -> np.ndarray:
    image = np.full((HEIGHT, WIDTH, 3), 235, np.uint8)
    (unit_w, unit_h), _ = cv2.getTextSize(text, FONT, 1.0, THICKNESS)
    scale = min(0.9 * WIDTH / unit_w, 0.6 * HEIGHT / unit_h)  # the text fills about 90% of the width
    (tw, th), _ = cv2.getTextSize(text, FONT, scale, THICKNESS)
    x = max(2, (WIDTH - tw) // 2 + int(rng.integers(-5, 6)))
    y = (HEIGHT + th) // 2 + int(rng.integers(-3, 4))
    cv2.putText(image, text, (x, y), FONT, scale, (20, 20, 20), THICKNESS, cv2.LINE_AA)
    if upside_down:
        image = cv2.rotate(image, cv2.ROTATE_180)
    # Sensor noise, so the model sees camera-like pixels rather than a clean rendering.
    noise = rng.normal(0, 4, image.shape)
    return np.clip(image.astype(np.float32) + noise, 0, 255).astype(np.uint8)


def make_orientation_video(
    path: Path, fps: int = 10, seconds_per_sign: float = 1.5
) -> list[dict[str, object]]:
    """Write the video; return its ground truth: one entry per sign with start_s/end_s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    rng = np.random.default_rng(42)
    frames_per_sign = round(fps * seconds_per_sign)
    truth = []
    for number, (text, upside_down) in enumerate(SIGNS):
        for _ in range(frames_per_sign):
            writer.write(render_sign(text, upside_down, rng))
        start = number * frames_per_sign / fps
        truth.append(
            {
                "start_s": start,
                "end_s": start + frames_per_sign / fps,
                "text": text,
                "orientation": "upside-down" if upside_down else "upright",
            }
        )
    writer.release()
    return truth


def truth_at(truth: list[dict[str, object]], position_s: float) -> dict[str, object] | None:
    """The sign on screen at a video position."""
    for entry in truth:
        if float(entry["start_s"]) <= position_s < float(entry["end_s"]):  # type: ignore[arg-type]
            return entry
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--truth", type=Path, help="Write the ground truth JSON here.")
    parser.add_argument("--fps", type=int, default=10)
    args = parser.parse_args()
    truth = make_orientation_video(args.out, fps=args.fps)
    if args.truth:
        args.truth.write_text(json.dumps(truth, indent=2))
    print(f"wrote {args.out}: {len(truth)} signs, {truth[-1]['end_s']:.1f} s")


if __name__ == "__main__":
    main()
