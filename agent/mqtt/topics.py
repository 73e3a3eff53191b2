"""MQTT topic scheme, as pure build/parse functions (no paho import).

The whole scheme lives here so it changes in one place:

    <prefix>/<device>/status               retained birth / last will
    <prefix>/<device>/results/<pipeline>   results and events
    <prefix>/<device>/telemetry            periodic health
    <prefix>/<device>/reported             retained reported state
    <prefix>/<device>/desired              retained desired state (device)
    <prefix>/groups/<group>/desired        retained desired state (group)
    <prefix>/<device>/cmd/<name>           commands
    <prefix>/<device>/state/<pipeline>/... retained per pipeline state (state_topics; docs/integrations.md)
    <discovery>/device/<object id>/config  Home Assistant device discovery (home_assistant)
    <discovery>/status                     Home Assistant's birth message

Every level is checked: an empty level or one holding '/', '+' or '#' would change
what a topic means (or make it a filter), so it is a ValueError naming the part.
"""

from __future__ import annotations

# Second level reserved for group documents; a device called "groups" would collide with it.
GROUPS_LEVEL = "groups"


def _level(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"MQTT topic {kind} must be a non-empty string, got {value!r}")
    for bad in ("/", "+", "#", "\x00"):
        if bad in value:
            raise ValueError(f"MQTT topic {kind} {value!r} must not contain {bad!r}")
    return value


def _device(prefix: str, device: str) -> str:
    _level("prefix", prefix)
    _level("device", device)
    if device == GROUPS_LEVEL:
        raise ValueError(f"MQTT topic device {device!r} is reserved for group topics")
    return f"{prefix}/{device}"


def status_topic(prefix: str, device: str) -> str:
    return f"{_device(prefix, device)}/status"


def results_topic(prefix: str, device: str, pipeline: str) -> str:
    return f"{_device(prefix, device)}/results/{_level('pipeline', pipeline)}"


def events_topic(prefix: str, device: str, pipeline: str) -> str:
    """A tracking pipeline's events: new/update/end per object, zone and line events (docs/results.md)."""
    return f"{_device(prefix, device)}/events/{_level('pipeline', pipeline)}"


def telemetry_topic(prefix: str, device: str) -> str:
    return f"{_device(prefix, device)}/telemetry"


def reported_topic(prefix: str, device: str) -> str:
    return f"{_device(prefix, device)}/reported"


def desired_topic(prefix: str, device: str) -> str:
    return f"{_device(prefix, device)}/desired"


def group_desired_topic(prefix: str, group: str) -> str:
    return f"{_level('prefix', prefix)}/{GROUPS_LEVEL}/{_level('group', group)}/desired"


def command_topic(prefix: str, device: str, name: str) -> str:
    return f"{_device(prefix, device)}/cmd/{_level('command name', name)}"


def state_topic(prefix: str, device: str, pipeline: str, *levels: str) -> str:
    """`<prefix>/<device>/state/<pipeline>/<levels...>`: e.g. ("label",), ("seen", "person")."""
    rest = "/".join(_level("state level", level) for level in levels)
    return f"{_device(prefix, device)}/state/{_level('pipeline', pipeline)}" + (f"/{rest}" if rest else "")


def _discovery_prefix(prefix: str) -> str:
    for level in prefix.split("/"):
        _level("discovery prefix level", level)
    return prefix


def ha_device_config_topic(discovery_prefix: str, object_id: str) -> str:
    """Home Assistant's device discovery topic: `<discovery_prefix>/device/<object_id>/config`."""
    return f"{_discovery_prefix(discovery_prefix)}/device/{_level('object id', object_id)}/config"


def ha_status_topic(discovery_prefix: str) -> str:
    """Where Home Assistant's MQTT integration publishes its birth ("online") and will ("offline")."""
    return f"{_discovery_prefix(discovery_prefix)}/status"


def parse_results_topic(topic: str) -> tuple[str, str, str]:
    """`<prefix>/<device>/results/<pipeline>` -> (prefix, device, pipeline); ValueError otherwise."""
    parts = topic.split("/") if isinstance(topic, str) else []
    if len(parts) != 4 or parts[2] != "results":
        raise ValueError(f"not a results topic (<prefix>/<device>/results/<pipeline>): {topic!r}")
    prefix, device, _, pipeline = parts
    # Rebuilding validates every level with the same rules as building.
    results_topic(prefix, device, pipeline)
    return prefix, device, pipeline
