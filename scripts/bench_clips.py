#!/usr/bin/env python3
"""What event clips cost one camera (issue 37: "the CPU cost per camera with clips on is measured and
stated"), for docs/performance.md "Clips".

A rendered camera (1280x720 at 15 fps by default, played at its own pace as a camera would deliver it:
`realtime: true`) where a real face (the astronaut's, which the real YOLOv8n finds) walks across the
frame for `--walk-s` (4) of every 10 s goes through a real pipeline (agent/pipeline.py) with tracking,
once with clips off and once on (pre_s 3, post_s 3: the pre-roll is kept all the time; a clip is
encoded while the face is tracked and 3 s after, so at 4 s of every 10 a clip is open most of the
time: the worst case; `--walk-s 0`: nobody comes, the pre-roll's cost alone). The CPU the process
and its finished children (ffmpeg) used per frame is compared; the two runs alternate, `--rounds`
times, the order swapped every round, so both see the same box: the verdict is the median of each
round's ratio (on / off). Also printed: the clips written and the clip frames dropped.

    python scripts/bench_clips.py [--rounds 3] [--seconds 20] [--width 1280 --height 720 --fps 15]
                                  [--walk-s 4] [--json]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.config import PipelineConfig  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.stage import LoadedModel  # noqa: E402
from providers.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from tests.media_fixtures import FACE_BOX, ListSink, astronaut_bgr, cls_artifact  # noqa: E402

PERIOD_S = 10.0  # the face crosses for --walk-s of every PERIOD_S


def yolo() -> tuple[Path, list[str]]:
    """NudeNet's YOLOv8n (320n.onnx, from its wheel) and its class names (as tests/media_fixtures.py)."""
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("nudenet==3.4.2 is not installed; scripts/setup.sh installs its model file")
    path = Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"
    metadata = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    names: dict[int, str] = ast.literal_eval(metadata["names"])
    return path, [names[i] for i in range(len(names))]


class ClipSink(ListSink):
    def __init__(self, clips_root: Path) -> None:
        super().__init__()
        self.clips_root = clips_root


def render(path: Path, seconds: float, width: int, height: int, fps: float, walk_s: float) -> Path:
    x1, y1, x2, y2 = FACE_BOX.astype(int)
    side = height // 3
    face = cv2.resize(astronaut_bgr()[max(0, y1 - 25) : y2 + 25, max(0, x1 - 25) : x2 + 25], (side, side))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (width, height))
    assert writer.isOpened()
    rng = np.random.default_rng(7)
    background = rng.integers(60, 120, (height, width, 3), dtype=np.uint8)  # a camera's grain, not flat
    for i in range(int(seconds * fps)):
        frame = background.copy()
        t = (i / fps) % PERIOD_S
        if t < walk_s:
            x = int((width - side) * t / walk_s)
            frame[height // 3 : height // 3 + side, x : x + side] = face
        writer.write(frame)
    writer.release()
    return path


def run(video: Path, clips: bool, model: LoadedModel, labels: list[str], state: Path) -> dict[str, Any]:
    config = PipelineConfig(
        name="door",
        model={"path": str(video)},  # not read: the loaded model is handed over
        source={"type": "video", "uri": str(video), "realtime": True},
        preprocess={"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb",
                    "scale": 1 / 255},
        postprocess={"type": "detection", "score_threshold": 0.3, "labels": labels},
        report={"results": False},
        track={},
        clips={"enabled": clips, "pre_s": 3, "post_s": 3},
    )  # fmt: skip
    pipeline = Pipeline(config, model, ClipSink(state / "clips"))
    cpu_before, started = _cpu_s(), time.perf_counter()
    pipeline.start()
    deadline = started + 600
    while not pipeline.finished and time.perf_counter() < deadline:  # bounded: the video's length
        time.sleep(0.05)
    status = pipeline.status()
    pipeline.stop(timeout=60)  # (the last clip is finished: its ffmpeg's CPU is counted)
    wall, cpu = time.perf_counter() - started, _cpu_s() - cpu_before
    frames = status.counts.inferences
    shown = status.steps.get("clips") or {}
    written = len(list((state / "clips" / "door").glob("*.mp4"))) if clips else 0
    return {
        "frames": frames,
        "wall_s": wall,
        "cpu_ms_per_frame": 1000 * cpu / max(frames, 1),
        "cpu_share": cpu / wall,  # of one core
        "clips": written,
        "frames_dropped": shown.get("frames_dropped", 0),
    }


def _cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):  # children: the finished ffmpegs
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument(
        "--walk-s",
        type=float,
        default=4.0,
        help="seconds of every 10 the face walks (0: the pre-roll alone)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path, labels = yolo()
    model = LoadedModel("faces", "1", "", OnnxRuntimeBackend().load(cls_artifact(path)))
    with tempfile.TemporaryDirectory() as tmp:
        video = render(Path(tmp) / "door.avi", args.seconds, args.width, args.height, args.fps, args.walk_s)
        rounds = []
        for i in range(args.rounds):
            # Each round both ways, the order swapped every round: neither side always goes first.
            order = (False, True) if i % 2 == 0 else (True, False)
            passes = {}
            for side in order:
                state = Path(tmp) / f"state-{i}-{side}"
                passes[side] = run(video, side, model, labels, state)
            off, on = passes[False], passes[True]
            ratio = on["cpu_ms_per_frame"] / off["cpu_ms_per_frame"]
            rounds.append({"off": off, "on": on, "ratio": ratio})
            if not args.json:
                print(
                    f"round {i + 1}: off {off['cpu_ms_per_frame']:.1f} ms CPU/frame "
                    f"({off['frames']} frames), on {on['cpu_ms_per_frame']:.1f} ms CPU/frame "
                    f"({on['frames']} frames, {on['clips']} clips, {on['frames_dropped']} clip frames "
                    f"dropped): {ratio:.2f}"
                )
    ratio = statistics.median(r["ratio"] for r in rounds)
    extra = statistics.median(r["on"]["cpu_ms_per_frame"] - r["off"]["cpu_ms_per_frame"] for r in rounds)
    report = {
        "camera": f"{args.width}x{args.height} at {args.fps:g} fps",
        "walk_s": args.walk_s,
        "rounds": rounds,
        "median_ratio": ratio,
        "median_extra_ms_per_frame": extra,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"median CPU per frame, clips on / off: {ratio:.2f} (+{extra:.1f} ms a frame)")


if __name__ == "__main__":
    main()
