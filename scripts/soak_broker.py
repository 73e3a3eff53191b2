#!/usr/bin/env python3
"""Soak: one pipeline at 10 fps while the broker is stopped and started again every five minutes,
for an hour; every result counted at a watcher, the daemon watched for leaks.

A private mosquitto on a free loopback port, with persistence on: a clean stop (SIGTERM) saves its
sessions and what is queued for them, so a restart loses nothing a persistent subscriber was owed.
A watcher subscribed on it (QoS 1, persistent session) records every result's seq and produced_at.
`edge-agent run` (a subprocess) runs the real text direction classifier (PP-OCR cls) on a rendered
video on loop at --fps; its outbox keeps results while the broker is away and deletes a row only on
the broker's PUBACK.

Every --bounce-every-s the broker is stopped cleanly and started again on the same port after
--down-s. Every SAMPLE_S the daemon's RSS, fds, threads and children are sampled (psutil). At the
end the agent is stopped (SIGTERM: it flushes its outbox), the watcher drained, and the report says:
results made (the agent's status.json), acknowledged by the broker (the agent's count), received at
the watcher, lost (missing seqs), duplicates, arrivals out of order; per bounce, how long until the
watcher had a new result and a live one (made after the broker was back); RSS in the first and the
second half, its growth per hour over the second half (least squares), and from the end of warm-up
to the end. Every number comes from the run; it replaces only this script's section of --out:

    .venv/bin/python scripts/soak_broker.py [--minutes 60] [--bounce-every-s 300] [--down-s 5] \
        [--out docs/soak.md]
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
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from agent.clock import iso_utc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fleet_agents import GOOD, AgentFleet, agent_config, pipeline_body, publish_fleet_versions  # noqa: E402
from make_demo_video import make_orientation_video  # noqa: E402
from soak_common import SAMPLE_S, growth_per_hour, sample_process, value_range, write_section  # noqa: E402

from tests.agent_process import read_status  # noqa: E402
from tests.delivery import as_ranges, count_delivery  # noqa: E402
from tests.mosquitto import Mosquitto, Subscriber, find_mosquitto  # noqa: E402

SECTION = "soak_broker"  # its section of docs/soak.md (the sources soak has its own)
DEVICE = "soak-broker"
PIPELINE = "cam"
FIRST_RESULT_TIMEOUT_S = 300.0  # model pull and load on a busy 2-core box
DRAIN_TIMEOUT_S = 120.0


class Tally:
    """The watcher's arrivals, read incrementally: seqs in arrival order, and the newest produced_at."""

    def __init__(self, watcher: Subscriber) -> None:
        self.watcher = watcher
        self.arrivals: list[int] = []
        self.max_seq = 0
        self.newest_produced = ""  # ISO UTC strings compare in time order

    def update(self) -> None:
        messages = self.watcher.messages
        for message in messages[len(self.arrivals) :]:
            result = json.loads(message.payload)
            self.arrivals.append(int(result["seq"]))
            self.max_seq = max(self.max_seq, self.arrivals[-1])
            self.newest_produced = max(self.newest_produced, str(result["produced_at"]))


def bounce_offsets(minutes: float, every_s: float, down_s: float) -> list[float]:
    """When to stop the broker (s after the start): every `every_s`, each outage (and a minute to
    deliver again) inside the run."""
    offsets, k = [], 1
    while k * every_s + down_s + 60.0 <= minutes * 60.0:
        offsets.append(k * every_s)
        k += 1
    return offsets


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    video = work / "signs.mp4"
    make_orientation_video(video, fps=10, seconds_per_sign=1.0)
    registry = publish_fleet_versions(work / "registry")
    broker = Mosquitto(work / "broker", persistence=True)
    broker.start()
    config = agent_config(
        work, DEVICE, broker.port, registry, {PIPELINE: pipeline_body(GOOD, video, args.fps)}
    )
    watcher = Subscriber(broker.host, broker.port, f"edge/{DEVICE}/results/{PIPELINE}", persistent=True,
                         client_id="soak-watcher")  # fmt: skip
    tally = Tally(watcher)
    agents = AgentFleet({DEVICE: config})
    agents.start(DEVICE)
    state_dir = config.parent / "state"
    rows: list[dict[str, Any]] = []
    bounces: list[dict[str, Any]] = []
    try:
        proc = psutil.Process(agents.procs[DEVICE].pid)
        deadline = time.monotonic() + FIRST_RESULT_TIMEOUT_S
        while not tally.max_seq:
            if time.monotonic() > deadline or agents.procs[DEVICE].poll() is not None:
                raise SystemExit(
                    f"no result within {FIRST_RESULT_TIMEOUT_S} s:\n{agents.log(DEVICE)[-3000:]}"
                )
            time.sleep(0.1)
            tally.update()
        started = time.monotonic()
        end = started + args.minutes * 60.0
        plan = [started + s for s in bounce_offsets(args.minutes, args.bounce_every_s, args.down_s)]
        next_sample = started + SAMPLE_S
        down_since: float | None = None
        open_bounce: dict[str, Any] | None = None
        while (now := time.monotonic()) < end:
            if agents.procs[DEVICE].poll() is not None:
                raise SystemExit(f"edge-agent exited during the soak:\n{agents.log(DEVICE)[-3000:]}")
            tally.update()
            if plan and now >= plan[0] and down_since is None and open_bounce is None:
                plan.pop(0)
                bounce = {"at_s": round(now - started, 1), "last_seq_before": tally.max_seq}
                broker.stop()
                down_since = time.monotonic()
                bounce["stop_took_s"] = round(down_since - now, 2)
                open_bounce = bounce
            if down_since is not None and now - down_since >= args.down_s:
                assert open_bounce is not None
                broker.start()
                open_bounce["up"] = time.monotonic()
                open_bounce["up_iso"] = iso_utc(time.time())  # the agent's format: the strings compare
                open_bounce["down_s"] = round(open_bounce["up"] - down_since, 1)
                down_since = None
            if open_bounce is not None and "up" in open_bounce:
                waited = round(time.monotonic() - open_bounce["up"], 2)
                if "new_after_s" not in open_bounce and tally.max_seq > open_bounce["last_seq_before"]:
                    open_bounce["new_after_s"] = waited
                if tally.newest_produced >= open_bounce["up_iso"]:
                    open_bounce["live_after_s"] = waited
                    bounces.append(open_bounce)
                    open_bounce = None
            if now >= next_sample:
                row = sample_process(proc, started)
                status = read_status(state_dir)
                row["results"] = status.get("pipelines", {}).get(PIPELINE, {}).get("results")
                row["pending"] = status.get("outbox", {}).get("pending")
                row["received"] = len(tally.arrivals)
                rows.append(row)
                print(json.dumps(row), flush=True)
                next_sample += SAMPLE_S
            time.sleep(0.05)
        if open_bounce is not None:
            bounces.append(open_bounce)  # never delivering again: shown as such
        if not broker.running:
            broker.start()
        code = agents.stop(DEVICE, timeout=180.0)
        status = read_status(state_dir)
        produced = int(status["pipelines"][PIPELINE]["results"])
        acked = int(status["outbox"]["acked_total"])
        drain_deadline = time.monotonic() + DRAIN_TIMEOUT_S
        tally.update()
        while len(set(tally.arrivals)) < produced and time.monotonic() < drain_deadline:
            time.sleep(0.2)
            tally.update()
        time.sleep(3.0)  # late duplicates
        tally.update()
        log = agents.log(DEVICE)
    finally:
        agents.kill_all()
        watcher.close()
        broker.close()
    return {
        "rows": rows,
        "bounces": bounces,
        "delivery": count_delivery(tally.arrivals, produced),
        "produced": produced,
        "acked": acked,
        "outbox": status["outbox"],
        "results_dropped": status["pipelines"][PIPELINE].get("results_dropped"),
        "exit_code": code,
        "errors": [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line],
    }


def rss_at(rows: list[dict[str, Any]], t_s: float) -> dict[str, Any]:
    """The first sample at or after t_s (the last one if none)."""
    return next((row for row in rows if row["t_s"] >= t_s), rows[-1])


def error_kinds(lines: list[str]) -> list[tuple[str, int]]:
    """ERROR lines without their timestamps, counted, the most frequent first."""
    kinds = Counter(line.split(" ERROR ", 1)[-1] for line in lines)
    return kinds.most_common()


def mosquitto_version() -> str:
    done = subprocess.run([find_mosquitto(), "-h"], capture_output=True, text=True, timeout=30)
    return (done.stdout.splitlines() or ["mosquitto"])[0]


def report(args: argparse.Namespace, run: dict[str, Any]) -> str:
    rows, bounces, delivery = run["rows"], run["bounces"], run["delivery"]
    half = len(rows) // 2
    warmup_s = min(args.warmup_minutes, args.minutes / 2) * 60.0
    warm, last = rss_at(rows, warmup_s), rows[-1]
    growth = {key: growth_per_hour(rows, key) for key in ("rss_mb", "fds", "threads")}
    new_after = [b["new_after_s"] for b in bounces if "new_after_s" in b]
    live_after = [b["live_after_s"] for b in bounces if "live_after_s" in b]
    never = sum(1 for b in bounces if "live_after_s" not in b)
    rss_growth = last["rss_mb"] - warm["rss_mb"]
    verdict = (
        f"**{'met' if rss_growth < 5.0 and delivery.lost == 0 else 'NOT met'}** "
        f"(target: < 5 MB RSS growth after warm-up, 0 lost): {rss_growth:+.1f} MB from t = {warm['t_s']} s "
        f"to the end, {delivery.lost} lost"
    )
    table = [
        "| t s | RSS MB | fds | threads | results | received | outbox pending |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows[:: max(1, len(rows) // 24)] + ([rows[-1]] if len(rows) > 24 else []):
        table.append(
            f"| {row['t_s']} | {row['rss_mb']} | {row['fds']} | {row['threads']} | "
            f"{row.get('results', '')} | {row.get('received', '')} | {row.get('pending', '')} |"
        )
    bounce_rows = ["| # | stopped at t s | stop took s | down s | new result after s | live result after s |",
                   "|---|---|---|---|---|---|"]  # fmt: skip
    for i, b in enumerate(bounces, 1):
        bounce_rows.append(
            f"| {i} | {b['at_s']} | {b['stop_took_s']} | {b.get('down_s', '-')} | "
            f"{b.get('new_after_s', 'never')} | {b.get('live_after_s', 'never')} |"
        )
    outbox = run["outbox"]
    return "\n".join(
        [
            "# Soak: the broker bounced every few minutes, every result counted",
            "",
            "Generated by `scripts/soak_broker.py`; every number comes from the run described here. "
            "Rerun with:",
            "",
            "```sh",
            f".venv/bin/python scripts/soak_broker.py --minutes {args.minutes:g} --bounce-every-s "
            f"{args.bounce_every_s:g} --down-s {args.down_s:g} --out docs/soak.md",
            "```",
            "",
            f"- date {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} logical cores; "
            f"{platform.platform()}; {args.minutes:g} minutes from the first result, a sample every "
            f"{SAMPLE_S:g} s",
            f"- one pipeline: a rendered video on loop through the PP-OCR text direction classifier at "
            f"{args.fps:g} fps (`edge-agent run`, a subprocess); a private mosquitto "
            f"({mosquitto_version()}, "
            "persistence on) on loopback, stopped cleanly (SIGTERM) and started again on the same port "
            f"every {args.bounce_every_s:g} s, down {args.down_s:g} s each time: {len(bounces)} bounces",
            "- a watcher on the broker (QoS 1, persistent session) counts the results by `seq`; the agent "
            f"was stopped (SIGTERM, exit {run['exit_code']}) at the end, flushing its outbox, and the "
            "watcher drained",
            f"- verdict: {verdict}",
            "",
            "## Results",
            "",
            "| made (agent) | acknowledged by the broker (agent) | dropped by the outbox "
            "| left in the outbox | received (distinct) | lost | duplicates | out of order |",
            "|---|---|---|---|---|---|---|---|",
            f"| {run['produced']} | {run['acked']} | {outbox['dropped']} | {outbox['pending']} | "
            f"{delivery.received} | {delivery.lost} | {delivery.duplicates} | {delivery.out_of_order} |",
            "",
            "- *lost*: a seq from 1 to the agent's last that never reached the watcher"
            + (f": {as_ranges(delivery.missing)}" if delivery.missing else "")
            + ". *acknowledged*: the broker's PUBACKs as the agent's outbox counted them (a row leaves the "
            "outbox only on one); the broker may then lose what it acknowledged, which shows as lost here.",
            "- *out of order*: arrivals with a lower seq than the one before (after an outage the backlog "
            "drains beside live results, `outbox.backlog_share`, and a result whose PUBACK was lost is "
            "resent).",
            f"- ERROR lines in the agent's log: {len(run['errors'])}"
            + "".join(f"; {n} x `{text[:160]}`" for text, n in error_kinds(run["errors"])),
            "",
            "## Bounces",
            "",
            "*new result after*: from the broker's start until the watcher had a seq higher than any "
            "before the stop; *live result after*: until it had one made after the broker was back (the "
            "backlog drained or interleaved).",
            "",
            *bounce_rows,
            "",
            (
                f"New result after {min(new_after):.1f} to {max(new_after):.1f} s; live after "
                f"{min(live_after):.1f} to {max(live_after):.1f} s"
                if new_after and live_after
                else "No bounce delivered again"
            )
            + (f"; {never} never delivered a live result again." if never else "."),
            "",
            "## Memory and resources",
            "",
            f"Warm-up: the first {warmup_s / 60:g} minutes. RSS at t = {warm['t_s']} s: "
            f"{warm['rss_mb']} MB; at the end (t = {last['t_s']} s): {last['rss_mb']} MB; growth "
            f"{rss_growth:+.1f} MB. The second half runs from t = {rows[half]['t_s']} s. A sample taken "
            "while the broker is down counts one descriptor fewer (the MQTT socket), so the slope for "
            "descriptors depends on where the samples fall; their ranges say more.",
            "",
            "| | first half (min to max) | second half (min to max) "
            "| growth per hour, 2nd half (least squares) |",
            "|---|---|---|---|",
            *[
                f"| {label} | {value_range(rows[:half], key)} | {value_range(rows[half:], key)} "
                f"| {growth[key]:.1f} |"
                for key, label in (("rss_mb", "RSS MB"), ("fds", "open fds"), ("threads", "threads"))
            ],
            "",
            "Samples:",
            "",
            *table,
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--bounce-every-s", type=float, default=300.0)
    parser.add_argument("--down-s", type=float, default=5.0, help="the broker stays down this long")
    parser.add_argument("--fps", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=10.0, help="at most half the run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "soak.md")
    parser.add_argument("--work", type=Path, help="keep the run's files (agent and broker logs) here")
    args = parser.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        run = soak(args, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="soak-broker-") as tmp:
            run = soak(args, Path(tmp))
    text = report(args, run)
    write_section(args.out, SECTION, text)
    print(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
