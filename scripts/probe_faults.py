#!/usr/bin/env python3
"""Fault probe (issue 13): a real agent publishing a fast pipeline through faults, counted at a
watcher on the broker, written to docs/reliability.md.

Each scenario starts a fresh mosquitto (persistence on), a TCP proxy in front of it that the probe
can cut (the agent's uplink), a watcher subscribed on the broker directly (persistent session), and
one `edge-agent run` (the real text direction classifier on a rendered video at --fps, benchmark
off) connected through the proxy. Then:

- uplink cut: the proxy drops every connection and refuses new ones for 7 s, twice;
- broker SIGKILL: mosquitto killed and restarted after 3 s, twice;
- agent SIGKILL: the agent killed mid-stream and started again;
- outbox limit: the broker down 30 s with `outbox.max_messages: 300` (drop-oldest).

For each: results produced (the agent's count), received by the watcher (distinct seq), lost (a seq
neither received nor counted as dropped), dropped (counted by the outbox), duplicates, arrivals out
of order, and how long after the link came back the agent was delivering again.

    .venv/bin/python scripts/probe_faults.py [--fps 250] [--results 10000] [--write docs/reliability.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fleet_agents import GOOD, AgentFleet, agent_config, pipeline_body, publish_fleet_versions  # noqa: E402
from make_demo_video import make_orientation_video  # noqa: E402

from tests.delivery import as_ranges, count_delivery, seqs  # noqa: E402
from tests.mosquitto import Mosquitto, Subscriber  # noqa: E402
from tests.tcp_proxy import CuttableProxy  # noqa: E402


def run_scenario(
    name: str, fps: float, work: Path, video: Path, registry: Path, results: int
) -> dict[str, Any]:
    """One agent through one kind of fault (twice where the issue asks for it), spread over a run
    of at least `results` results."""
    broker = Mosquitto(work / f"broker-{name}", persistence=True)
    broker.start()
    proxy = CuttableProxy(broker.port)
    extra: dict[str, Any] = {}
    if name == "outbox limit":
        extra = {
            "mqtt": {
                "host": "127.0.0.1",
                "port": proxy.port,
                "reconnect_min_s": 1.0,
                "reconnect_max_s": 60.0,  # the default: the agent must not wait it out
                "outbox": {"max_messages": 300},
            }
        }
    device = f"probe-{name.replace(' ', '-')}"
    config = agent_config(
        work, device, proxy.port, registry, {"cam": pipeline_body(GOOD, video, fps)}, **extra
    )
    watcher = Subscriber(broker.host, broker.port, f"edge/{device}/results/cam", persistent=True,
                         client_id=f"watch-{device}")  # fmt: skip
    agents = AgentFleet({device: config})
    agents.start(device)
    recoveries: list[float] = []

    distinct: set[int] = set()  # seqs arrived (resent duplicates count once)
    parsed = 0

    def arrived() -> int:
        nonlocal parsed
        messages = watcher.messages
        distinct.update(seqs(messages[parsed:]))
        parsed = len(messages)
        return len(distinct)

    def wait_flow(count: int) -> None:
        deadline = time.monotonic() + 120 + 3 * count / fps
        while arrived() < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: results did not flow ({len(watcher.messages)} < {count})")
            time.sleep(0.05)

    def recovered_after(back: float) -> None:
        wait_flow(arrived() + 1)
        recoveries.append(time.monotonic() - back)

    faults = 1 if name in ("agent SIGKILL", "outbox limit") else 2
    try:
        wait_flow(50)
        for fault in range(faults):
            wait_flow(results * (fault + 1) // (faults + 1))
            if name == "uplink cut":
                proxy.cut()
                time.sleep(7)
                proxy.restore()
            elif name == "broker SIGKILL":
                assert broker._proc is not None
                broker._proc.send_signal(signal.SIGKILL)
                broker._proc.wait(30)
                broker._proc = None
                time.sleep(3)
                broker.start()
            elif name == "agent SIGKILL":
                agents.procs[device].send_signal(signal.SIGKILL)
                agents.procs[device].wait(30)
                agents.start(device)
            elif name == "outbox limit":
                broker.stop()
                time.sleep(30)
                broker.start()
            recovered_after(time.monotonic())
        wait_flow(results)
        agents.stop(device)
        status = json.loads((work / device / "state" / "status.json").read_text())
        time.sleep(2)  # the watcher takes what the broker still had queued for it
    finally:
        agents.kill_all()
        proxy.cut()
    delivery = count_delivery(seqs(watcher.messages))
    watcher.close()
    broker.close()
    dropped = status["outbox"]["dropped"]
    return {
        "scenario": name,
        "produced": delivery.produced,
        "received": delivery.received,
        "dropped": dropped,
        "lost": max(0, delivery.lost - dropped),
        "duplicates": delivery.duplicates,
        "out_of_order": delivery.out_of_order,
        "out_of_order_first": delivery.out_of_order_first,
        "faults": faults,
        "missing": as_ranges(delivery.missing),
        "recovery_s": max(recoveries) if recoveries else None,
        "pending_at_stop": status["outbox"]["pending"],
    }


SCENARIOS = ("uplink cut", "broker SIGKILL", "agent SIGKILL", "outbox limit")
_END_OF_REPORT = "<!-- end of the probe's report: what follows is kept when it is written again -->"


def report(rows: list[dict[str, Any]], fps: float, results: int) -> str:
    lines = [
        "# Reliability under faults",
        "",
        f"`scripts/probe_faults.py` on {dt.date.today()}, {platform.machine()}, "
        f"Python {platform.python_version()}, "
        f"mosquitto with persistence on loopback: one real agent (`edge-agent run`) publishing the text "
        f"direction classifier's results on a rendered video at {fps:g} fps (`--fps {fps:g} --results "
        f"{results}`) through a TCP proxy the probe cuts; a watcher subscribed on the broker (persistent "
        "session) counts what arrives by `seq`. Each run lasts at least that many results, with the faults "
        "spread evenly over it.",
        "",
        "| fault | produced | received | dropped (counted) | lost | duplicates | out of order "
        "| out of order after de-duplication | delivering again after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']}{' (twice)' if r['faults'] == 2 else ''} | {r['produced']} | "
            f"{r['received']} | {r['dropped']} | {r['lost']} | {r['duplicates']} | {r['out_of_order']} | "
            f"{r['out_of_order_first']} | {r['recovery_s']:.1f} s |"
        )
    lines += [
        "",
        "- *lost*: a sequence number that neither arrived nor was counted as dropped by the outbox's "
        "`when_full`. A broker killed with SIGKILL loses what it acknowledged and had not yet forwarded or "
        "saved; it comes back without the agent's session, so the agent sends the results of the last "
        "`mqtt.outbox.resend_window_s` (30 s) again: the *duplicates* in that row.",
        "- *out of order*: arrivals with a lower seq than the one before: duplicates resent after a cut, and "
        "after an outage the backlog drains beside live results (`outbox.backlog_share`); *after "
        "de-duplication*: the same, counting each seq's first arrival only.",
        "- *delivering again after*: from the end of the fault until the watcher saw the next result.",
        "",
        f"Re-run: `.venv/bin/python scripts/probe_faults.py --fps {fps:g} --results {results} "
        "--write docs/reliability.md`.",
        "",
        _END_OF_REPORT,
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fps", type=float, default=250.0)
    parser.add_argument("--results", type=int, default=10_000, help="at least this many per scenario")
    parser.add_argument("--write", type=Path, help="write the report here (e.g. docs/reliability.md)")
    parser.add_argument(
        "--only", choices=SCENARIOS, action="append", help="run only this scenario (repeatable)"
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="probe-faults-") as tmp:
        work = Path(tmp)
        video = work / "signs.mp4"
        # Rendered at the probe's rate: a file plays at its own rate, --fps caps it.
        make_orientation_video(video, fps=round(args.fps), seconds_per_sign=1.0)
        registry = publish_fleet_versions(work / "registry")
        for name in args.only or SCENARIOS:
            rows.append(run_scenario(name, args.fps, work, video, registry, args.results))
            print(json.dumps(rows[-1]), flush=True)
    text = report(rows, args.fps, args.results)
    print(text)
    if args.write:
        # What follows the report in the file (written by hand) is kept.
        old = args.write.read_text() if args.write.exists() else ""
        kept = old.split(_END_OF_REPORT, 1)[1].lstrip("\n") if _END_OF_REPORT in old else ""
        args.write.write_text(text + ("\n" + kept if kept else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
