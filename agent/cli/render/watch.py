"""`edge-agent watch` for people: one line per message the box published (agent/tools/watch.py), its
time, its kind and a summary: a result's pipeline and top output, a tracking event's zone or line
(and direction) first, then what happened to which object, a status's state, a state topic's value.
A message's `seq` is written `[seq 48]` at the line's end and an object's id `person #4`, as drawn
frames and `infer --track` write it: the two numbers are never both `#`; what second models read on
the object follows its id in brackets, `plate #3 [text=KX42 BRT 0.97]`. Plain text, or rich's
colours on a terminal. Whatever a payload holds, a line comes out (a message not in the documented
shape is shown cut short, never an error)."""

from __future__ import annotations

import time
from typing import Any

from agent.cli.render import cut
from agent.tools.watch import Seen

_STYLES = {"result": "green", "event": "bold magenta", "status": "cyan", "state": "yellow"}
_SHOWN = 3  # detections, pipelines named in one line
_VALUE_CHARS = 40  # an attribute's value in a line (a plugin's mapping is cut)


def line(seen: Seen) -> str:
    return f"{_clock(seen)} {seen.kind:<6} {summary(seen)}"


def styled(seen: Seen) -> Any:
    """The same line with rich's styles (a terminal)."""
    from rich.text import Text

    return Text.assemble(
        (_clock(seen), "dim"), " ", (f"{seen.kind:<6}", _STYLES.get(seen.kind, "")), " ", summary(seen)
    )


def _clock(seen: Seen) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seen.received_at))


def summary(seen: Seen) -> str:
    payload = seen.payload
    retained = " (retained)" if seen.retained else ""
    if seen.kind == "state":
        rest = seen.topic.split("/state/", 1)[-1]
        value = f"<{seen.size} bytes>" if payload is None else cut(payload) if payload else "(cleared)"
        return f"{rest} = {value}{retained}"
    if not isinstance(payload, dict):
        return f"{seen.topic}: {_raw(seen)}{retained}"
    if seen.kind == "status":
        return _status(payload) + retained
    seq = f" [seq {payload.get('seq', '?')}]"
    if "type" in payload and "output" not in payload:  # a tracking event
        return f"{seen.pipeline}: {tracking_event(payload)}{seq}{retained}"
    output = payload.get("output")
    shown = top_output(output) if isinstance(output, dict) else cut(output)
    return f"{seen.pipeline}: {shown}{seq}{retained}"


def tracking_event(event: dict[str, Any]) -> str:
    """A tracking event in a few words, where first: `line door in: cross person #4 (count 3)`,
    `zone counter: dwell person #4 (inside 7.5 s)`, `new person #4 (score 0.81)`, and the object's
    attributes once read: `line gate in: cross plate #3 [text=KX42 BRT 0.97] (count 1)`."""
    given = event.get("object")
    obj: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = str(event.get("type", "?"))
    if event.get("line") is not None:
        where = f"line {event['line']}" + (f" {event['direction']}" if event.get("direction") else "")
    elif event.get("zone") is not None:
        where = f"zone {event['zone']}"
    else:
        where = ""
    who = f"{obj.get('label', '?')} #{obj.get('id', '?')}{attributes_of(obj)}" if obj else ""
    what = " ".join(part for part in (kind, _state_of(event), who, _detail(kind, event, obj)) if part)
    return f"{where}: {what}" if where else what


def attributes_of(obj: dict[str, Any]) -> str:
    """` [text=KX42 BRT 0.97, direction=180 0.88]`: each attribute's value and score (an embedding as
    its length); empty when none was read."""
    given = obj.get("attributes")
    if not isinstance(given, dict) or not given:
        return ""
    shown = []
    for name, read in given.items():
        read = read if isinstance(read, dict) else {"value": read}
        value = read.get("value")
        text = f"<{len(value)} values>" if isinstance(value, list) else cut(value, _VALUE_CHARS)
        score = _score(read.get("score"))
        shown.append(f"{name}={text}" + (f" {score}" if score else ""))
    return f" [{', '.join(shown)}]"


def _state_of(event: dict[str, Any]) -> str:
    return str(event["state"]) if event.get("state") is not None else ""  # overcrowded: start / end


def _detail(kind: str, event: dict[str, Any], obj: dict[str, Any]) -> str:
    """The numbers an event carries (docs/results.md, Events), in brackets."""
    parts: list[str] = []
    if kind == "cross" and event.get("count") is not None:
        parts.append(f"count {event['count']}")
    elif kind in ("exit", "dwell") and _is_number(event.get("stayed_s")):
        parts.append(f"{'stayed' if kind == 'exit' else 'inside'} {float(event['stayed_s']):.1f} s")
    elif kind == "overcrowded" and event.get("count") is not None:
        parts.append(f"{event['count']} inside, max {event.get('max_objects', '?')}")
    elif kind == "new" and _is_number(obj.get("score")):
        parts.append(f"score {float(obj['score']):.2f}")
    elif kind == "update" and isinstance(event.get("changed"), list):
        parts.append(", ".join(str(c) for c in event["changed"]))
    if event.get("reason") and event.get("reason") != "left":
        parts.append(str(event["reason"]))
    return f"({', '.join(parts)})" if parts else ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _raw(seen: Seen) -> str:
    return f"<{seen.size} bytes>" if seen.payload is None else cut(seen.payload)


def top_output(output: dict[str, Any]) -> str:
    """A result's output in a few words, by postprocessor (docs/results.md)."""
    if isinstance(output.get("top"), list):
        best = output["top"][:1]
        return " ".join(_entry(e) for e in best if isinstance(e, dict)) or "no classes"
    if isinstance(output.get("detections"), list):
        found = [e for e in output["detections"] if isinstance(e, dict)]
        shown = ", ".join(_entry(e) for e in found[:_SHOWN]) + (", ..." if len(found) > _SHOWN else "")
        return f"{len(found)} detection(s)" + (f": {shown}" if found else "")
    if isinstance(output.get("regions"), list):
        return f"{len(output['regions'])} region(s)"
    if "active" in output:
        event = f"{output['event']} " if output.get("event") else ""
        return f"{event}{'active' if output['active'] else 'inactive'} {_score(output.get('score'))}".rstrip()
    if isinstance(output.get("outputs"), dict):
        return "raw " + ", ".join(
            f"{name}{list(o.get('shape') or []) if isinstance(o, dict) else ''}"
            for name, o in output["outputs"].items()
        )
    return cut(output)


def _entry(entry: dict[str, Any]) -> str:
    label = entry.get("label")
    return f"{label if label is not None else entry.get('index')} {_score(entry.get('score'))}".rstrip()


def _score(score: Any) -> str:
    return f"{score:.2f}" if _is_number(score) else ""


def _status(status: dict[str, Any]) -> str:
    state = status.get("status", "?")
    text = f"{status.get('device', '?')} {state}"
    if status.get("agent_version"):
        text += f" (edge-agent {status['agent_version']})"
    pipelines = status.get("pipelines")
    if isinstance(pipelines, dict) and pipelines:
        named = [f"{name} {p.get('state') if isinstance(p, dict) else p}" for name, p in pipelines.items()]
        text += (
            ": "
            + ", ".join(named[:_SHOWN])
            + (f", +{len(named) - _SHOWN} more" if len(named) > _SHOWN else "")
        )
    return text
