#!/usr/bin/env python3
"""What tracking and analytics cost per frame and in resident memory (issue 27's budgets: <= 1 ms a
frame with 50 objects, <= 10 MB more memory in the daemon with tracking on). Results: docs/performance.md.

Each run is a fresh child process that first imports what the daemon imports (agent.daemon), so the
memory it then gains is what tracking adds to a running daemon: the assignment solver (lap) loaded at
the first frame and the tracks', zones' and lines' state. Per frame: `Scene.step` + `take_events` +
`summary` when there were events, as the pipeline's report thread calls them, on the synthetic
sequence of scripts/bench_trackers.py (50 objects bouncing in 1920x1080, noise, misses, low-score
detections and false positives), with 5 zones (dwell, overcrowding) and 3 lines, and, side by side in
the same child, the tracker alone and the scene without zones or lines.

    python scripts/bench_tracking.py [--frames 1000] [--repeat 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(frames: int) -> dict[str, float]:
    import psutil

    import agent.daemon  # noqa: F401  (what the daemon has loaded before any frame)

    sys.path.insert(0, str(HERE))
    import numpy as np
    from bench_trackers import synthetic

    from agent.config import LineConfig, TrackConfig, ZoneConfig
    from agent.processing.scene import Scene
    from agent.processing.tracking import Tracker

    dets, _ = synthetic(frames=frames)
    boxes = [
        [{"box": [float(v) for v in row[:4]], "score": float(row[4]), "label": "person"} for row in d]
        for d in dets
    ]
    process = psutil.Process()
    rss_before = process.memory_info().rss

    zones = [
        ZoneConfig(
            name=f"zone{i}",
            points=[
                (0.1 + 0.15 * i, 0.1),
                (0.2 + 0.15 * i, 0.1),
                (0.25 + 0.15 * i, 0.9),
                (0.05 + 0.15 * i, 0.9),
            ],
            dwell_s=2.0,
            max_objects=5,
        )
        for i in range(5)
    ]
    lines = [
        LineConfig(name=f"line{i}", points=[(0.0, 0.25 * (i + 1)), (1.0, 0.25 * (i + 1))]) for i in range(3)
    ]

    def per_frame(scene: Scene) -> list[float]:
        times = []
        for f, frame in enumerate(boxes):
            entries = [dict(b) for b in frame]  # the postprocessor's fresh entries
            t0 = time.perf_counter()
            scene.step(entries, f / 30, 1920, 1080)
            if scene.take_events():
                scene.summary()
            times.append(time.perf_counter() - t0)
        return times

    full = per_frame(Scene(TrackConfig(), zones, lines))
    rss_after = process.memory_info().rss
    plain = per_frame(Scene(TrackConfig(), [], []))
    tracker = Tracker(TrackConfig())
    alone = []
    for f, d in enumerate(dets):
        t0 = time.perf_counter()
        tracker.update(d[:, :4], d[:, 4], np.zeros(len(d), np.int64), f / 30)
        alone.append(time.perf_counter() - t0)
    return {
        "objects_per_frame": statistics.mean(len(d) for d in dets),
        "full_median_ms": statistics.median(full) * 1e3,
        "full_p95_ms": float(np.percentile(full, 95)) * 1e3,
        "no_zones_median_ms": statistics.median(plain) * 1e3,
        "tracker_median_ms": statistics.median(alone) * 1e3,
        "rss_growth_mb": (rss_after - rss_before) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.frames)))
        return
    runs = []
    for i in range(args.repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--frames", str(args.frames)],
            check=True,
            capture_output=True,
            text=True,
            cwd=HERE.parent,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(
            f"run {i + 1}/{args.repeat}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[-1].items()),
            flush=True,
        )
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print("median of runs: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": medians}, indent=2) + "\n")


if __name__ == "__main__":
    main()
