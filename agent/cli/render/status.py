"""`edge-agent status` for people: the daemon's status as a header, a table of its pipelines and
a line for each problem and backend choice (agent/cli/status.py asks the daemon for it)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from agent.text import clip

if TYPE_CHECKING:  # imported where a status is drawn: every other command loads this module too
    from collections.abc import Mapping

    from agent.status import PipelineStatus

SHOWN_PROBLEMS = 5  # a refused reload's problems shown under the config line


def console() -> Any:
    """A terminal's own width; piped (a script, a log), wide enough that rows are not folded."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def render(data: dict[str, Any]) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from agent.status import statuses_of

    config = data.get("config") or {}
    mqtt = data.get("mqtt") or {}
    outbox = data.get("outbox") or {}
    lines = [
        Text.assemble(
            (f"edge-agent {data.get('agent_version', '?')}", "bold"),
            f" on {data.get('device', '?')} (pid {data.get('pid', '?')}),",
            f" up {_duration(data.get('uptime_s'))}",
        ),
        Text(f"config: {config.get('file') or '-'}" + _config_note(config)),
        *_config_problems(config),
        Text.assemble(
            "broker: ",
            ("connected", "green") if mqtt.get("connected") else ("not connected", "red"),
            f" ({mqtt.get('connects', 0)} connects)",
            f", last error: {mqtt['last_error']}" if mqtt.get("last_error") else "",
        ),
        Text(
            f"outbox: {outbox.get('pending', 0)} queued"
            + (f", oldest {_duration(outbox.get('oldest_age_s'))}" if outbox.get("oldest_age_s") else "")
            + f", {outbox.get('dropped', 0)} dropped (when_full: {outbox.get('when_full', '?')})"
        ),
        Text(f"fleet: {_fleet(data.get('fleet') or {})}"),
    ]
    table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False)
    numbers = ("ms p50/p95", "fps", "results", "drops", "errors")
    for column in ("pipeline", "state", "model", "backend", *numbers):
        table.add_column(column, justify="right" if column in numbers else "left", no_wrap=True)
    why_lines = []
    tracking_lines = []
    for name, p in statuses_of(data.get("pipelines")).items():
        run, serving = p.run, p.serving  # None: nothing runs (yet)
        latency = None if run is None else run.counts.latency.capture_to_result
        dropped = (0 if run is None else run.source.frames_dropped) + (p.results_dropped or 0)
        table.add_row(
            name,
            Text(_state(p), style=_state_style(p)),
            p.running_model or p.change.desired_model or "-",
            "-" if serving is None else serving.backend or "-",
            "-" if not latency else f"{latency.p50:.0f} / {latency.p95:.0f}",
            "-" if run is None or run.counts.fps is None else f"{run.counts.fps:.1f}",
            str(0 if run is None else run.counts.results),
            str(dropped),
            str(0 if run is None else run.counts.errors),
        )
        why_lines += [Text(f"{name}: {problem}", style="yellow") for problem in p.problems()]
        if serving is not None and serving.backend_why:
            why_lines.append(Text(f"{name}: {clip(serving.backend_why, 160)}", style="dim"))
        if run is not None and isinstance(run.tracking, dict):
            tracking_lines.append(tracking_line(name, run.tracking))
        if run is not None and isinstance(run.steps.get("filter"), dict):
            tracking_lines.append(filter_line(name, run.steps["filter"]))
        if run is not None and isinstance(run.steps.get("motion"), dict):
            tracking_lines.append(motion_line(name, run.steps["motion"]))
    return Group(*lines, table, *tracking_lines, *why_lines)


def tracking_line(name: str, tracking: dict[str, Any]) -> Any:
    """A tracking pipeline's scene in one line: `door: 3 tracks; zone bay 2 inside (person 2), 1 dwelling,
    overcrowded; line gate in 5, out 3` (agent/processing/scene.py `summary`)."""
    from rich.text import Text

    tracks = tracking.get("tracks", 0)
    text = Text(f"{name}: {tracks} track{'' if tracks == 1 else 's'}")
    for zone_name, zone in (tracking.get("zones") or {}).items():
        text.append(f"; zone {zone_name} {zone.get('count', 0)} inside")
        labels = zone.get("labels") or {}
        if labels:
            text.append(" (" + ", ".join(f"{label} {n}" for label, n in labels.items()) + ")")
        if zone.get("dwelling"):
            text.append(f", {zone['dwelling']} dwelling")
        if zone.get("overcrowded"):
            text.append(", ")
            text.append("overcrowded", style="yellow")
    for line_name, counts in (tracking.get("lines") or {}).items():
        text.append(f"; line {line_name} " + ", ".join(f"{way} {n}" for way, n in (counts or {}).items()))
    return text


def filter_line(name: str, shown: Mapping[str, Any]) -> Any:
    """What a pipeline's object filters dropped (agent/steps/filter.py `status`) in one line:
    `door: filters kept 40, dropped 15: min_area 12 (person 10, car 2), mask 3 (car)`."""
    from rich.text import Text

    from agent.filter_counts import drops_text

    return Text(f"{name}: filters {drops_text(shown)}")


def motion_line(name: str, shown: Mapping[str, Any], now: float | None = None) -> Any:
    """A pipeline's motion gate (agent/steps/motion.py `status`) in one line: `door: motion ON, 1520
    frames gated, 2 relearned, last motion 12s ago`."""
    import time

    from rich.text import Text

    text = Text(f"{name}: motion ")
    text.append("ON" if shown.get("motion") else "OFF", style="bold" if shown.get("motion") else "")
    text.append(f", {shown.get('frames_gated', 0)} frames gated")
    if shown.get("relearned"):
        text.append(f", {shown['relearned']} relearned (brightness jumps)")
    last = shown.get("last_motion_at")
    if isinstance(last, int | float):
        ago = max(0.0, (time.time() if now is None else now) - last)
        text.append(f", last motion {_duration(ago)} ago")
    return text


def _state(pipeline: PipelineStatus) -> str:
    state, phase = pipeline.state, pipeline.phase
    return state if phase == "running" or phase == state else f"{state} ({phase})"


def _state_style(pipeline: PipelineStatus) -> str:
    state = pipeline.state
    return "green" if state == "running" else "yellow" if state in ("starting", "finished") else "red"


def _config_note(config: dict[str, Any]) -> str:
    notes = []
    if config.get("running") == "last-good":
        problems = len(config.get("problems") or [])
        notes.append(f"INVALID, running the last good config ({problems} problem(s))")
    last = config.get("last_reload") or {}
    if last:
        kept = ", the running config stays" if last.get("result") == "refused" else ""
        notes.append(f"last reload {last.get('result')} at {last.get('at')}{kept}")
    if config.get("restart_needed"):
        notes.append(f"needs a restart for {', '.join(config['restart_needed'])}")
    return f" ({'; '.join(notes)})" if notes else ""


def _config_problems(config: dict[str, Any]) -> list[Any]:
    """Why the config file was not taken, each problem (`file:line: key: what`) on a line of its own
    under the config line, not only that it was not: a refused reload's (the running config stays),
    or the file's at start when the last good config runs instead."""
    from rich.text import Text

    last = config.get("last_reload") or {}
    if last.get("result") == "refused":
        problems, what = last.get("problems") or [], "refused"
    elif config.get("running") == "last-good":
        problems, what = config.get("problems") or [], "invalid"
    else:
        return []
    lines = [Text(f"  {what}: {clip(str(p), 300)}", style="yellow") for p in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        more = len(problems) - SHOWN_PROBLEMS
        lines.append(
            Text(f"  ... and {more} more (edge-agent config validate {config.get('file') or 'FILE'})")
        )
    return lines


def _fleet(fleet: dict[str, Any]) -> str:
    if not fleet.get("enabled", True):
        return "off"
    documents = fleet.get("documents") or {}
    if not documents:
        return "no desired state (agent.yaml only)"
    return ", ".join(_document(layer, d) for layer, d in documents.items())


def _document(layer: str, document: dict[str, Any]) -> str:
    """One desired-state document: the generation applied and what became of it here (a generation
    whose pipeline failed or was rolled back "failed", with what serves instead), and a refused one."""
    state, applied = document.get("state"), document.get("applied_generation")
    if state == "withdrawn":
        return f"{layer} withdrawn"
    if "outcome" not in document:  # a daemon from before outcomes: the document's state alone
        return f"{layer} generation {applied} {state}"
    parts = []
    if state == "refused":
        parts.append(f"{layer} generation {document.get('observed_generation') or '?'} refused")
    outcome = document.get("outcome")
    if applied is not None and outcome is not None:
        text = f"generation {applied} {outcome}"
        failed = document.get("failed") or []
        if failed:
            text += f" ({'; '.join(_failed_pipeline(f) for f in failed)})"
        parts.append(text if parts else f"{layer} {text}")
    return "; ".join(parts) or f"{layer} {state}"


def _failed_pipeline(failed: dict[str, Any]) -> str:
    """`cam: det@4 rolled back, serving det@3 from device:cam-01 generation 4` (the reason is on the
    pipeline's own line)."""
    what = "rolled back" if failed.get("phase") == "rolled-back" else "failed"
    serving = failed.get("running_model")
    text = f"{failed.get('pipeline')}: {failed.get('desired_model') or '?'} {what}, "
    if serving is None:
        return text + "nothing serving"
    text += f"serving {serving}"
    layer, generation = failed.get("running_layer"), failed.get("running_generation")
    if layer == "yaml":
        return text + " from agent.yaml"
    if generation is not None:
        return text + f" from {layer} generation {generation}"
    return text


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"
