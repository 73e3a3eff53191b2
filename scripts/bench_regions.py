#!/usr/bin/env python3
"""Motion regions against the whole frame, on small faces: how many each finds, and what it costs.

A rendered 1280x720 clip (a textured wall, so the picture is not flat) with FACES small faces (the
astronaut's, ~36 px wide: scripts/make_tracking_video.py) spread over the frame, each moving a little
every frame. The real YOLOv8n face detector of the nudenet wheel (320n.onnx, dynamic input size) runs
through a real pipeline three ways over the same clip:

    full resolution   the whole frame at 1280x736 (the model's input is dynamic): the reference
    letterbox         the whole frame letterboxed into 320x320, as a 320 model usually runs (4x smaller)
    regions           the motion gate on, `motion.regions: true`: 320x320 crops around what moved
                      (and here only, once more with the crops one run each instead of one batch)

A face is found in a frame when a face detection overlaps its true box by IoU >= MATCH_IOU. The first
frame is left out of every count: the gate has no background before it (it runs the whole frame).
tests/test_motion_regions_clip.py asserts what docs/performance.md ("Regions") reports from here.

Usage: bench_regions.py [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
from skimage import data as skimage_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import make_tracking_video as tracking_video

from agent.config import PipelineConfig
from agent.pipeline import Pipeline
from agent.stage import LoadedModel
from providers import ModelArtifact, Session, get_backend
from tests.media_fixtures import ListSink
from tests.waits import wait_until

WIDTH, HEIGHT, FPS = 1280, 720, 10
FACE_SCALE = 0.36  # the photo's 101-px face becomes ~36 px wide (9 px in a 320 letterbox of the frame)
MATCH_IOU = 0.5
# Each face's centre: (t, x, y) key points, 8-10 px a frame, spread over the frame: one region each at
# the default max_regions (4); a fifth far from them would wait for a frame with fewer.
FACES = {
    "top-left": [(0.0, 150.0, 110.0), (1.2, 250.0, 130.0)],
    "top-right": [(0.0, 1120.0, 140.0), (1.2, 1020.0, 170.0)],
    "middle": [(0.0, 620.0, 340.0), (1.2, 680.0, 420.0)],
    "bottom-right": [(0.0, 1040.0, 600.0), (1.2, 1140.0, 630.0)],
}
CLIP = tracking_video.Clip(FACES, seconds=1.0, width=WIDTH, height=HEIGHT, fps=FPS, face_scale=FACE_SCALE)
WAYS = ("full resolution", "letterbox", "regions")
ONE_BY_ONE = "regions one by one"  # (the script only: what running the crops as one batch saves)


def textured_scene() -> np.ndarray:
    """A wall of gravel (scikit-image's texture) in muted colour: edges everywhere, no face in it."""
    gravel = np.tile(skimage_data.gravel(), (2, 3))[:HEIGHT, :WIDTH].astype(np.float32)
    grey = 70 + 0.45 * gravel
    return np.clip(np.stack([grey * 0.9, grey, grey * 1.1], axis=-1), 0, 255).astype(np.uint8)


def render(path: Path) -> list[tracking_video.Truth]:
    """The clip, written to `path`, and each frame's true face boxes."""
    return tracking_video.render(path, CLIP, scene=textured_scene())


def model_path() -> Path:
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nudenet==3.4.2 is not installed (scripts/setup.sh installs its model file)")
    return Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"


def labels_of(path: Path) -> list[str]:
    metadata = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    names: dict[int, str] = ast.literal_eval(metadata["names"])
    return [names[i] for i in range(len(names))]


def config(way: str, clip: Path, labels: list[str]) -> PipelineConfig:
    size = (1280, 736) if way == "full resolution" else (320, 320)
    return PipelineConfig.model_validate(
        {
            "name": way.replace(" ", "-"),
            "model": {"name": "nudenet", "version": "3.4.2"},
            "source": {"type": "video", "uri": str(clip), "fps": None, "realtime": False},
            "preprocess": {
                "resize": {"width": size[0], "height": size[1], "mode": "letterbox"},
                "color": "rgb",
            },
            "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": labels},
            "motion": {"regions": True} if way.startswith("regions") else False,
        }
    )


@dataclass
class Run:
    way: str
    found: int  # faces found over the frames counted
    faces: int  # faces in them
    frames: int  # results (frames the model ran on)
    inference_ms: float  # median per frame (all of a frame's crops)
    total_ms: float  # median preprocess + inference + postprocess per frame
    steps: dict[str, Any]  # what the steps showed in the status (regions: crops run)


def run(way: str, clip: Path, truth: list[tracking_video.Truth], session: Session, labels: list[str]) -> Run:
    """The clip through a real pipeline the `way` given, to its end; what it found against the truth."""
    sink = ListSink()
    pipeline = Pipeline(config(way, clip, labels), LoadedModel("nudenet", "3.4.2", "ab" * 32, session), sink)
    if way == ONE_BY_ONE:
        for step in pipeline.stages.plan.steps["inference"]:
            step.batches = lambda: False  # type: ignore[attr-defined]  (InferStep)
    pipeline.start()
    try:
        wait_until(lambda: pipeline.finished, f"{way}: the clip played to its end", timeout=300)
    finally:
        pipeline.stop(timeout=30)
    steps = dict(pipeline.status().steps)
    results = [fields for _, fields in sink.results]
    by_frame = {r["source"]["frame"]: r for r in results}
    found = faces = 0
    for frame in truth[1:]:  # the gate has no background before the second frame
        result = by_frame.get(frame.index + 1)  # a video source counts frames from 1
        boxes = [
            d["box"]
            for d in (result["output"].get("detections", []) if result is not None else [])
            if d["label"] in ("FACE_FEMALE", "FACE_MALE")
        ]
        for box in frame.faces.values():
            faces += 1
            found += any(_iou(box, other) >= MATCH_IOU for other in boxes)
    inference = [r["latency_ms"]["inference"] for r in results]
    total = [sum(r["latency_ms"][k] for k in ("preprocess", "inference", "postprocess")) for r in results]
    return Run(
        way,
        found,
        faces,
        len(results),
        statistics.median(inference) if inference else 0.0,
        statistics.median(total) if total else 0.0,
        steps,
    )


def _iou(a: Any, b: Any) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="plays of the clip each way (timings: medians)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    path = model_path()
    labels = labels_of(path)
    session = get_backend("onnxruntime/CPUExecutionProvider").load(ModelArtifact(path, "onnx", "0" * 64))
    figures: dict[str, list[Run]] = {way: [] for way in (*WAYS, ONE_BY_ONE)}
    with tempfile.TemporaryDirectory() as folder:
        clip = Path(folder) / "faces.avi"
        truth = render(clip)
        for _ in range(args.runs):
            for way in figures:  # interleaved: a busy moment falls on every way alike
                figures[way].append(run(way, clip, truth, session, labels))
    session.close()
    summary = {
        way: {
            "found": runs[0].found,
            "faces": runs[0].faces,
            "frames": runs[0].frames,
            "inference_ms": round(statistics.median(r.inference_ms for r in runs), 1),
            "frame_ms": round(statistics.median(r.total_ms for r in runs), 1),
        }
        for way, runs in figures.items()
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{len(FACES)} faces ~{round(101 * FACE_SCALE)} px wide, {CLIP.frames} frames of {WIDTH}x{HEIGHT}")
    print(f"{'way':<19} {'found':>11} {'inference ms':>13} {'frame ms':>9}")
    for way, row in summary.items():
        found = f"{row['found']}/{row['faces']}"
        print(f"{way:<19} {found:>11} {row['inference_ms']:>13} {row['frame_ms']:>9}")


if __name__ == "__main__":
    main()
