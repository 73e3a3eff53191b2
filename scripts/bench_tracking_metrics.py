#!/usr/bin/env python3
"""Benchmark: tracking accuracy and per-frame time of our ByteTrack (agent/processing/tracking.py)
against roboflow `trackers`' ByteTrackTracker on the same synthetic detections (issue 27).

The scenarios, the reference runs and the metrics are tests/tracking_sequences.py's, the ones
tests/test_tracking_metrics.py asserts on; this script prints them as a Markdown table with
per-frame times and can write them into docs/benchmarks.md:

    .venv/bin/python scripts/bench_tracking_metrics.py [--repeat 5] [--doc docs/benchmarks.md]

Per-frame time is `perf_counter` around one frame's call, converting our (N, 6) array into the
tracker's input included (`sv.Detections` for the reference, as the daemon would pay): the median
over a run's frames, then the median over `--repeat` runs, interleaved so that a slow spell of the
machine hits every tracker alike. MOTA, IDF1 and the counts come from the first run (the trackers
are deterministic). Needs motmetrics, trackers and supervision, as tests/test_tracking_metrics.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import TrackConfig  # noqa: E402
from tests import tracking_sequences as ts  # noqa: E402

SECTION = "## Tracking accuracy (issue 27)"
COMMAND = ".venv/bin/python scripts/bench_tracking_metrics.py --repeat {repeat} --doc docs/benchmarks.md"


@dataclass
class Row:
    scenario: str
    description: str
    frames: int
    objects: int
    tracker: str
    scores: ts.Scores
    ms: float  # median over runs of the per-frame median
    ms_p95: float
    ms_runs: list[float]


def trackers(cfg: TrackConfig) -> dict[str, Callable[[], ts.Step]]:
    return {
        "ours": lambda: ts.ours(cfg),
        "trackers, our thresholds": lambda: ts.reference(cfg),
        "trackers, its defaults": ts.reference_defaults,
    }


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    cpu = model.group(1).strip() if model else platform.processor() or "unknown CPU"
    return f"{cpu}, {os.cpu_count()} logical cores, {platform.machine()}, Python {platform.python_version()}"


def loadavg() -> str:
    try:
        return ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def measure(repeat: int, names: list[str]) -> list[Row]:
    cfg = TrackConfig()
    rows: list[Row] = []
    for name in names:
        seq = ts.SCENARIOS[name]()
        makers = trackers(cfg)
        medians: dict[str, list[float]] = {t: [] for t in makers}
        p95: dict[str, list[float]] = {t: [] for t in makers}
        scores: dict[str, ts.Scores] = {}
        for r in range(repeat):
            for tracker, make in makers.items():
                out = ts.run(seq, make())
                per = sorted(out.seconds)
                medians[tracker].append(statistics.median(per) * 1e3)
                p95[tracker].append(per[int(0.95 * (len(per) - 1))] * 1e3)
                if r == 0:
                    scores[tracker] = ts.evaluate(seq, out)
        for tracker in makers:
            rows.append(
                Row(
                    name,
                    seq.description,
                    seq.frames,
                    seq.objects,
                    tracker,
                    scores[tracker],
                    statistics.median(medians[tracker]),
                    statistics.median(p95[tracker]),
                    medians[tracker],
                )
            )
        print(f"{name}: done", file=sys.stderr, flush=True)
    return rows


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| scenario | frames, objects | tracker | MOTA | IDF1 | ID switches | misses | false positives "
        "| ms per frame, median (p95) | run medians, ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.scores
        lines.append(
            f"| {r.scenario} | {r.frames}, {r.objects} | {r.tracker} | {s.mota:.3f} | {s.idf1:.3f} "
            f"| {s.switches} | {s.misses} | {s.false_positives} | {r.ms:.3f} ({r.ms_p95:.3f}) "
            f"| {', '.join(f'{v:.3f}' for v in r.ms_runs)} |"
        )
    return lines


def section(rows: list[Row], repeat: int, started: str, load: tuple[str, str], wall: float) -> str:
    cfg = TrackConfig()
    scenarios = {r.scenario: r.description for r in rows}
    ours = {r.scenario: r.scores for r in rows if r.tracker == "ours"}
    ours_ms = {r.scenario: r.ms for r in rows if r.tracker == "ours"}
    deltas = [
        (ours[r.scenario].mota - r.scores.mota, ours[r.scenario].idf1 - r.scores.idf1)
        for r in rows
        if r.tracker != "ours"
    ]
    speed = [r.ms / ours_ms[r.scenario] for r in rows if r.tracker != "ours"]
    lines = [
        SECTION,
        "",
        f"`scripts/bench_tracking_metrics.py` on {started}, {machine()}, numpy {version('numpy')}, "
        f"lap {version('lap')}, trackers {version('trackers')}, supervision {version('supervision')}, "
        f"motmetrics {version('motmetrics')}; load average at start / end {load[0]} / {load[1]}; "
        f"{wall:.0f} s in all. Re-run: `{COMMAND.format(repeat=repeat)}`.",
        "",
        "Our ByteTrack (agent/processing/tracking.py, the default `TrackConfig`: high score "
        f"{cfg.high_score:g}, low {cfg.low_score:g}, new track {cfg.new_track_score:g}, IoU "
        f"{cfg.min_iou:g}, {cfg.min_hits} hits, {cfg.max_lost_s:g} s lost, per label) against roboflow "
        "`trackers`' ByteTrackTracker on the same detections, both fed each frame's capture time: "
        "once with our thresholds (`lost_track_buffer` 30 = 1 s), once with its own defaults. "
        "Detections are synthetic with known tracks (tests/tracking_sequences.py, fixed seeds), "
        "tracked objects are the detections a tracker gave an id, scored with motmetrics at IoU >= 0.5 "
        "against every object at least 20 % visible. tests/test_tracking_metrics.py asserts ours "
        "within 0.02 of both references in MOTA and IDF1 on every scenario, or better.",
        "",
        "Scenarios:",
        "",
    ]
    lines += [f"- **{name}**: {text}." for name, text in scenarios.items()]
    lines += [
        "",
        *table(rows),
        "",
        f"Ours minus the reference over the {len(deltas)} comparisons: MOTA "
        f"{min(d[0] for d in deltas):+.3f} to {max(d[0] for d in deltas):+.3f}, IDF1 "
        f"{min(d[1] for d in deltas):+.3f} to {max(d[1] for d in deltas):+.3f}. Per-frame time is the "
        f"median of {repeat} interleaved runs (each run's median over its frames); the reference's "
        "includes building its `sv.Detections`; reference / ours: "
        f"x{min(speed):.1f} to x{max(speed):.1f}. The `bouncing` scenario is the sequence "
        "docs/tracking-choice.md measured the candidate trackers on (same seed, same detections).",
        "",
    ]
    return "\n".join(lines)


def write_doc(path: Path, text: str) -> None:
    """Replace the section (up to the next `## ` heading) in `path`, or append it."""
    doc = path.read_text() if path.exists() else ""
    start = doc.find(SECTION + "\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        after = doc.find("\n## ", start + len(SECTION))
        doc = doc[:start] + text + ("\n" + doc[after + 1 :] if after >= 0 else "")
    path.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per tracker and scenario")
    parser.add_argument("--scenario", action="append", choices=list(ts.SCENARIOS), help="default: all")
    parser.add_argument("--doc", type=Path, help="write the section into this Markdown file")
    args = parser.parse_args()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = loadavg()
    t0 = time.perf_counter()
    rows = measure(max(args.repeat, 1), args.scenario or list(ts.SCENARIOS))
    text = section(rows, max(args.repeat, 1), started, (load_start, loadavg()), time.perf_counter() - t0)
    print(text)
    if args.doc:
        write_doc(args.doc, text)
        print(f"wrote {args.doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
