#!/usr/bin/env python3
"""Benchmark: simulated devices driven by the real controller CLI against one mosquitto.

For each --counts N: a private mosquitto on a free loopback port (tests/mosquitto.py, with
per-packet logging off), N simulated devices in group `bench` (scripts/fleet_sim.py, its own
process), then `edge-agent fleet ...` as subprocesses, each timed from the outside (process start
included, as an operator sees it):

1. `fleet deploy v1 --no-wait`: time to publish a generation;
2. `fleet status --json`, polled until it shows all N converged: time from the deploy's start;
3. `fleet status --json` on a quiet fleet (median of 3): reading N reported documents;
4. `fleet deploy v2 --wait`: publish and wait until every device converged;
5. `fleet deploy v3-bad --canary 10 --wait`: a failing canary wave and its automatic rollback.

Every number in the report comes from this run:

    .venv/bin/python scripts/bench_fleet.py [--counts 1000,10000] [--delay-s 0.05]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mosquitto import Mosquitto, find_mosquitto  # noqa: E402

GROUP = "bench"
BAD_VERSION = "3.0-bad"
CLI = [sys.executable, "-m", "agent.cli", "fleet"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _spec(path: Path, version: str) -> Path:
    pipeline = {
        "name": "door-cam",
        "model": {"name": "mobilenet", "version": version},
        "source": {"type": "video", "uri": "rtsp://10.0.0.5/stream1"},
        "postprocess": {"type": "classification", "top_k": 3},
    }
    path.write_text(json.dumps({"pipelines": [pipeline], "health": {"window_s": 30}}))
    return path


def _cli(*args: str, broker: str, timeout_s: float = 900.0) -> tuple[float, int, dict[str, Any]]:
    """(seconds, exit code, the --json object) of one `edge-agent fleet` run."""
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, *args, "--json", "--broker", broker],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout_s,
        check=False,
    )
    seconds = time.monotonic() - started
    try:
        output = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(
            f"fleet {args[0]} printed no JSON (exit {proc.returncode}):\n{proc.stderr}"
        ) from None
    return seconds, proc.returncode, output


def _startup() -> float:
    """Seconds of `edge-agent version`: what every CLI run pays before it talks to the broker."""
    started = time.monotonic()
    subprocess.run([*CLI[:-1], "version"], capture_output=True, env=ENV, timeout=60, check=True)
    return time.monotonic() - started


def _start_simulator(count: int, broker: str, delay_s: float) -> tuple[subprocess.Popen[str], float]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "fleet_sim.py"),
            f"--count={count}",
            f"--group={GROUP}",
            f"--broker={broker}",
            f"--delay-s={delay_s}",
            f"--fail-versions={BAD_VERSION}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # {"ready": N, ...} once all are connected (the sim's own timeout)
    if not line:
        raise RuntimeError(f"the simulator exited with {proc.wait()} before its devices were ready")
    seconds = float(json.loads(line)["seconds"])
    print(f"  {count} simulated devices ready in {seconds:.1f} s", file=sys.stderr)
    return proc, seconds


def run(count: int, delay_s: float, workdir: Path) -> dict[str, Any]:
    broker = Mosquitto(workdir / f"mosquitto-{count}")
    # Per-packet logging ("log_type all") would cost the broker more than the fleet does.
    broker.config_path.write_text(
        broker.config_path.read_text().replace("log_type all", "log_type error\nlog_type warning")
    )
    broker.start()
    address = f"{broker.host}:{broker.port}"
    simulator, started_s = _start_simulator(count, address, delay_s)
    results: dict[str, Any] = {"devices": count, "load_before": os.getloadavg()[0], "sim_start_s": started_s}
    try:
        results["cli_startup_s"] = statistics.median(_startup() for _ in range(3))
        specs = {v: _spec(workdir / f"spec-{v}.json", v) for v in ("1.0", "2.0", BAD_VERSION)}
        started = time.monotonic()
        seconds, code, out = _cli("deploy", str(specs["1.0"]), "--group", GROUP, "--no-wait", broker=address)
        assert code == 0, out
        results["deploy_publish_s"] = seconds
        polls = []
        deadline = started + 600
        while True:
            seconds, code, out = _cli("status", "--group", GROUP, broker=address)
            polls.append(seconds)
            if out["summary"]["converged"] == count or time.monotonic() > deadline:
                break
        results["status_shows_converged_s"] = time.monotonic() - started
        results["status_polls"] = len(polls)
        assert out["summary"]["converged"] == count, out["summary"]
        quiet = [_cli("status", "--group", GROUP, broker=address) for _ in range(3)]
        assert all(q[2]["summary"]["devices"] == count for q in quiet)
        results["status_s"] = statistics.median(q[0] for q in quiet)
        seconds, code, out = _cli("deploy", str(specs["2.0"]), "--group", GROUP, "--wait", broker=address)
        assert code == 0 and out["summary"]["converged"] == count, out["summary"]
        results["deploy_wait_s"] = seconds
        results["deploy_wait_wave_s"] = out["waves"][-1]["seconds"]
        seconds, code, out = _cli(
            "deploy", str(specs[BAD_VERSION]), "--group", GROUP, "--canary", "10", broker=address
        )
        assert code == 5, out["message"]
        results["canary_rollback_s"] = seconds
        results["canaries"] = out["waves"][0]["devices"]
        results["canary_wave_s"] = out["waves"][0]["seconds"]
        results["rollback_wave_s"] = out["waves"][-1]["seconds"]
        results["broker_rss_mb"] = psutil.Process(broker._proc.pid).memory_info().rss / 2**20  # type: ignore[union-attr]
        results["simulator_rss_mb"] = psutil.Process(simulator.pid).memory_info().rss / 2**20
        results["load_after"] = os.getloadavg()[0]
    finally:
        simulator.terminate()
        try:
            simulator.wait(timeout=60)
        except subprocess.TimeoutExpired:
            simulator.kill()
        broker.close()
    return results


def _mosquitto_version() -> str:
    proc = subprocess.run([find_mosquitto(), "-h"], capture_output=True, text=True, timeout=10, check=False)
    words = (proc.stdout or proc.stderr).split()
    return f"mosquitto {words[2]}" if len(words) > 2 and words[1] == "version" else "mosquitto"


def report(rows: list[dict[str, Any]], delay_s: float) -> str:
    lines = [
        "## Benchmark: simulated devices",
        "",
        f"`scripts/bench_fleet.py` on {dt.date.today().isoformat()}, {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}, "
        f"{_mosquitto_version()} on loopback (per-packet logging off), the simulator "
        "(scripts/fleet_sim.py: one MQTT connection per device, one thread) and the CLI on the same "
        f"machine; each pipeline step takes ~{delay_s} s. CLI times are whole `edge-agent fleet` "
        "processes, start-up included "
        f"(`edge-agent version` takes {rows[0]['cli_startup_s']:.2f} s). 1-minute load average before and "
        "after each size: "
        + ", ".join(f"{r['load_before']:.1f} -> {r['load_after']:.1f}" for r in rows)
        + " (the machine was not otherwise idle).",
        "",
        "| devices | deploy --no-wait | until `fleet status` shows all converged | `fleet status` | "
        "deploy --wait | canary 10% + rollback |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']:,} | {r['deploy_publish_s']:.2f} s | {r['status_shows_converged_s']:.1f} s "
            f"({r['status_polls']} {'polls' if r['status_polls'] > 1 else 'poll'}) | {r['status_s']:.2f} s | "
            f"{r['deploy_wait_s']:.1f} s | "
            f"{r['canary_rollback_s']:.1f} s ({r['canaries']} canaries) |"
        )
    lines += [
        "",
        "Inside those runs (the waves' own times from `--json`, and the processes):",
        "",
        "| devices | simulator start (connections) | deploy --wait: its wave | canary wave | rollback wave "
        "| broker RSS | simulator RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']:,} | {r['sim_start_s']:.1f} s | {r['deploy_wait_wave_s']:.1f} s | "
            f"{r['canary_wave_s']:.1f} s | {r['rollback_wave_s']:.1f} s | {r['broker_rss_mb']:.0f} MB | "
            f"{r['simulator_rss_mb']:.0f} MB |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", default="1000,10000", help="Fleet sizes, comma-separated.")
    parser.add_argument("--delay-s", type=float, default=0.05, help="Simulated seconds per pipeline step.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for count in (int(c) for c in args.counts.split(",")):
            print(f"{count} devices", file=sys.stderr)
            rows.append(run(count, args.delay_s, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(report(rows, args.delay_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
