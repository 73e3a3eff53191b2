#!/usr/bin/env python3
"""Benchmark: CPU per result of an onnxruntime CPU session run at a camera's pace, with its worker
threads allowed to spin between runs and not (the agent's default since issue 15), interleaved.

    .venv/bin/python scripts/bench_spinning.py [--model M.onnx] [--fps 30] [--runs 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from providers import ModelArtifact  # noqa: E402
from providers.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402


def default_model() -> Path:
    """The PP-OCR classifier in the rapidocr wheel (located, not imported: it is installed alone)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rapidocr-onnxruntime is not installed: give --model")
    package = Path(next(iter(spec.submodule_search_locations)))
    return package / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def cpu_ms_per_result(model: Path, spinning: bool, fps: float, runs: int) -> float:
    session = OnnxRuntimeBackend().load(ModelArtifact(model, "onnx", "0" * 64), {"allow_spinning": spinning})
    try:
        [spec] = session.inputs
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
        feeds = {spec.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
        for _ in range(5):
            session.run(feeds)
        cpu, start = time.process_time(), time.monotonic()
        for i in range(runs):
            session.run(feeds)
            time.sleep(max(0.0, start + (i + 1) / fps - time.monotonic()))  # the camera's pace
        return (time.process_time() - cpu) / runs * 1000
    finally:
        session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = args.model or default_model()
    results: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):  # interleaved: a noisy stretch hits both
        for spinning in (True, False):
            results[spinning].append(cpu_ms_per_result(model, spinning, args.fps, args.runs))
    print(f"{model.name} at {args.fps:g} fps, {args.runs} runs x {args.rounds} rounds, CPU ms per result:")
    for spinning, values in results.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {'spinning' if spinning else 'not spinning'}: {statistics.median(values):.2f} ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
