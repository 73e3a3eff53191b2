"""What the controller reads off the broker, as records: a device's retained reported state and
status, the retained desired documents, and the rules that say where a device stands on a
generation (docs/fleet.md). Pure: nothing here talks to a broker.

Parsing is forgiving on purpose: a device that publishes a malformed reported document is still
listed (with `problem` saying what is wrong) rather than hiding the rest of the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.errors import EdgeAgentError
from agent.fleet.protocol import (
    IN_FLIGHT_PHASES,
    MAX_DOCUMENT_BYTES,
    device_layer,
    group_layer,
    is_envelope,
    open_envelope,
)

# A device's standing on one document generation (deploy waves) or overall (fleet status).
CONVERGED = "converged"
FAILED = "failed"
ROLLED_BACK = "rolled-back"
IN_FLIGHT = "in-flight"
OFFLINE = "offline"
TIMED_OUT = "timed-out"
BAD_OUTCOMES = (FAILED, ROLLED_BACK, TIMED_OUT)  # what counts against a wave's --max-failed

_FAILED_PHASES = ("failed", "rolled-back")


@dataclass(frozen=True)
class LayerRecord:
    """One desired-state layer as a device reported it, with the generation currently desired."""

    layer: str
    desired_generation: int | None = None
    observed_generation: int | None = None
    applied_generation: int | None = None
    state: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class PipelineRecord:
    name: str
    phase: str | None
    model: str | None = None
    backend: str | None = None
    reason: str | None = None
    layer: str | None = None
    generation: int | None = None
    since: str | None = None


@dataclass(frozen=True)
class DeviceRecord:
    """Everything the broker holds about one device (retained reported state and status)."""

    device: str
    online: bool | None  # None: no (readable) status message
    groups: tuple[str, ...] = ()
    layers: Mapping[str, LayerRecord] = field(default_factory=dict)
    pipelines: Mapping[str, PipelineRecord] = field(default_factory=dict)
    last_seen: str | None = None  # reported updated_at
    agent_version: str | None = None
    problem: str | None = None  # why the reported document could not be read

    @property
    def reported(self) -> bool:
        return self.last_seen is not None or bool(self.layers) or bool(self.pipelines)

    def condition(self) -> tuple[str, str | None]:
        """(converged | failed | in-flight | offline, why) against the desired generations."""
        if self.online is False:
            return OFFLINE, "its status is offline"
        if self.problem:
            return FAILED, self.problem
        for layer in self.layers.values():
            if (
                layer.state == "refused"
                and layer.desired_generation is not None
                and layer.observed_generation == layer.desired_generation
                and (layer.applied_generation or 0) < layer.desired_generation
            ):
                return FAILED, f"{layer.layer} generation {layer.desired_generation} refused: {layer.reason}"
        for pipeline in self.pipelines.values():
            if pipeline.phase in _FAILED_PHASES:
                return FAILED, f"pipeline {pipeline.name} {pipeline.phase}: {pipeline.reason}"
        if not self.reported:
            return IN_FLIGHT, "no reported state yet"
        for layer in self.layers.values():
            if layer.desired_generation is not None and (layer.applied_generation or 0) < (
                layer.desired_generation
            ):
                return IN_FLIGHT, f"{layer.layer} generation {layer.desired_generation} not applied yet"
        for pipeline in self.pipelines.values():
            if pipeline.phase in IN_FLIGHT_PHASES or pipeline.phase is None:
                return IN_FLIGHT, f"pipeline {pipeline.name} is {pipeline.phase}"
        return CONVERGED, None

    def outcome(self, layer: str, generation: int) -> tuple[str, str | None]:
        """Where this device stands on `generation` of `layer` (a deploy wave): converged, failed,
        rolled-back, in-flight or offline, and why. The rules are docs/fleet.md's: the layer's
        document must be applied at that generation (or later) and every pipeline that came from
        the layer must carry that generation (or later) in a terminal phase; "refused" for that
        generation, or a pipeline of the layer failed or rolled back, is a failure."""
        doc = self.layers.get(layer)
        result: tuple[str, str | None] = (IN_FLIGHT, f"has not applied {layer} generation {generation}")
        if self.problem:
            result = (FAILED, self.problem)
        elif doc is not None and (doc.applied_generation or 0) >= generation:
            result = self._layer_pipelines(layer, generation)
        elif doc is not None and doc.state == "refused" and (doc.observed_generation or 0) >= generation:
            result = (FAILED, f"refused {layer} generation {doc.observed_generation}: {doc.reason}")
        if result[0] == IN_FLIGHT and self.online is False:
            return OFFLINE, f"offline ({result[1]})"
        return result

    def _layer_pipelines(self, layer: str, generation: int) -> tuple[str, str | None]:
        pipelines = [p for p in self.pipelines.values() if p.layer == layer]
        failed = [p for p in pipelines if p.phase == "failed"]
        if failed:
            return FAILED, "; ".join(f"{p.name}: {p.reason}" for p in failed)
        rolled_back = [p for p in pipelines if p.phase == "rolled-back"]
        if rolled_back:
            return ROLLED_BACK, "; ".join(f"{p.name}: {p.reason}" for p in rolled_back)
        for p in pipelines:
            if p.generation is None or p.generation < generation:
                return IN_FLIGHT, f"pipeline {p.name} still at generation {p.generation}"
            if p.phase not in ("running", "removed"):
                return IN_FLIGHT, f"pipeline {p.name} is {p.phase}"
        return CONVERGED, None

    def to_dict(self) -> dict[str, Any]:
        condition, why = self.condition()
        return {
            "device": self.device,
            "online": self.online,
            "condition": condition,
            "why": why,
            "groups": list(self.groups),
            "layers": {
                name: {
                    "desired_generation": r.desired_generation,
                    "observed_generation": r.observed_generation,
                    "applied_generation": r.applied_generation,
                    "state": r.state,
                    "reason": r.reason,
                }
                for name, r in self.layers.items()
            },
            "pipelines": {
                name: {
                    "phase": p.phase,
                    "model": p.model,
                    "backend": p.backend,
                    "reason": p.reason,
                    "layer": p.layer,
                    "generation": p.generation,
                    "since": p.since,
                }
                for name, p in self.pipelines.items()
            },
            "last_seen": self.last_seen,
            "agent_version": self.agent_version,
            "problem": self.problem,
        }


# --- parsing ----------------------------------------------------------------------------------


def parse_status(payload: bytes | None) -> bool | None:
    """online/offline from a status payload: the agent's JSON {"status": ...} or a bare word."""
    if not payload:
        return None
    text = payload.strip()
    if text in (b"online", b"offline"):
        return text == b"online"
    try:
        data = json.loads(text)
    except ValueError:
        return None
    state = data.get("status") if isinstance(data, dict) else None
    return {"online": True, "offline": False}.get(state) if isinstance(state, str) else None


def parse_device(device: str, reported: bytes | None, online: bool | None) -> DeviceRecord:
    """A device's record from its retained reported state (None: none yet) and whether its status
    says online (`parse_status`)."""
    if not reported:
        return DeviceRecord(device, online)
    try:
        data = json.loads(reported)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError too
        return DeviceRecord(device, online, problem=f"unreadable reported state: {exc}")
    groups = data.get("groups")
    documents = data.get("documents")
    pipelines = data.get("pipelines")
    return DeviceRecord(
        device=device,
        online=online,
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
        layers={
            name: LayerRecord(
                layer=name,
                observed_generation=_int(d.get("observed_generation")),
                applied_generation=_int(d.get("applied_generation")),
                state=_str(d.get("state")),
                reason=_str(d.get("reason")),
            )
            for name, d in (documents.items() if isinstance(documents, dict) else ())
            if isinstance(d, dict)
        },
        pipelines={
            name: PipelineRecord(
                name=name,
                phase=_str(p.get("phase")),
                model=_str(p.get("model")),
                backend=_str(p.get("backend")),
                reason=_str(p.get("reason")),
                layer=_str(p.get("layer")),
                generation=_int(p.get("generation")),
                since=_str(p.get("since")),
            )
            for name, p in (pipelines.items() if isinstance(pipelines, dict) else ())
            if isinstance(p, dict)
        },
        last_seen=_str(data.get("updated_at")),
        agent_version=_str(data.get("agent_version")),
    )


def with_desired(record: DeviceRecord, desired: Mapping[str, int]) -> DeviceRecord:
    """`record` with the desired generation of each layer that concerns it (its groups' documents
    and its own), including layers it has not reported on yet."""
    names = [device_layer(record.device), *(group_layer(g) for g in record.groups)]
    layers = dict(record.layers)
    for name in names:
        if name in desired:
            layers[name] = replace(layers.get(name) or LayerRecord(name), desired_generation=desired[name])
    return replace(record, layers=layers)


def read_document(payload: bytes, source: str) -> dict[str, Any]:
    """The desired-state document in a retained payload, a signed envelope unwrapped, read only as
    far as the controller needs (its generation, pipelines and rollout): checking it whole and its
    signatures is the devices' business (agent/fleet/document.py). ValueError saying why not."""
    if len(payload) > 2 * MAX_DOCUMENT_BYTES:  # an envelope adds base64 signatures and escaping
        raise ValueError(f"{source}: {len(payload)} bytes, far over the document limit")
    data = json.loads(payload)
    if is_envelope(data):
        try:
            document_bytes, _ = open_envelope(data, source)
        except EdgeAgentError as exc:  # a malformed signature list
            raise ValueError(exc.message) from None
        data = json.loads(document_bytes)
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a desired-state document is a JSON object")
    generation = data.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        raise ValueError(f"{source}: the document has no valid generation (got {generation!r})")
    return data


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
