#!/usr/bin/env python3
"""Several cameras on one shared session: frames/s with cross-stream batching off, forced on, and
left to the agent's own trial (`backends.batching: auto`), side by side on real models and inputs.

For each model (PP-OCR cls, rec, det from the rapidocr-onnxruntime wheel; rendered text as input)
and each ONNX backend here, CAMERAS threads each call the same pooled session as fast as they can
(a camera whose model is the bottleneck) for SECONDS per mode; the modes alternate within each of
ROUNDS rounds, so a slow spell of this shared box hits all of them. Reported: total frames/s per
mode (median of rounds), the ratio on/off, and what `auto` decided with the speedup it measured.
Every number in the report comes from this run. Usage:

    .venv/bin/python scripts/bench_batching.py [--quick] [--out docs/batching.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import batching  # noqa: E402
from agent.config import PreprocessConfig, ResizeConfig  # noqa: E402
from agent.processing import Preprocessor  # noqa: E402
from agent.session_pool import SessionPool  # noqa: E402
from providers import ModelArtifact, get_backend  # noqa: E402
from tests.store_fixtures import rapidocr_models_dir  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from make_demo_video import render_sign  # noqa: E402

CAMERAS = 4
MODELS = {  # name: (file, input height, width)
    "ppocr-cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 48, 192),
    "ppocr-rec": ("ch_PP-OCRv4_rec_infer.onnx", 48, 320),
    "ppocr-det": ("ch_PP-OCRv4_det_infer.onnx", 256, 640),
}
BACKENDS = ("onnxruntime/CPUExecutionProvider", "openvino/CPU")
MODES = ("off", "on", "auto")


def _inputs(height: int, width: int, spec: Any) -> list[np.ndarray]:
    config = PreprocessConfig(
        color="bgr", mean=[0.5] * 3, std=[0.5] * 3, resize=ResizeConfig(width=width, height=height)
    )
    prepare = Preprocessor(config, [spec]).prepare
    rng = np.random.default_rng(3)
    words = ["EXIT", "DOCK 7", "LOT B", "GATE 12"]
    return [prepare(render_sign(words[i % 4], bool(i % 2), rng))[0] for i in range(CAMERAS)]


def _throughput(
    backend: str, path: Path, mode: str, shape: tuple[int, int], seconds: float
) -> dict[str, Any]:
    """CAMERAS threads on one pooled session; frames/s once the trial phase is over."""
    batching.MIN_SPEEDUP = 0.0 if mode == "on" else _DEFAULT_MIN_SPEEDUP
    pool = SessionPool("off" if mode == "off" else "auto")
    users = [pool.load(get_backend(backend), ModelArtifact(path, "onnx", "0" * 64)) for _ in range(CAMERAS)]
    feeds = _inputs(*shape, users[0].inputs[0])
    name = users[0].inputs[0].name
    counts = [0] * CAMERAS
    timing = threading.Event()
    stop = threading.Event()

    def camera(i: int) -> None:
        while not stop.is_set():
            users[i].run({name: feeds[i]})
            if timing.is_set():
                counts[i] += 1

    threads = [threading.Thread(target=camera, args=(i,), daemon=True) for i in range(CAMERAS)]
    for thread in threads:
        thread.start()
    time.sleep(min(3.0, seconds))  # warm-up and the trial batches
    timing.set()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - started
    for thread in threads:
        thread.join(timeout=30)
    (entry,) = pool.stats()
    for user in users:
        user.close()
    return {"fps": sum(counts) / elapsed, "batching": entry["batching"]}


_DEFAULT_MIN_SPEEDUP = batching.MIN_SPEEDUP


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s per mode: a smoke run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "batching.md")
    args = parser.parse_args()
    rounds, seconds = (1, 1.0) if args.quick else (3, 3.0)
    began = time.time()
    load_start = os.getloadavg()
    rows: list[str] = []
    verdicts: list[bool] = []
    for model, (file, height, width) in MODELS.items():
        path = rapidocr_models_dir() / file
        for backend in BACKENDS:
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for round_no in range(rounds):
                order = MODES if round_no % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    runs[mode].append(_throughput(backend, path, mode, (height, width), seconds))
            fps = {mode: statistics.median(r["fps"] for r in runs[mode]) for mode in MODES}
            decisions = [r["batching"] for r in runs["auto"]]
            auto = ", ".join(f"{d['state']} ({d['speedup']}x)" for d in decisions)
            forced = runs["on"][-1]["batching"]
            versus_best = fps["auto"] / max(fps["off"], fps["on"])
            verdicts.append(versus_best >= 0.95)
            rows.append(
                f"| {model} {height}x{width} | {backend} | {fps['off']:.1f} | {fps['on']:.1f} | "
                f"{fps['on'] / fps['off']:.2f} | {fps['auto']:.1f} | {versus_best:.2f} | {auto} | "
                f"{forced['largest_batch']} |"
            )
            print(rows[-1], flush=True)
    load_end = os.getloadavg()
    load = " / ".join(", ".join(f"{v:.2f}" for v in sample) for sample in (load_start, load_end))
    header = (
        "| model, input | backend | off frames/s | on frames/s | on / off | auto frames/s "
        "| auto / better of off, on | auto decided (per round) | largest batch |"
    )
    report = "\n".join(
        [
            "# Batching frames of several cameras on one shared session",
            "",
            "Generated by `scripts/bench_batching.py`; every number comes from the run described here. "
            "Rerun with:",
            "",
            "```sh",
            ".venv/bin/python scripts/bench_batching.py --out docs/batching.md",
            "```",
            "",
            f"- date {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} logical cores; "
            f"{platform.platform()}; load average at start / end: {load}",
            f"- {CAMERAS} cameras (threads) share one pooled session, each calling it as fast as it answers "
            f"(the model is the bottleneck); {rounds} round(s) of {seconds:g} s per mode after 3 s of "
            "warm-up, modes alternating within a round; frames/s is the median over rounds. Inputs: "
            "rendered words through the models' own preprocessing.",
            "- *off*: `backends.batching: off`. *on*: batching forced on after its trials (the speedup "
            "threshold set to 0). *auto*: the agent's own rule: one batch run both ways must give the same "
            f"outputs, then {batching.TRIAL_PHASES} phases of {batching.PHASE_FRAMES} frames each way, "
            f"alternating, timed by the wall clock, must show together at least {_DEFAULT_MIN_SPEEDUP}x "
            "faster per frame; *auto decided* shows each round's decision and the speedup its trial "
            "measured.",
            f"- Wall time of this run: {time.time() - began:.0f} s.",
            "",
            header,
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"**auto within 5% of the better of off and on: {sum(verdicts)} of {len(verdicts)} "
            "model/backend pairs.** GPUs (TensorRT, CUDA) were not measured (no accelerator on this "
            "machine); the same trial decides there.",
            "",
        ]
    )
    args.out.write_text(report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
