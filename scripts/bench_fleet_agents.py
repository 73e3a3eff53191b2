#!/usr/bin/env python3
"""Benchmark: real agents (`edge-agent run`, one process each) deployed to by the controller CLI.

For each --agents N: a private mosquitto on a free loopback port, the fleet registry of
scripts/fleet_agents.py, N agents each running one camera pipeline (the real text direction
classifier on a rendered video at --fps), then `edge-agent fleet deploy ... --wait --json` as a CI
job runs it, timed from the outside (process start included):

1. start: from launching the N agents until `fleet status` shows every one running;
2. memory: resident (RSS, shared libraries counted in full) and proportional (PSS) per agent;
3. a group deployment of a new version (pull, prove on its test data, build warm, swap between
   frames, health window): until every agent runs it;
4. a version that fails the health window on live frames: until every agent rolled back;
5. the deployment back to the first version.

    .venv/bin/python scripts/bench_fleet_agents.py [--agents 20,40] [--fps 2] [--window-s 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
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

from fleet_agents import (  # noqa: E402
    EDGE_AGENT,
    GOOD,
    MODEL,
    NAN_LIVE,
    NEWER,
    AgentFleet,
    agent_config,
    pipeline_body,
    publish_fleet_versions,
)
from make_demo_video import make_orientation_video  # noqa: E402

from tests.mosquitto import Mosquitto  # noqa: E402


def fleet_cli(port: int, *args: str) -> tuple[float, int, dict[str, Any]]:
    started = time.monotonic()
    result = subprocess.run(
        [EDGE_AGENT, "fleet", *args, "--broker", f"127.0.0.1:{port}", "--json"],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    took = time.monotonic() - started
    try:
        return took, result.returncode, json.loads(result.stdout)
    except ValueError:
        raise SystemExit(f"fleet {args} exit {result.returncode}: {result.stdout}\n{result.stderr}") from None


def all_in(port: int, count: int, phase: str, version: str) -> bool:
    _, _, report = fleet_cli(port, "status", "--group", "lobby")
    devices = report.get("devices", [])
    return len(devices) == count and all(
        (d["pipelines"].get("cam") or {}).get("phase") == phase
        and (d["pipelines"].get("cam") or {}).get("model") == f"{MODEL}@{version}"
        for d in devices
    )


def wait_for(check: Any, what: str, timeout_s: float = 900.0) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(1.0)  # a poll of the fleet's state, not a test: pacing the status calls
    return time.monotonic() - started


def run(count: int, fps: float, window_s: float, work: Path) -> dict[str, Any]:
    video = work / "signs.mp4"
    make_orientation_video(video, fps=10, seconds_per_sign=1.0)
    registry = publish_fleet_versions(work / "registry")
    with Mosquitto(work / "mosquitto") as broker:
        configs = {
            name: agent_config(
                work / "agents", name, broker.port, registry, {"cam": pipeline_body(GOOD, video, fps)}
            )
            for name in (f"cam-{i:03d}" for i in range(1, count + 1))
        }
        agents = AgentFleet(configs)
        try:
            started = time.monotonic()
            agents.start_all()
            wait_for(lambda: all_in(broker.port, count, "running", GOOD), f"{count} agents running")
            start_s = time.monotonic() - started
            time.sleep(5.0)  # memory after the start settles, not during imports
            memory = agents.memory()
            load = psutil.getloadavg()[0]

            def deploy(version: str) -> tuple[float, int]:
                spec = work / f"spec-{version}.yaml"
                body = {"pipelines": {"cam": pipeline_body(version, video, fps)},
                        "health": {"window_s": window_s, "min_frames": 2}}  # fmt: skip
                spec.write_text(yaml.safe_dump(body))
                took, code, _ = fleet_cli(broker.port, "deploy", str(spec), "--group", "lobby", "--wait",
                                          "--timeout", "900")  # fmt: skip
                return took, code

            new_s, new_code = deploy(NEWER)
            bad_s, bad_code = deploy(NAN_LIVE)
            back_s, back_code = deploy(GOOD)
            assert sorted(agents.alive()) == sorted(configs), "an agent died"
        finally:
            agents.stop_all()
    return {
        "agents": count,
        "start_s": start_s,
        "pss_mib": sum(m["pss"] for m in memory.values()) / 2**20,
        "pss_each_mib": statistics.median(m["pss"] for m in memory.values()) / 2**20,
        "rss_each_mib": statistics.median(m["rss"] for m in memory.values()) / 2**20,
        "load": load,
        "deploy_s": new_s,
        "deploy_code": new_code,
        "rollback_s": bad_s,
        "rollback_code": bad_code,
        "back_s": back_s,
        "back_code": back_code,
    }


def report(rows: list[dict[str, Any]], fps: float, window_s: float) -> str:
    lines = [
        f"`scripts/bench_fleet_agents.py` on {dt.date.today()}, {psutil.cpu_count()} cores "
        f"({platform.machine()}), {psutil.virtual_memory().total / 2**30:.0f} GiB, Python "
        f"{platform.python_version()}; each agent runs one camera pipeline at {fps:g} fps; health "
        f"window {window_s:g} s. Times are whole `edge-agent fleet deploy --wait` runs (exit status in "
        "brackets: 0 converged, 4 failed/rolled back as intended).",
        "",
        "| agents | all running after start | memory: PSS in all (median PSS / RSS each) | load (1 min) "
        "| deploy new version | failing version rolled back | deploy back |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['agents']} | {r['start_s']:.0f} s | {r['pss_mib']:.0f} MiB ({r['pss_each_mib']:.0f} / "
            f"{r['rss_each_mib']:.0f} MiB) | {r['load']:.1f} | {r['deploy_s']:.1f} s ({r['deploy_code']}) | "
            f"{r['rollback_s']:.1f} s ({r['rollback_code']}) | {r['back_s']:.1f} s ({r['back_code']}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="20", help="comma-separated fleet sizes")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args()
    rows = []
    for count in (int(n) for n in args.agents.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-fleet-agents-") as work:
            rows.append(run(count, args.fps, args.window_s, Path(work)))
            print(json.dumps(rows[-1]), flush=True)
    print(report(rows, args.fps, args.window_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
