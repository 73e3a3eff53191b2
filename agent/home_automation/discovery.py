"""Home Assistant MQTT device discovery: stable component ids, the box's identity, and the retained
discovery config that reads the state topics: each pipeline's, and the box's own (its connectivity
from the status topic, its outbox backlog)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent import __version__
from agent.config import AgentConfig
from agent.home_automation.views import (
    CONNECTIVITY,
    DEVICE,
    QOS,
    Entity,
    PipelineView,
    device_entities,
    entities,
)
from agent.mqtt.topics import state_topic, status_topic

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _slug(text: str) -> str:
    """`text` as a component id part ([A-Za-z0-9_-]: Home Assistant splits discovery ids on spaces)."""
    slug = _ID_UNSAFE.sub("_", text)
    return slug if slug == text else f"{slug}_{_short_hash(text)}"


def component_ids(views: list[PipelineView]) -> dict[tuple[str, tuple[str, ...]], str]:
    """(pipeline, entity key) -> component id: `<pipeline>__<key levels>`, unique (a clash of slugs gets
    a hash of what it names)."""
    ids: dict[tuple[str, tuple[str, ...]], str] = {}
    taken: set[str] = set()
    for view in sorted(views, key=lambda v: v.name):
        for entity in entities(view):
            cid = "__".join([_slug(view.name), *(_slug(level) for level in entity.key)])
            if cid in taken:
                cid = f"{cid}__{_short_hash(view.name + chr(0) + chr(0).join(entity.key))}"
            taken.add(cid)
            ids[(view.name, entity.key)] = cid
    return ids


@dataclass(frozen=True)
class DiscoveryIdentity:
    """Who the device is, in Home Assistant."""

    device_id: str
    object_id: str
    device_name: str
    support_url: str | None
    availability_topic: str


def identity_of(config: AgentConfig) -> DiscoveryIdentity:
    ha = config.home_assistant
    return DiscoveryIdentity(
        device_id=config.device.id,
        object_id=ha.object_id or config.device.id,
        device_name=ha.device_name or config.device.id,
        support_url=ha.support_url,
        availability_topic=status_topic(config.mqtt.topic_prefix, config.device.id),
    )


def discovery_components(
    views: list[PipelineView], identity: DiscoveryIdentity, prefix: str
) -> dict[str, dict[str, Any]]:
    """Component id -> its config, for `views` and the box itself (Home Assistant's device discovery
    `cmps`). The box's ids start with `_device__`, which no pipeline's can (names start alphanumeric)."""
    ids = component_ids(views)
    components: dict[str, dict[str, Any]] = {}

    def add(cid: str, entity: Entity, topic: str) -> dict[str, Any]:
        component: dict[str, Any] = {
            "p": entity.platform,
            "unique_id": f"edge-agent__{identity.object_id}__{cid}",
            "name": entity.name,
            ("image_topic" if entity.platform == "image" else "state_topic"): topic,
            "qos": QOS,
        }
        component.update(entity.options)
        components[cid] = component
        return component

    for view in views:
        for entity in entities(view):
            add(
                ids[(view.name, entity.key)],
                entity,
                state_topic(prefix, identity.device_id, view.name, *entity.key),
            )
    # Connectivity: the retained status itself, with no availability of its own, so that an agent gone
    # offline (its last will) reads "off" (Disconnected) rather than unavailable.
    add(f"{DEVICE}__online", CONNECTIVITY, identity.availability_topic)["availability"] = []
    for entity in device_entities():
        cid = "__".join([DEVICE, *entity.key])
        add(cid, entity, state_topic(prefix, identity.device_id, DEVICE, *entity.key))
    return components


def discovery_payload(
    identity: DiscoveryIdentity, components: Mapping[str, Mapping[str, Any]], removed: Mapping[str, str]
) -> dict[str, Any]:
    """The device discovery config: device, origin, availability, the components and, for each
    removed one (id -> platform), `{"p": platform}`, which makes Home Assistant delete it."""
    origin: dict[str, Any] = {"name": "edge-agent", "sw_version": __version__}
    if identity.support_url:
        origin["support_url"] = identity.support_url
    cmps: dict[str, Any] = {cid: {"p": platform} for cid, platform in sorted(removed.items())}
    cmps.update({cid: dict(c) for cid, c in components.items()})
    return {
        "dev": {
            "identifiers": [f"edge-agent__{identity.object_id}"],
            "name": identity.device_name,
            "manufacturer": "edge-agent",
            "model": "edge-agent",
            "sw_version": __version__,
        },
        "o": origin,
        # The agent's retained status: {"status": "online" | "offline", ...} (docs/results.md).
        "availability": [
            {
                "topic": identity.availability_topic,
                "value_template": "{{ value_json.status }}",
                "payload_available": "online",
                "payload_not_available": "offline",
            }
        ],
        "qos": QOS,
        "cmps": cmps,
    }
