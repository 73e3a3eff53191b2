"""What `edge-agent fleet status` shows of each device: its record (agent/fleetctl/records.py)
with its presence (the retained status message) and, per pipeline, what serves, what is desired and
what became of it, judged against that presence. Pure: nothing here talks to a broker.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.fleet.protocol import IN_FLIGHT_PHASES
from agent.fleetctl.records import IN_FLIGHT, DeviceRecord, parse_status

# Where one pipeline of a device stands, as `fleet status` judges it (the device-level conditions are
# records.py's: converged, failed, in-flight, offline).
PIPELINE_RUNNING = "running"
PIPELINE_FAILED = "failed"  # the desired version never got to serve (what serves is the one before, if any)
PIPELINE_ROLLED_BACK = "rolled-back"  # the desired version failed its health window; the one before serves
PIPELINE_IN_FLIGHT = "in-flight"
PIPELINE_OFFLINE = "offline"  # the device's status is offline: its last report is history
PIPELINE_STALE = "stale"  # the agent restarted and has not reported since
PIPELINE_UNKNOWN = "unknown"


@dataclass(frozen=True)
class Presence:
    """A device's retained status message (`<prefix>/<device>/status`): its birth (online) or its
    last will / goodbye (offline), with the message's timestamp and, online, when the agent started."""

    online: bool | None  # None: no (readable) status message
    at: str | None = None
    started_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        state = {True: "online", False: "offline", None: None}[self.online]
        return {"status": state, "at": self.at, "started_at": self.started_at}


def parse_presence(payload: bytes | None) -> Presence:
    """The status message: online/offline as `parse_status` reads it, and its times when it is the
    agent's JSON ({"status", "timestamp", "started_at", ...})."""
    online = parse_status(payload)
    if online is None or not payload:
        return Presence(online)
    try:
        data = json.loads(payload)
    except ValueError:  # a bare "online"/"offline"
        return Presence(online)
    if not isinstance(data, dict):
        return Presence(online)
    return Presence(online, _text(data.get("timestamp")), _text(data.get("started_at")))


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline of a device as `fleet status` shows it: what serves (the model@version frames go
    through), what is desired, what became of the desired one, and the last error with its time."""

    name: str
    condition: str  # PIPELINE_* above
    serving: str | None  # None: nothing serves, or nothing known (offline, stale)
    desired: str | None
    text: str  # e.g. "serving faces@3; desired faces@4 failed: <reason>"
    last_error: str | None = None
    last_error_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "serving": self.serving,
            "desired": self.desired,
            "text": self.text,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


@dataclass(frozen=True)
class DeviceStatus:
    """A device's record (records.py) with its presence and what each of its pipelines serves."""

    record: DeviceRecord
    presence: Presence
    pipelines: Mapping[str, PipelineStatus]
    stale: str | None = None  # why the reported state does not describe the running agent (None: it does)

    @property
    def device(self) -> str:
        return self.record.device

    def condition(self) -> tuple[str, str | None]:
        """The record's condition, except that an online device whose reported state predates its
        start is in flight: what it runs now is not reported yet."""
        if self.stale is not None and self.record.online is not False:
            return IN_FLIGHT, self.stale
        return self.record.condition()

    def to_dict(self) -> dict[str, Any]:
        data = self.record.to_dict()
        data["condition"], data["why"] = self.condition()
        data["presence"] = self.presence.to_dict()
        data["stale"] = self.stale
        for name, pipeline in self.pipelines.items():
            data["pipelines"].setdefault(name, {}).update(pipeline.to_dict())
        return data


def device_status(record: DeviceRecord, reported: bytes | None, status: bytes | None) -> DeviceStatus:
    """`record` with its presence (the retained status) and each pipeline's serving/desired view,
    read from the retained reported payload it was parsed from."""
    presence = parse_presence(status)
    stale = None
    if presence.online and presence.started_at and record.last_seen:
        started, reported_at = _epoch(presence.started_at), _epoch(record.last_seen)
        if started is not None and reported_at is not None and reported_at < started:
            stale = (
                f"not reported since the agent started at {presence.started_at} "
                f"(last report {record.last_seen})"
            )
    raw: dict[str, Any] = {}
    if reported and not record.problem:
        with contextlib.suppress(ValueError):
            data = json.loads(reported)
            if isinstance(data, dict) and isinstance(data.get("pipelines"), dict):
                raw = data["pipelines"]
    pipelines = {
        name: _pipeline_status(name, fields, record.online, stale, record.last_seen)
        for name, fields in raw.items()
        if isinstance(fields, dict) and name in record.pipelines
    }
    return DeviceStatus(record, presence, pipelines, stale)


def _pipeline_status(
    name: str, fields: Mapping[str, Any], online: bool | None, stale: str | None, last_seen: str | None
) -> PipelineStatus:
    phase, reason = _text(fields.get("phase")), _text(fields.get("reason"))
    model, desired = _text(fields.get("model")), _text(fields.get("desired_model"))
    if "running_model" in fields:
        serving = _text(fields.get("running_model"))
    else:  # an agent from before `running_model`: `model` names what serves, except on a failed
        serving = None if phase == "failed" and desired is None else model  # first start
    desired = desired or model
    runtime = _text(fields.get("state"))  # the running pipeline's own: running, degraded, ...
    serving_text = f"serving {serving}" + (f" ({runtime})" if runtime not in (None, "running") else "")
    if phase in ("failed", "rolled-back"):
        condition = PIPELINE_FAILED if phase == "failed" else PIPELINE_ROLLED_BACK
        what = "failed" if phase == "failed" else "rolled back"
        why = f": {reason}" if reason else ""
        head = serving_text if serving else "nothing serving"
        text = f"{head}; desired {desired} {what}{why}" if desired != serving else f"{head}; {what}{why}"
    elif phase in IN_FLIGHT_PHASES:
        condition = PIPELINE_IN_FLIGHT
        if serving and desired and serving != desired:
            text = f"{serving_text}; desired {desired} {phase}"
        else:
            text = f"{phase} {desired or serving or '?'}"
    elif phase == "running":
        condition = PIPELINE_RUNNING
        text = f"running {serving or desired or '?'}" + (
            f" ({runtime})" if runtime not in (None, "running") else ""
        )
    else:
        condition, text = PIPELINE_UNKNOWN, phase or "no phase reported"
    if online is False:
        when = f" at {last_seen}" if last_seen else ""
        condition, serving, text = PIPELINE_OFFLINE, None, f"offline; last reported{when}: {text}"
    elif stale is not None:
        condition, serving, text = PIPELINE_STALE, None, f"{stale}; it reported: {text}"
    return PipelineStatus(
        name,
        condition,
        serving,
        desired,
        text,
        _text(fields.get("last_error")),
        _text(fields.get("last_error_at")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
