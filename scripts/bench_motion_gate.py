#!/usr/bin/env python3
"""The motion gate's cost a frame on a static 1280x720 scene (issue 35's target: <= 3 ms), for
docs/performance.md "Motion gate": the gate step (agent/steps/motion.py) on textured frames with a
camera's noise (new every frame, a few grey levels), each method, the default settings otherwise.

    python scripts/bench_motion_gate.py [--frames 2000]

Prints the median and 95th percentile per frame, and how many frames went on (keepalive only: the
scene is static)."""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np

from agent.config import MotionConfig
from agent.steps.base import FrameRecord
from agent.steps.motion import MotionGateStep, PipelineMotion

W, H, FPS = 1280, 720, 5.0


def scene(noises: int = 16) -> list[np.ndarray]:
    """A textured static scene, `noises` versions of it with different camera noise."""
    rng = np.random.default_rng(3)
    coarse = cv2.resize(rng.integers(40, 170, (H // 20, W // 20, 3), dtype=np.uint8), (W, H), cv2.INTER_CUBIC)
    base = np.clip(coarse.astype(np.int16) + rng.integers(-12, 13, (H, W, 1)), 0, 255)
    return [np.clip(base + rng.integers(-3, 4, (H, W, 1)), 0, 255).astype(np.uint8) for _ in range(noises)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    frames = scene()
    print(f"{W}x{H}, {args.frames} static frames, OpenCV threads {cv2.getNumThreads()}")
    for method in ("average", "mog2"):
        step = MotionGateStep(MotionConfig(method=method), PipelineMotion(), lambda: False)
        times, passed = [], 0
        for i in range(args.frames):
            record = FrameRecord(i, time.time(), i / FPS, False, frames[i % len(frames)])
            t0 = time.perf_counter()
            passed += step.run(record)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        p95 = times[int(len(times) * 0.95)]
        print(
            f"{method:8s} median {statistics.median(times):.3f} ms, p95 {p95:.3f} ms; "
            f"{passed} of {args.frames} frames went on "
            f"(keepalive every {step.config.keepalive_s:g} s at {FPS:g} fps)"
        )


if __name__ == "__main__":
    main()
