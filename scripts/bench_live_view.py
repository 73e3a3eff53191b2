#!/usr/bin/env python3
"""What the live view (agent/live_view.py) and its web page cost a pipeline: CPU per frame and frame
rate side by side, five ways: the feature absent (no live_view step: pixels let go after the model);
present with nobody watching; one in-process viewer reading every picture; the web server running
its live pages (agent/web/live.py) with no client; and the same with a client in another process
long-polling `/live/<pipeline>/frame.jpg` as the page's script does (issue 37's targets: page on and
no client = unchanged within noise; a live view open = frame rate >= 0.95 of without). Results:
docs/performance.md.

Each round plays the same rendered clip (two faces walking past a zone and a line, 1280x720, MJPG)
through a real pipeline with nudenet's YOLOv8n (320 letterbox, tracking on), `realtime: false` so
the model sets the pace; the three ways alternate within each round, so a busy moment of a shared box
falls on each alike, and ratios are taken per round (then the median). CPU is the whole process's
(decoder, the pipeline's threads, the live view's encoder) per frame reported.

    python scripts/bench_live_view.py [--rounds 5] [--seconds 8] [--json]

The client of "page-watched" is a small Python process (urllib), as a browser tab would be another
process; its CPU is not the pipeline's, but it shares the box's cores as a browser on the box would.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cv2

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import make_tracking_video as tracking_video
from bench_regions import labels_of

import agent.steps
from agent.config import PipelineConfig
from agent.config.web import WebConfig
from agent.errors import EdgeAgentError
from agent.pipeline import Pipeline
from agent.stage import LoadedModel
from agent.web.live import live_pages
from agent.web.server import WebServer
from providers import ModelArtifact, Session, get_backend
from tests.media_fixtures import ListSink
from tests.waits import wait_until

WIDTH, HEIGHT, FPS = 1280, 720, 10
FACE_SCALE = 2.4  # the photo's 101-px face ~240 px wide: ~60 px in the 320 letterbox, found (~0.8)
WAYS = ("absent", "unwatched", "watched", "page-idle", "page-watched")
# The page's viewer: long-polls the newest picture after the last one it has, as static/live.js does.
CLIENT = """
import sys, urllib.request, urllib.error
base, seq, pictures = sys.argv[1], 0, 0
while True:
    try:
        with urllib.request.urlopen(f"{base}/live/live/frame.jpg?after={seq}", timeout=10) as answer:
            if answer.status == 200:
                answer.read()
                seq, pictures = int(answer.headers["X-Frame-Seq"]), pictures + 1
                print(pictures, flush=True)
    except (urllib.error.URLError, OSError):
        pass
"""
WALKS = {
    "left-to-right": [(0.0, 150.0, 300.0), (8.0, 1130.0, 420.0)],
    "right-to-left": [(0.0, 1100.0, 500.0), (8.0, 200.0, 260.0)],
}


def model_path() -> Path:
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nudenet==3.4.2 is not installed (scripts/setup.sh installs its model file)")
    return Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"


def config(clip: Path, labels: list[str]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "live",
            "model": {"name": "nudenet", "version": "3.4.2"},
            "source": {"type": "video", "uri": str(clip), "fps": None, "realtime": False},
            "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
            "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": labels},
            "track": {},
            "zones": [{"name": "counter", "points": [[0.6, 0.1], [0.95, 0.1], [0.95, 0.6], [0.6, 0.6]]}],
            "lines": [{"name": "door", "points": [[0.5, 0.0], [0.5, 1.0]], "in": "east", "out": "west"}],
        }
    )


class _OnePipeline:
    """What the live pages read of the supervisor (agent/web/live.py Pipelines), for one pipeline."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    def pipeline(self, name: str) -> Pipeline:
        if name != self._pipeline.config.name:
            raise EdgeAgentError(f"no pipeline {name!r}")
        return self._pipeline

    def pipelines(self) -> list[Pipeline]:
        return [self._pipeline]


def page_for(pipeline: Pipeline) -> WebServer:
    """The daemon's web server (its own thread) with the live pages, on a free loopback port."""
    server = WebServer(
        WebConfig(enabled=True, port=0), lambda: {}, "bench", pages=[live_pages(_OnePipeline(pipeline))]
    )
    server.start()
    return server


def run(way: str, clip: Path, session: Session, labels: list[str]) -> dict[str, Any]:
    """The clip through a pipeline the `way` given: frames, wall seconds, process CPU seconds."""
    real_step = agent.steps.LiveViewStep
    if way == "absent":  # the pipeline as it was before the live view: no step, pixels not kept
        agent.steps.LiveViewStep = lambda *args: None  # type: ignore[assignment,misc]
    try:
        sink = ListSink()
        pipeline = Pipeline(config(clip, labels), LoadedModel("nudenet", "3.4.2", "ab" * 32, session), sink)
    finally:
        agent.steps.LiveViewStep = real_step  # type: ignore[misc]
    pictures = [0]
    viewer = pipeline.live_view.watch() if way == "watched" else None
    server = page_for(pipeline) if way.startswith("page") else None
    client = None
    if server is not None and way == "page-watched":
        base = f"http://127.0.0.1:{server.port}"
        client = subprocess.Popen([sys.executable, "-c", CLIENT, base], stdout=subprocess.PIPE, text=True)

    def read() -> None:  # a viewer taking every picture, as the web server's MJPEG stream would
        assert viewer is not None
        seq = 0
        while not pipeline.finished:
            got = viewer.latest(after_seq=seq, timeout=0.5)
            if got is not None:
                seq = got[0]
                pictures[0] += 1

    reader = threading.Thread(target=read, daemon=True) if viewer is not None else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    pipeline.start()
    if reader is not None:
        reader.start()
    try:
        wait_until(lambda: pipeline.finished, f"{way}: the clip played", timeout=600, interval=0.01)
    finally:
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        pipeline.stop(timeout=30)
        if viewer is not None:
            viewer.close()
        if reader is not None:
            reader.join(5)
        if client is not None:
            client.terminate()
            out, _ = client.communicate(timeout=10)
            pictures[0] = len(out.split())
        if server is not None:
            server.stop()
    frames = len(sink.results)
    return {
        "frames": frames,
        "fps": frames / wall,
        "cpu_ms": 1000 * cpu / frames,
        "pictures": pictures[0],
        "encodes": pipeline.live_view.encodes,
        "tracked": sum(  # boxes with a track id: what the pictures show
            1 for _, r in sink.results for d in r["output"].get("detections", []) if d.get("track_id")
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three ways, alternated")
    parser.add_argument("--seconds", type=float, default=8.0, help="the clip's length (10 frames a second)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    path = model_path()
    labels = labels_of(path)
    session = get_backend("onnxruntime/CPUExecutionProvider").load(ModelArtifact(path, "onnx", "0" * 64))
    clip_spec = tracking_video.Clip(
        WALKS, seconds=args.seconds, width=WIDTH, height=HEIGHT, fps=FPS, face_scale=FACE_SCALE
    )
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as folder:
        clip = Path(folder) / "walk.avi"
        tracking_video.render(clip, clip_spec)
        run("absent", clip, session, labels)  # (a warm-up play: caches, the session's first runs)
        for index in range(args.rounds):
            order = WAYS if index % 2 == 0 else WAYS[::-1]  # alternating: no way always goes first
            for way in order:
                runs[way].append(run(way, clip, session, labels))
    session.close()

    def ratios(way: str, key: str) -> list[float]:
        return sorted(w[key] / a[key] for w, a in zip(runs[way], runs["absent"], strict=True))

    def ratio(way: str, key: str) -> float:
        return statistics.median(ratios(way, key))

    summary = {
        way: {
            "frames": rows[0]["frames"],
            "fps": round(statistics.median(r["fps"] for r in rows), 1),
            "cpu_ms_per_frame": round(statistics.median(r["cpu_ms"] for r in rows), 2),
            "fps_ratio": round(ratio(way, "fps"), 3),
            "cpu_ratio": round(ratio(way, "cpu_ms"), 3),
            "fps_ratio_range": [round(ratios(way, "fps")[0], 3), round(ratios(way, "fps")[-1], 3)],
            "pictures": statistics.median(r["pictures"] for r in rows),
            "encodes": statistics.median(r["encodes"] for r in rows),
            "tracked_boxes": rows[0]["tracked"],
        }
        for way, rows in runs.items()
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    plays = f"{clip_spec.frames} frames ({summary['absent']['tracked_boxes']} tracked boxes) a play"
    print(f"{WIDTH}x{HEIGHT}, {plays}, {args.rounds} rounds (medians; ratios: per round, against absent)")
    print(f"{'way':<10} {'fps':>7} {'CPU ms/frame':>13} {'fps ratio':>10} {'(rounds)':>13} {'CPU ratio':>10} "
          f"{'JPEGs':>6}")  # fmt: skip
    for way, row in summary.items():
        low, high = row["fps_ratio_range"]
        print(f"{way:<10} {row['fps']:>7} {row['cpu_ms_per_frame']:>13} {row['fps_ratio']:>10} "
              f"{f'{low}-{high}':>13} {row['cpu_ratio']:>10} {row['encodes']:>6}")  # fmt: skip


if __name__ == "__main__":
    main()
