"""`infer` for people: the backend, the latencies and the result (detections, classes, ...)."""

from __future__ import annotations

import json
from typing import Any

from agent.cli.render import cut, plain_table, say


def print_inference(data: dict[str, Any], summary: dict[str, Any] | None) -> None:
    from rich.console import Console

    console = Console()
    frame = f", frame {data['frame']}" if "frame" in data else ""
    how = f"pipeline {data['pipeline']}" if data["pipeline"] else "the model's own settings"
    say(console, f"{data['model']} on {data['input']}{frame} ({how})")
    say(
        console,
        f"backend: {data['backend']} ({data['precision']}) on {data['artifact']}: {data['backend_choice']}",
    )
    latency = data["latency_ms"]
    per = f" per window, {data['windows']} windows" if "windows" in data else ""
    say(
        console,
        f"latency: preprocess {latency['preprocess']:.2f} ms, inference {latency['inference']:.2f} ms, "
        f"postprocess {latency['postprocess']:.2f} ms{per}",
    )
    if "results" in data:
        _print_windows(console, data)
    else:
        _print_output(console, data["output"], summary)
        if data.get("held_back_by"):
            say(console, f"the pipeline would not publish it: held back by report.{data['held_back_by']}")
    if data.get("note"):
        say(console, f"note: {data['note']}")
    if "drawn" in data:
        say(console, f"wrote {data['drawn']['file']}: {data['drawn']['note']}")


def _print_output(console: Any, output: dict[str, Any], summary: dict[str, Any] | None) -> None:
    if "detections" in output:
        rows = [
            [d["label"] if d["label"] is not None else "", d["index"], f"{d['score']:.3f}",
             ", ".join(f"{v:.0f}" for v in d["box"])]
            for d in output["detections"]
        ]  # fmt: skip
        say(console, f"{len(rows)} detection(s); boxes x1, y1, x2, y2 in source pixels:")
        console.print(plain_table("", ["label", "class", "score", "box"], rows))
    elif "top" in output:
        rows = [
            [d["label"] if d["label"] is not None else "", d["index"], f"{d['score']:.4f}"]
            for d in output["top"]
        ]
        console.print(plain_table("classification", ["label", "class", "score"], rows))
    elif "regions" in output:
        rows = [
            [f"{r['score']:.3f}", r["area"], ", ".join(f"{v:.0f}" for v in r["box"])]
            for r in output["regions"]
        ]
        say(console, f"{len(rows)} region(s); boxes x1, y1, x2, y2 in source pixels:")
        console.print(plain_table("", ["score", "area", "box"], rows))
    elif "active" in output:
        say(console, f"active: {output['active']}, score {output['score']}, event {output['event']}")
    elif "outputs" in output and summary is not None:
        columns = ["output", "shape", "dtype", "min", "max", "mean", "argmax"]
        rows = [
            [
                name,
                "x".join(map(str, s["shape"])),
                s["dtype"],
                s.get("min"),
                s.get("max"),
                s.get("mean"),
                s.get("argmax"),
            ]
            for name, s in summary["outputs"].items()
        ]
        console.print(plain_table("outputs", columns, rows))
    else:  # a plugin's own dict
        say(console, json.dumps(output, indent=2, default=str))


def _print_windows(console: Any, data: dict[str, Any]) -> None:
    held = ", ".join(f"{rule} {n}" for rule, n in data["held_back"].items() if n)
    say(
        console,
        f"{len(data['results'])} result(s) the pipeline would publish"
        + (f" (held back: {held})" if held else ""),
    )
    rows = [[r["frame"], f"{r['position_s']:.3f}", cut(r["output"], 80)] for r in data["results"]]
    console.print(plain_table("", ["window", "at s", "output"], rows))
