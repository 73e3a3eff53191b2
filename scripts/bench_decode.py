#!/usr/bin/env python3
"""Benchmark: CPU to read a 720p H.264 file with an fps cap, decoding (read) every frame against
grabbing every frame and converting (retrieve) only those the cap keeps, as the video source does
since issue 15. The clip is made with ffmpeg's test source; rounds interleaved.

    .venv/bin/python scripts/bench_decode.py [--fps-cap 5] [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2

FILE_FPS = 30


def make_clip(path: Path, seconds: int) -> None:
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size=1280x720:rate={FILE_FPS}",
         "-t", str(seconds), "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)],
        check=True, timeout=300,
    )  # fmt: skip


def cpu_s(path: Path, keep_every: int, grab: bool) -> tuple[float, int]:
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    kept, n = 0, 0
    cpu = time.process_time()
    while True:
        if grab:
            if not capture.grab():
                break
            if n % keep_every == 0:
                ok, image = capture.retrieve()
                kept += ok and image is not None
        else:
            ok, image = capture.read()
            if not ok:
                break
            kept += n % keep_every == 0
        n += 1
    capture.release()
    return time.process_time() - cpu, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--fps-cap", type=float, default=5.0)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    keep_every = max(1, round(FILE_FPS / args.fps_cap))
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "clip.mp4"
        make_clip(clip, args.seconds)
        results: dict[str, list[float]] = {"read every frame": [], "grab, retrieve kept": []}
        for _ in range(args.rounds):
            for name, grab in (("read every frame", False), ("grab, retrieve kept", True)):
                seconds, kept = cpu_s(clip, keep_every, grab)
                results[name].append(seconds)
    frames = FILE_FPS * args.seconds
    print(f"1280x720 H.264, {frames} frames at {FILE_FPS} fps, cap {args.fps_cap:g} fps ({kept} kept), "
          f"CPU ms per kept frame, median of {args.rounds}:")  # fmt: skip
    for name, values in results.items():
        per = [v / kept * 1000 for v in values]
        print(f"  {name}: {statistics.median(per):.2f} ({', '.join(f'{p:.2f}' for p in per)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
