"""`infer` for people: the backend, the latencies and the result (detections, classes, ...); with
--track the events as they happen, one line each, and a summary at the end."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from agent.cli.render import cut, plain_table, say


def print_inference(data: dict[str, Any], summary: dict[str, Any] | None) -> None:
    from rich.console import Console

    console = Console()
    frame = f", frame {data['frame']}" if "frame" in data else ""
    how = f"pipeline {data['pipeline']}" if data["pipeline"] else "the model's own settings"
    say(console, f"{data['model']} on {data['input']}{frame} ({how})")
    _print_backend(console, data)
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


def _print_backend(console: Any, data: dict[str, Any]) -> None:
    say(
        console,
        f"backend: {data['backend']} ({data['precision']}) on {data['artifact']}: {data['backend_choice']}",
    )


# --- infer --track ---------------------------------------------------------------------------------


class TrackPrinter:
    """`infer --track` for people: the model and backend once the first frame ran, a line per event
    as it happens (`00:03.2  enter  loading-bay  person #3`; an object's `update` says nothing its
    enter, exit or cross did not), and the summary at the end."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.events = 0

    def start(self, result: Any) -> None:
        data = result.to_dict()
        how = f"pipeline {data['pipeline']}" if data["pipeline"] else "the model's own settings"
        width, height = data["size"]
        # A camera's rate is what it gives (said at the end); an image is its one frame.
        clip = {
            "camera": f"{width}x{height}, tracking every frame the camera gives",
            "image": f"{width}x{height}, one image: one frame",
        }.get(data["kind"], f"{width}x{height} at {data['fps']:g} fps, tracking every frame")
        say(self.console, f"{data['model']} on {data['input']} ({how}): {clip}")
        _print_backend(self.console, data)
        for line in attribute_lines(data.get("attributes") or {}):
            say(self.console, line)

    def event(self, event: dict[str, Any]) -> None:
        line = event_line(event)
        if line is not None:
            self.events += 1
            say(self.console, line)

    def end(self, data: dict[str, Any]) -> None:
        console = self.console
        if self.events == 0:
            say(console, "no events: nothing was tracked")
        latency = data["latency_ms"]
        say(
            console,
            f"{data['frames']} frame(s); per frame: preprocess {latency['preprocess']:.2f} ms, inference "
            f"{latency['inference']:.2f} ms, postprocess {latency['postprocess']:.2f} ms",
        )
        for line in summary_lines(data["tracking"]):
            say(console, line)
        for line in attribute_lines(data.get("attributes") or {}, read=True):
            say(console, line)
        if data.get("note"):
            say(console, f"note: {data['note']}")
        if "drawn" in data:
            say(console, f"wrote {data['drawn']['file']}: {data['drawn']['note']}")


def track_printer() -> TrackPrinter:
    from rich.console import Console

    return TrackPrinter(Console())


def clock(seconds: float) -> str:
    """A position in a clip: 03.2 s as `00:03.2`, past the hour `1:02:03.2`."""
    tenths = round(seconds * 10)
    minutes, tenth_seconds = divmod(tenths, 600)
    hours, minutes = divmod(minutes, 60)
    text = f"{minutes:02d}:{tenth_seconds // 10:02d}.{tenth_seconds % 10}"
    return f"{hours}:{text}" if hours else text


def _who(obj: dict[str, Any]) -> str:
    return f"{obj.get('label', '?')} #{obj.get('id', '?')}"


def _read(obj: dict[str, Any]) -> str:
    """What second models read on the object, after its other words: ` | text: GATE 42`."""
    from agent.processing.drawing import attributes_text  # (OpenCV: not for every command's start)

    text = attributes_text(obj.get("attributes"))
    return f" | {text}" if text else ""


def attribute_lines(attributes: dict[str, Any], read: bool = False) -> list[str]:
    """A pipeline's second models: where each runs (or why it could not load); `read`: and what it
    read (crops, answers, readings per track, mean time)."""
    lines = []
    for name, shown in attributes.items():
        if "error" in shown:
            lines.append(f"attribute {name}: left out: {shown['error']}")
            continue
        line = f"attribute {name}: {shown['model']} on {shown['backend']} ({shown['precision']})"
        if read:
            per_track = shown.get("reads_per_track")
            mean = shown.get("mean_ms")
            line += (
                f": {shown.get('crops', 0)} crop(s) read, {shown.get('answered', 0)} answer(s) on "
                f"{shown.get('tracks', 0)} track(s)"
                + (f", {per_track:g} reading(s) a track" if per_track is not None else "")
                + (f", {mean:.2f} ms a run" if mean is not None else "")
            )
            extra = [f"{k} {shown[k]}" for k in ("unsure", "failed", "late") if shown.get(k)]
            if extra:
                line += " (" + ", ".join(extra) + ")"
            if shown.get("last_error"):
                line += f"; last error: {shown['last_error']}"
        elif shown.get("why"):
            line += f": {shown['why']}"
        lines.append(line)
    return lines


def _seen_for(obj: dict[str, Any]) -> str:
    try:  # RFC 3339 with Z: Python 3.10's fromisoformat wants +00:00
        first = datetime.fromisoformat(str(obj["first_seen"]).replace("Z", "+00:00"))
        last = datetime.fromisoformat(str(obj["last_seen"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return ""
    return f", seen {(last - first).total_seconds():.1f} s"


def event_line(event: dict[str, Any]) -> str | None:
    """One event as a line (None for an `update` but one with what a second model read: its other
    causes have lines of their own). An object's line ends with its attributes once read."""
    kind = event.get("type")
    obj = event.get("object") or {}
    at = clock(float(event.get("position_s", 0.0)))
    if kind == "update" and "attributes" in (event.get("changed") or []):
        return f"{at}  {'read':<5}  {_who(obj)}{_read(obj)}"
    if kind == "new":
        text = f"{_who(obj)} (score {float(obj.get('score', 0)):.2f})"
    elif kind == "enter":
        text = f"{event['zone']}  {_who(obj)}"
    elif kind == "exit":
        why = "" if event.get("reason") == "left" else f", {event.get('reason')}"
        text = f"{event['zone']}  {_who(obj)} (stayed {float(event.get('stayed_s', 0)):.1f} s{why})"
    elif kind == "cross":
        text = f"{event['line']}  {event['direction']}  {_who(obj)}"
    elif kind == "dwell":
        text = f"{event['zone']}  {_who(obj)} (inside {float(event.get('stayed_s', 0)):.1f} s)"
    elif kind == "overcrowded":
        inside = f"{event.get('count')} inside (max {event.get('max_objects')})"
        text = f"{event['zone']}  {event.get('state')}: {inside}"
    elif kind == "end":
        text = f"{_who(obj)} ({event.get('reason')}{_seen_for(obj)})"
    else:
        return None
    if kind != "overcrowded":
        text += _read(obj)
    return f"{at}  {kind:<5}  {text}"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary of a tracked clip: tracks, per zone entries and exits, per line crossings."""
    lines = [f"tracks: {summary['tracks']} ({summary['open_at_end']} open at the end of the clip)"]
    for name, zone in summary["zones"].items():
        text = f"zone {name}: entered {zone['entries']}, left {zone['exits']}, "
        text += f"inside at the end {zone['inside_at_end']}"
        labels = zone.get("labels_at_end") or {}
        if labels:
            text += " (" + ", ".join(f"{label} {n}" for label, n in labels.items()) + ")"
        extra = [f"{k} {zone[k]}" for k in ("dwell", "overcrowded") if zone.get(k)]
        lines.append(text + ("; " + ", ".join(extra) if extra else ""))
    for name, counts in summary["lines"].items():
        lines.append(f"line {name}: " + ", ".join(f"{direction} {n}" for direction, n in counts.items()))
    return lines
