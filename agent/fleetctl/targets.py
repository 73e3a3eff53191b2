"""What a deploy, rollback or status is aimed at: a group or one device (`Target`), resolved to the
document target ("group:<name>", "device:<id>") and the desired-state topic it is published on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.fleet.protocol import device_layer, group_layer
from agent.fleetctl.connection import DEFAULT_PREFIX, FleetError
from agent.fleetctl.records import DeviceRecord
from agent.mqtt.topics import desired_topic, group_desired_topic

TargetKind = Literal["group", "device"]
Target = tuple[TargetKind, str]  # ("group", "lobby") or ("device", "cam-01")


@dataclass(frozen=True)
class ResolvedTarget:
    """A target with its document target (`layer`) and desired topic under a topic prefix."""

    kind: TargetKind
    name: str
    layer: str  # "group:lobby" / "device:cam-01", the document's target
    topic: str

    @classmethod
    def of(cls, target: Target, prefix: str) -> ResolvedTarget:
        kind, name = target
        try:
            if kind == "group":
                return cls(kind, name, group_layer(name), group_desired_topic(prefix, name))
            if kind == "device":
                return cls(kind, name, device_layer(name), desired_topic(prefix, name))
        except ValueError as exc:  # a name that cannot be a topic level
            raise FleetError(str(exc)) from None
        raise FleetError(f"a target is ('group', name) or ('device', id), not {target!r}")

    def covers(self, record: DeviceRecord) -> bool:
        """Whether a device is a target member: the device itself, or a device whose retained
        reported state lists the group (docs/fleet.md: `device.groups` is the agent's to say)."""
        return record.device == self.name if self.kind == "device" else self.name in record.groups


def target_layer(target: Target) -> str:
    """The document target of a target: "group:<name>" or "device:<id>"; FleetError if not one."""
    return ResolvedTarget.of(target, DEFAULT_PREFIX).layer
