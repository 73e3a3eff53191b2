#!/usr/bin/env python3
"""Soak: the daemon for a long run on sources that keep failing and coming back, watched from the
outside for leaks (resident memory, open file descriptors, threads, child processes).

`edge-agent run` (a subprocess, with a private mosquitto on loopback) runs three pipelines:
- `video`: a rendered video file on loop, through the PP-OCR direction classifier at 5 fps;
- `gst`: a GStreamer test card that ends after 40 frames (EOS), so gst-launch-1.0 is started again
  every few seconds: each cycle opens pipes, a reader thread and a child process, and must give
  them all back;
- `speech`: espeak-ng speech on loop through the silero VAD with its recurrent state, in real time.

Every SAMPLE_S seconds the script reads the daemon's RSS, open descriptors, threads and children
(psutil) and its status.json (results, reopen cycles). The growth per hour over the second half of
the run (after warm-up) is fitted by least squares. Every number in the report comes from this run; it
replaces only this script's section of the output (scripts/soak_broker.py writes its own there):

    .venv/bin/python scripts/soak_sources.py [--minutes 10] [--out docs/soak.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_demo_video import make_orientation_video  # noqa: E402
from soak_common import SAMPLE_S, growth_per_hour, sample_process, value_range, write_section  # noqa: E402

from tests.media_fixtures import speak  # noqa: E402
from tests.mosquitto import Mosquitto  # noqa: E402
from tests.store_fixtures import rapidocr_models_dir  # noqa: E402
from tests.test_audio import silero  # noqa: E402

SECTION = "soak_sources"  # its section of docs/soak.md (the broker soak has its own)
EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")


def _publish(registry: Path, model: Path, name: str) -> None:
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(model), "--name", name, "--version", "1",
         "--registry", f"file://{registry}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def _config(work: Path, port: int) -> Path:
    video = work / "signs.mp4"
    make_orientation_video(video, fps=10, seconds_per_sign=1.0)
    speech = work / "speech.wav"
    speak("The quick brown fox jumps over the lazy dog. Hello camera, start recording now.", speech)
    registry = work / "registry"
    _publish(registry, rapidocr_models_dir() / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "cls")
    _publish(registry, silero("silero_vad.onnx"), "vad")
    cls = {
        "model": {"name": "cls", "version": "1"},
        "preprocess": {"resize": {"width": 192, "height": 48}, "color": "bgr", "mean": [0.5], "std": [0.5]},
        "postprocess": {"type": "classification", "softmax": False},
        "report": {"on_change": True},
    }
    config = {
        "device": {"id": "soak"},
        "state_dir": str(work / "state"),
        "log_level": "warning",
        "mqtt": {"host": "127.0.0.1", "port": port},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False},
        "telemetry": {"interval_s": 10},
        "pipelines": [
            {"name": "video", "source": {"type": "video", "uri": str(video), "loop": True, "fps": 5}, **cls},
            {
                "name": "gst",
                "source": {
                    "type": "video",
                    "uri": "gst:videotestsrc is-live=true ! video/x-raw,width=320,height=80,framerate=10/1 "
                    "! identity eos-after=40",
                    "reopen_min_s": 0.5,
                    "reopen_max_s": 1.0,
                },
                **cls,
            },
            {
                "name": "speech",
                "model": {"name": "vad", "version": "1"},
                "source": {"type": "audio", "uri": str(speech), "window": 512, "loop": True},
                "preprocess": {"type": "audio", "context": 64, "constants": {"sr": 16000}},
                "state": [{"input": "state", "output": "stateN"}],
                "postprocess": {"type": "threshold", "on_score": 0.5, "off_score": 0.35},
                "report": {"on_change": True},
            },
        ],
    }
    path = work / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _sample(proc: psutil.Process, status_path: Path, started: float) -> dict[str, Any]:
    row = sample_process(proc, started)
    try:
        status = json.loads(status_path.read_text())
    except (OSError, ValueError):
        return row
    pipelines = status.get("pipelines", {})
    row["inferences"] = sum(int(p.get("inferences") or 0) for p in pipelines.values())
    row["gst_reopens"] = int(pipelines.get("gst", {}).get("source", {}).get("reconnects") or 0)
    row["states"] = ",".join(f"{n}:{p.get('state')}" for n, p in sorted(pipelines.items()))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "soak.md")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        broker = Mosquitto(work / "broker")
        broker.start()
        config = _config(work, broker.port)
        agent = subprocess.Popen([EDGE_AGENT, "run", "-c", str(config)], stderr=subprocess.PIPE, text=True)
        try:
            proc = psutil.Process(agent.pid)
            started = time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(SAMPLE_S)
                if agent.poll() is not None:
                    raise SystemExit(f"edge-agent exited {agent.returncode} during the soak")
                rows.append(_sample(proc, work / "state" / "status.json", started))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            agent.terminate()
            _, log = agent.communicate(timeout=60)
            broker.stop()
    errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    # The test card's end is logged every cycle, by design (a camera that stops is an error to see).
    unexpected = [line for line in errors if "source gst: " not in line]
    first, last = rows[len(rows) // 2], rows[-1]
    growth = {key: growth_per_hour(rows, key) for key in ("rss_mb", "fds", "threads", "children")}
    table = [
        "| t s | RSS MB | fds | threads | children | inferences | gst reopens |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows[:: max(1, len(rows) // 20)] + ([rows[-1]] if len(rows) > 20 else []):
        table.append(
            f"| {row['t_s']} | {row['rss_mb']} | {row['fds']} | {row['threads']} | {row['children']} | "
            f"{row.get('inferences', '')} | {row.get('gst_reopens', '')} |"
        )
    report = "\n".join(
        [
            "# Soak: sources that fail and come back, watched for leaks",
            "",
            "Generated by `scripts/soak_sources.py`; every number comes from the run described here. "
            "Rerun with:",
            "",
            "```sh",
            f".venv/bin/python scripts/soak_sources.py --minutes {args.minutes:g} --out docs/soak.md",
            "```",
            "",
            f"- date {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} logical cores; "
            f"{platform.platform()}; {args.minutes:g} minutes, a sample every {SAMPLE_S:g} s",
            "- pipelines: a video file on loop (PP-OCR cls, 5 fps); a GStreamer test card that ends every "
            "40 frames, so gst-launch-1.0 is restarted every few seconds; espeak-ng speech on loop through "
            "silero VAD in real time. A private mosquitto on loopback takes the results.",
            f"- gst-launch-1.0 restarts during the run: {last.get('gst_reopens')}; inferences: "
            f"{last.get('inferences')}; pipeline states at the end: {last.get('states')}",
            f"- ERROR lines in the agent's log: {len(errors)}, all but {len(unexpected)} of them the test "
            "card's end, logged each cycle as a source that stopped delivering"
            + (f"; the first other: `{unexpected[0][:200]}`" if unexpected else ""),
            "",
            "A leak shows as a higher ceiling in the second half than in the first. Descriptors, threads "
            "and children step down by the GStreamer child's share when a sample falls between two of "
            "its runs, so their least-squares slopes mean little; the ranges say more:",
            "",
            "| | first half (min to max) | second half (min to max) | growth per hour, 2nd half |",
            "|---|---|---|---|",
            *[
                f"| {label} | {value_range(rows[: len(rows) // 2], key)} | "
                f"{value_range(rows[len(rows) // 2 :], key)} | {growth[key]:.1f} |"
                for key, label in (
                    ("rss_mb", "RSS MB"),
                    ("fds", "open fds"),
                    ("threads", "threads"),
                    ("children", "child processes"),
                )
            ],
            "",
            f"The second half runs from t = {first['t_s']} s to {last['t_s']} s.",
            "",
            "Samples:",
            "",
            *table,
            "",
        ]
    )
    write_section(args.out, SECTION, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
