#!/usr/bin/env python3
"""The tracking quick start's eyes (scripts/demo_tracking.sh): the events a tracking pipeline
publishes, printed as they arrive, and its counts against the clip's truth (make_tracking_video.py).

    demo_tracking_events.py watch -c agent.yaml --truth truth.json [--ready-file F] [--timeout S]
        Reads the box's broker with the config's mqtt settings (edge-agent watch's connection and its
        line per message), prints each status and event (not the `update`s: those repeat what the
        others say; an ended track's snapshot file with its `end`), and stops once the pipeline has
        played its video and every track has ended.
    demo_tracking_events.py infer infer.json --truth truth.json
        The same counts from the events of `edge-agent infer --track --json`.

Either ends with a line per zone and line, e.g. `line door: in 3 (truth 3), out 1 (truth 1)  OK`, and
exits 0 when every count agrees with the truth, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.cli.render.watch import line
from agent.config_loader import load_config
from agent.errors import EdgeAgentError
from agent.tools.watch import Seen, Watch

SHOWN = ("new", "end", "enter", "exit", "dwell", "cross", "overcrowded")


def compare(events: Iterable[Mapping[str, Any]], truth: Mapping[str, Any], who: str) -> bool:
    """Print what `who` counted per line and zone against the truth; whether every count agrees."""
    events = list(events)
    agree = True
    print(f"\nWhat {who} counted, against what the clip shows:")
    for name, directions in truth["lines"].items():
        crossed = [e for e in events if e.get("type") == "cross" and e.get("line") == name]
        parts, ok = [], True
        for direction, expected in directions.items():
            got = sum(e.get("direction") == direction for e in crossed)
            parts.append(f"{direction} {got} (truth {expected})")
            ok &= got == expected
        print(f"  line {name}: {', '.join(parts)}  {'OK' if ok else 'WRONG'}")
        agree &= ok
    for name, expected in truth["zones"].items():
        entries = sum(e.get("type") == "enter" and e.get("zone") == name for e in events)
        dwell = sum(e.get("type") == "dwell" and e.get("zone") == name for e in events)
        ok = entries == expected["entries"] and dwell == expected["dwell"]
        print(
            f"  zone {name}: entered {entries} (truth {expected['entries']}), "
            f"dwell {dwell} (truth {expected['dwell']})  {'OK' if ok else 'WRONG'}"
        )
        agree &= ok
    return agree


def describe(seen: Seen, snapshots: Path) -> str:
    """edge-agent watch's line, and where an ended track's snapshot is."""
    event = seen.payload if seen.kind == "event" and isinstance(seen.payload, dict) else {}
    snapshot = (event.get("object") or {}).get("snapshot") if event.get("type") == "end" else None
    return line(seen) + (f"  snapshot: {snapshots / f'{snapshot}.jpg'}" if snapshot else "")


def watch(config_path: Path, truth: Mapping[str, Any], ready_file: Path | None, timeout: float) -> bool:
    config = load_config(config_path)
    pipeline = truth["pipeline"]
    box = Watch(config, pipeline)
    box.start()
    if ready_file is not None:
        ready_file.touch()
    events: dict[str, dict[str, Any]] = {}  # by id: QoS 1 may bring one twice
    state = {"finished": False}
    snapshots = config.state_dir / "snapshots" / pipeline

    def show(seen: Seen) -> None:
        payload = seen.payload if isinstance(seen.payload, dict) else {}
        if seen.kind == "status":
            own = (payload.get("pipelines") or {}).get(pipeline) or {}
            state["finished"] = own.get("state") == "finished"
            print(line(seen), flush=True)
        elif seen.kind == "event" and payload.get("id") not in events:
            events[str(payload.get("id"))] = payload
            if payload.get("type") in SHOWN:
                print(describe(seen, snapshots), flush=True)

    def done() -> bool:
        news = {e["object"]["id"] for e in events.values() if e["type"] == "new"}
        ends = {e["object"]["id"] for e in events.values() if e["type"] == "end"}
        return bool(state["finished"] and news and news <= ends)

    deadline = time.monotonic() + timeout
    try:
        while not done():
            if time.monotonic() > deadline:
                print(f"\ngave up after {timeout:.0f} s: the video did not finish with every track ended")
                return False
            box.run(show, seconds=0.5)
    finally:
        box.close()
    ordered = sorted(events.values(), key=lambda e: int(e["seq"]))
    return compare(ordered, truth, f"the agent (edge-agent run, {len(ordered)} events)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    live = commands.add_parser("watch", help="Print the events as they arrive, then the counts.")
    live.add_argument("-c", "--config", type=Path, required=True)
    live.add_argument("--truth", type=Path, required=True)
    live.add_argument("--ready-file", type=Path, help="Touched once subscribed.")
    live.add_argument("--timeout", type=float, default=150, help="Give up after this many seconds.")
    after = commands.add_parser("infer", help="The counts of `edge-agent infer --track --json`.")
    after.add_argument("result", type=Path)
    after.add_argument("--truth", type=Path, required=True)
    args = parser.parse_args()
    truth = json.loads(args.truth.read_text())
    if args.command == "infer":
        result = json.loads(args.result.read_text())
        agree = compare(result["events"], truth, f"edge-agent infer --track ({result['frames']} frames)")
    else:
        try:
            agree = watch(args.config, truth, args.ready_file, args.timeout)
        except EdgeAgentError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
