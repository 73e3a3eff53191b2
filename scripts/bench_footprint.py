#!/usr/bin/env python3
"""Benchmark: the daemon's memory (VmRSS) and mapped shared libraries while it serves one
onnxruntime pipeline (the PP-OCR classifier on a looping video, benchmarking off), on a first start
and on a restart with its decision cached (issue 15, "Frugal").

    .venv/bin/python scripts/bench_footprint.py [--settle 5]

Each start is measured once its pipeline runs and `--settle` seconds have passed (warm-up and the
first frames done). A real mosquitto and a file registry under a temp dir; nothing is kept.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_demo_video import make_orientation_video  # noqa: E402

from tests.mosquitto import Mosquitto  # noqa: E402
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir  # noqa: E402
from tests.waits import wait_until  # noqa: E402

EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")
# A runtime's libraries by path fragment (its own .so files and its bundled dependencies).
RUNTIMES = {"openvino": ("openvino",), "LiteRT": ("litert", "tflite"), "onnxruntime": ("onnxruntime",)}


def write_config(work: Path, port: int) -> Path:
    config = {
        "device": {"id": "footprint"},
        "state_dir": str(work / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port},
        "registry": {"url": f"file://{work / 'registry'}"},
        "backends": {"benchmark": False},
        "pipelines": [
            {
                "name": "signs",
                "model": {"name": "cls", "version": "1"},
                "source": {"type": "video", "uri": str(work / "signs.mp4"), "fps": 2, "loop": True},
                "backend": {"prefer": ["onnxruntime/CPUExecutionProvider"]},
                "preprocess": {
                    "resize": {"width": 192, "height": 48},
                    "color": "bgr",
                    "mean": [0.5] * 3,
                    "std": [0.5] * 3,
                },
                "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
            }
        ],
    }
    path = work / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def measure(config: Path, state_dir: Path, log: Path, settle_s: float) -> dict[str, Any]:
    with log.open("wb") as out:
        proc = subprocess.Popen([EDGE_AGENT, "run", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:

        def running() -> bool:
            try:
                status = json.loads((state_dir / "status.json").read_text())
            except (OSError, ValueError):
                return False
            return bool(status.get("pipelines", {}).get("signs", {}).get("state") == "running")

        wait_until(lambda: running() or proc.poll() is not None, "the pipeline running", timeout=300)
        if proc.poll() is not None:
            raise SystemExit(f"edge-agent exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(settle_s)  # a measurement, not a test: let warm-up and the first frames pass
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
        libraries = {line.split()[-1] for line in maps if re.search(r"\.so(\.|$)", line.rsplit("/", 1)[-1])}
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    counts = {
        name: sum(any(f in lib for f in frags) for lib in libraries) for name, frags in RUNTIMES.items()
    }
    return {"rss_mb": rss_kb / 1024, "libraries": len(libraries), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to let it run before measuring")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-footprint-"))
    try:
        model = rapidocr_models_dir() / CLS_MODEL_FILE
        subprocess.run(
            [EDGE_AGENT, "registry", "publish", str(model), "--name", "cls", "--version", "1",
             "--registry", f"file://{work / 'registry'}"],
            check=True, capture_output=True,
        )  # fmt: skip
        make_orientation_video(work / "signs.mp4", fps=10, seconds_per_sign=1.0)
        broker = Mosquitto(work / "broker")
        broker.start()
        try:
            config = write_config(work, broker.port)
            print("| start | VmRSS MB | mapped .so | openvino | LiteRT | onnxruntime |")
            print("|---|---|---|---|---|---|")
            for start in ("first (deciding)", "restart (decision cached)"):
                m = measure(config, work / "state", work / f"{start.split()[0]}.log", args.settle)
                print(
                    f"| {start} | {m['rss_mb']:.0f} | {m['libraries']} | {m['openvino']} | {m['LiteRT']} "
                    f"| {m['onnxruntime']} |"
                )
        finally:
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
