#!/usr/bin/env python3
"""INT8 variant against the float model: nudenet's YOLOv8n (320n.onnx) quantized as `registry publish
--quantize int8` does (agent/quantize.py, on four skimage photos), timed on onnxruntime's CPU and on
OpenVINO's CPU with bf16 off (INFERENCE_PRECISION_HINT f32) and on (bf16), the float model and the
variant each, in the same run, interleaved: each of ROUNDS rounds gives every configuration a turn of
TURN_S seconds, so a slow spell of this shared box hits all of them. Reported: the median over rounds
of each turn's median ms, the ratio of the variant to the float model per runtime, and how close each
configuration's reports are to the float model's on onnxruntime (the same detections at IoU >= 0.5,
the largest box difference in pixels), with the box's load. Usage:

    .venv/bin/python scripts/bench_int8.py [--rounds 7] [--turn 1.0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from skimage import data as skimage_data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.processing.judge import report_judge  # noqa: E402
from agent.quantize import Feeds, image_inputs, make_variant, preparation  # noqa: E402
from agent.transform import with_variants_marked  # noqa: E402
from providers import ModelArtifact, Session, get_backend  # noqa: E402
from providers.cpu_load import CpuLoad  # noqa: E402

ORT, OV = "onnxruntime/CPUExecutionProvider", "openvino/CPU"
CONFIGS = [  # (label, backend, options)
    ("onnxruntime CPU", ORT, {}),
    ("OpenVINO CPU, bf16 off", OV, {"precision": "f32"}),
    ("OpenVINO CPU, bf16 on", OV, {"precision": "bf16"}),
]


def _photos(folder: Path) -> list[Path]:
    grey = np.stack([skimage_data.camera()] * 3, axis=-1)
    photos = {
        "astronaut": skimage_data.astronaut(),
        "camera": grey,
        "chelsea": skimage_data.chelsea(),
        "coffee": skimage_data.coffee(),
    }
    paths = []
    for name, rgb in photos.items():
        paths.append(folder / f"{name}.png")
        cv2.imwrite(str(paths[-1]), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return paths


def _turn(session: Session, feeds: Feeds, turn_s: float) -> float:
    """One turn: runs for turn_s seconds (at least 3); the median ms."""
    times = []
    end = time.monotonic() + turn_s
    while len(times) < 3 or time.monotonic() < end:
        start = time.perf_counter()
        session.run(feeds)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turn", type=float, default=1.0, help="seconds per configuration per round")
    args = parser.parse_args()
    spec = importlib.util.find_spec("nudenet")
    assert spec is not None and spec.submodule_search_locations, "nudenet==3.4.2 is not installed"
    source = Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as scratch:
        folder = Path(scratch)
        model = folder / "320n.onnx"
        model.write_bytes(source.read_bytes())
        photos = folder / "photos"
        photos.mkdir()
        paths = _photos(photos)
        start = time.monotonic()
        made = make_variant(
            model, folder / "320n.int8.onnx", photos, [], say=lambda t: print(t, file=sys.stderr)
        )
        quantize_s = time.monotonic() - start
        # Marked as the box marks a version's files (the variant's own metadata says what it is), so
        # each session reads back the precision the status would show.
        fp32, int8 = with_variants_marked(
            [
                ModelArtifact(model, "onnx", "a" * 64, name="320n.onnx"),
                ModelArtifact(made.path, "onnx", "b" * 64, name="320n.int8.onnx"),
            ]
        )
        artifacts = {"fp32": fp32, "int8": int8}
        sessions: dict[tuple[str, str], Session] = {}
        for label, backend, options in CONFIGS:
            for kind, artifact in artifacts.items():
                sessions[(label, kind)] = get_backend(backend).load(artifact, options)
        reference = sessions[(CONFIGS[0][0], "fp32")]
        prep = preparation(model, reference.inputs)
        feeds = image_inputs(paths, reference.inputs, prep)
        assert prep.postprocess is not None
        judge = report_judge(prep.postprocess, reference.outputs)
        assert judge is not None
        wanted = [reference.run(f) for f in feeds]
        closeness = {}
        for key, session in sessions.items():
            worst, problems = 0.0, []
            for i, f in enumerate(feeds):
                verdict = judge(session.run(f), wanted[i])
                if verdict is None:
                    continue
                diff, problem = verdict
                worst = max(worst, diff or 0.0)
                if problem:
                    problems.append(f"{paths[i].stem}: {problem}")
            closeness[key] = (worst, problems)
        load_before = os.getloadavg()
        cpu = CpuLoad()
        turns: dict[tuple[str, str], list[float]] = {key: [] for key in sessions}
        for _round in range(args.rounds):
            for key, session in sessions.items():
                session.run(feeds[0])  # warm after the others' turns
                turns[key].append(_turn(session, feeds[0], args.turn))
        use = cpu.use()
        load_after = os.getloadavg()
        precisions = {key: session.precision for key, session in sessions.items()}
        for session in sessions.values():
            session.close()
    medians = {key: statistics.median(values) for key, values in turns.items()}
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    has_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    cpu_name = platform.processor() or platform.machine()
    print(f"## INT8 variants ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)\n")
    print(
        f"`scripts/bench_int8.py --rounds {args.rounds} --turn {args.turn}` on {cpu_name}, "
        f"{os.cpu_count()} cores ({'has' if has_bf16 else 'has no'} bf16: avx512_bf16/amx_bf16), "
        f"load average {load_before[0]:.2f} before and {load_after[0]:.2f} after; {use.describe()} "
        f"while timed. nudenet's YOLOv8n 320n.onnx at 320x320, input: the astronaut photo; the variant "
        f"made in {quantize_s:.1f} s on 4 photos ({made.kept_float} kept in float).\n"
    )
    print(
        "| runtime | precision read back (fp32 / int8 model) | fp32 ms | int8 ms | int8 speedup "
        "| reports vs fp32 on onnxruntime (4 photos) |"
    )
    print("|---|---|---|---|---|---|")
    for label, _backend, _options in CONFIGS:
        fp, q = medians[(label, "fp32")], medians[(label, "int8")]
        close = []
        for kind in ("fp32", "int8"):
            worst, problems = closeness[(label, kind)]
            close.append(
                f"{kind}: "
                + ("; ".join(problems) if problems else f"same detections, boxes within {worst:.2g} px")
            )
        read = f"{precisions[(label, 'fp32')]} / {precisions[(label, 'int8')]}"
        print(f"| {label} | {read} | {fp:.2f} | {q:.2f} | {fp / q:.2f}x | {'; '.join(close)} |")
    base = medians[(CONFIGS[0][0], "fp32")]
    print(
        "\nAgainst fp32 on onnxruntime CPU: "
        + ", ".join(
            f"{label} {kind} {base / medians[(label, kind)]:.2f}x"
            for label, _b, _o in CONFIGS
            for kind in ("fp32", "int8")
        )
        + "."
    )
    spread = {key: (min(v), max(v)) for key, v in turns.items()}
    print(
        "\nPer-round medians, min..max ms: "
        + ", ".join(f"{k[0]} {k[1]} {a:.1f}..{b:.1f}" for k, (a, b) in spread.items())
        + "."
    )


if __name__ == "__main__":
    main()
