#!/usr/bin/env python3
"""Benchmark: results per second through the outbox and the broker, against a bare paho QoS 1
publisher on the same broker, in one run (ratios, so a noisy machine cancels out).

- bare paho: one MQTT 5 client publishing N messages at QoS 1 with the agent's in-flight window (20),
  timed until the broker acknowledged the last one;
- backlog: N results stored in the SQLite outbox beforehand (as during an outage), then the agent's
  MqttConnection delivers them; timed from its start until the last PUBACK removed the last row
  (the outbox's own cost: reading, publishing, deleting);
- live: a writer thread storing N results (sequence number and all, as a pipeline does) while the
  connection delivers them; timed from the first put (the cost of storing is in it too).
Each in both durability modes: crash-safe (the default) and power-loss-safe (fsync, grouped
commits). Every path is checked to end with every result acknowledged and nothing left queued.

    .venv/bin/python scripts/bench_outbox.py [--results 20000] [--rounds 3] [--pin]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import MqttConfig  # noqa: E402
from agent.mqtt.connection import MqttConnection  # noqa: E402
from agent.mqtt.outbox import Outbox  # noqa: E402
from tests.mosquitto import Mosquitto  # noqa: E402

PAYLOAD = json.dumps(
    {"id": "x" * 36, "output": {"top": [{"label": "upright", "score": 0.98}]}, "pad": "y" * 400}
)
TOPIC = "edge/bench/results/cam"
INFLIGHT = 20


def bare_paho(broker: Mosquitto, count: int) -> tuple[float, float]:
    done = threading.Event()
    acked = 0

    def on_publish(*_args: object) -> None:
        nonlocal acked
        acked += 1
        if acked == count:
            done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-bare", protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(INFLIGHT)
    client.max_queued_messages_set(0)
    client.on_publish = on_publish
    client.connect(broker.host, broker.port)
    client.loop_start()
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        client.publish(TOPIC, PAYLOAD, qos=1)
    if not done.wait(600):
        raise SystemExit("bare paho: not every publish was acknowledged")
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    client.disconnect()
    client.loop_stop()
    return count / took, cpu / count


def through_outbox(
    broker: Mosquitto, count: int, durability: str, work: Path, live: bool
) -> tuple[float, float]:
    """live: a writer stores the results while the connection delivers them (timed from the first
    put); otherwise the outbox is filled first, as during an outage, and the backlog is timed from
    the connection's start until the last row is gone."""
    outbox = Outbox(work / f"outbox-{durability}-{time.monotonic_ns()}.db", max_messages=count + 10,
                    durability=durability)  # fmt: skip
    config = MqttConfig(host=broker.host, port=broker.port, outbox={"max_inflight": INFLIGHT})  # type: ignore[arg-type]
    conn = MqttConnection(config, "bench", outbox, lambda: b"online", lambda: b"offline")
    payload = PAYLOAD.encode()

    def write() -> None:
        for _ in range(count):
            outbox.put_numbered(TOPIC, lambda _seq: payload, stream="results/cam")
            conn.notify_new_message()

    if not live:
        write()
        outbox.close()  # committed and closed, as a restart after an outage finds it
        outbox = Outbox(outbox.path, max_messages=count + 10, durability=durability)
        conn = MqttConnection(config, "bench", outbox, lambda: b"online", lambda: b"offline")
        started, cpu = time.perf_counter(), time.process_time()
    conn.start()
    deadline = time.monotonic() + 30
    while not conn.connected:
        if time.monotonic() > deadline:
            raise SystemExit("the connection did not come up")
        time.sleep(0.05)
    writer = threading.Thread(target=write)
    if live:
        started, cpu = time.perf_counter(), time.process_time()
        writer.start()
    while outbox.stats()["acked_total"] < count:
        if time.perf_counter() - started > 600:
            raise SystemExit(
                f"outbox ({durability}): only {outbox.stats()['acked_total']} of {count} delivered"
            )
        time.sleep(0.01)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    if live:
        writer.join()
    if outbox.pending():
        raise SystemExit(f"outbox ({durability}): {outbox.pending()} left after {count} acknowledged")
    conn.stop(publish_offline=False)
    outbox.close()
    return count / took, cpu / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the broker on the last CPU, this process (every path's Python) on the first: the paths "
        "then compete with paho's own work only, not with the broker's",
    )
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    if args.pin:
        os.sched_setaffinity(0, {cores[0]})  # before any thread starts: they inherit it
    paths = {  # name: (durability, live)
        "bare": ("", False),
        "backlog, crash-safe": ("crash-safe", False),
        "backlog, power-loss-safe": ("power-loss-safe", False),
        "live, crash-safe": ("crash-safe", True),
        "live, power-loss-safe": ("power-loss-safe", True),
    }
    rates: dict[str, list[float]] = {name: [] for name in paths}
    cpus: dict[str, list[float]] = {name: [] for name in rates}
    with (
        tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp,
        Mosquitto(Path(tmp) / "broker") as broker,
    ):
        if args.pin:
            assert broker._proc is not None
            os.sched_setaffinity(broker._proc.pid, {cores[-1]})
        for _ in range(args.rounds):  # interleaved, so a noisy stretch hits every kind
            for name in rates:
                durability, live = paths[name]
                rate, cpu = (
                    bare_paho(broker, args.results)
                    if name == "bare"
                    else through_outbox(broker, args.results, durability, Path(tmp), live)
                )
                rates[name].append(rate)
                cpus[name].append(cpu)
            print(json.dumps({k: round(v[-1]) for k, v in rates.items()}), flush=True)
    bare = statistics.median(rates["bare"])
    print(
        f"\n`scripts/bench_outbox.py` on {dt.date.today()}, {psutil.cpu_count()} cores "
        f"({platform.machine()}), "
        f"Python {platform.python_version()}, mosquitto on loopback"
        f"{f' (pinned to CPU {cores[-1]}, this process to CPU {cores[0]})' if args.pin else ''}; "
        f"{args.results} results of "
        f"{len(PAYLOAD)} bytes, median of {args.rounds} interleaved rounds:\n"
    )
    print("| path | results/s | vs bare paho | CPU µs per result (this process, not the broker) |")
    print("|---|---|---|---|")
    for name, values in rates.items():
        rate = statistics.median(values)
        cpu_us = statistics.median(cpus[name]) * 1e6
        print(f"| {name} | {rate:,.0f} | {rate / bare:.2f}x | {cpu_us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
