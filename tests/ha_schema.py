"""Home Assistant's MQTT device discovery schema, written down from its source, as a checker.

Read in home-assistant/core, homeassistant/components/mqtt/ (not imported: Home Assistant is not a
dependency, and its voluptuous schemas drop unknown component keys silently, where this checker
refuses them):

- discovery.py: a message on `<prefix>/device/<object_id>/config` (`object_id` of [a-zA-Z0-9_-]) is
  JSON; its abbreviations are expanded (root, `origin`, `device`, each `availability` entry, each
  component); `DEVICE_DISCOVERY_SCHEMA` must accept the whole (else the whole config is dropped with
  a warning); then each component, its `platform` popped, gets `device`, `origin` and the root's
  `SHARED_OPTIONS` it does not set itself, and goes through its platform's `DISCOVERY_SCHEMA`. A
  component with nothing but `platform` removes that component.
- schemas.py: `DEVICE_DISCOVERY_SCHEMA` (availability options, `device`, `components`, `origin`
  required; `state_topic`, `command_topic`, `qos`, `encoding`; no other key), the device info schema
  (at least one of `identifiers`, `connections`), the origin schema (`name` required),
  `MQTT_ENTITY_COMMON_SCHEMA`, `SHARED_OPTIONS`.
- config.py: `MQTT_BASE_SCHEMA` (`qos`, `encoding`) and `MQTT_RO_SCHEMA` (+ `state_topic` required,
  `value_template`).
- sensor.py, binary_sensor.py, image.py: each platform's own options and checks.
- abbreviations.py: the abbreviations (only those this checker knows are expanded; full names always
  work).

Two versions were read: an early schemas.py with device discovery (home-assistant/core commit
0f5c1b54: `DEVICE_DISCOVERY_SCHEMA`, no unique_id check) and a later one, which adds
`check_unique_id` (an entity component with options must have `unique_id`), `message_expiry_interval`,
`entity_picture`, `visible_by_default` and `default_entity_id` (replacing `object_id`), and shares `qos`
and `encoding` with components. A key is allowed here only where both versions take it; the later
rules are enforced too. The removal form (`{"p": platform}`) and the shared options are as Home
Assistant's MQTT documentation describes device discovery.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

DEVICE_TOPIC = re.compile(r"^(?P<prefix>.+)/device/(?P<object_id>[a-zA-Z0-9_-]+)/config$")

# abbreviations.py (the ones known to be in both versions; p, cmps and o came with device discovery).
ABBREVIATIONS = {
    "p": "platform",
    "cmps": "components",
    "dev": "device",
    "o": "origin",
    "avty": "availability",
    "avty_mode": "availability_mode",
    "avty_t": "availability_topic",
    "avty_tpl": "availability_template",
    "pl_avail": "payload_available",
    "pl_not_avail": "payload_not_available",
    "t": "topic",
    "val_tpl": "value_template",
    "stat_t": "state_topic",
    "cmd_t": "command_topic",
    "uniq_id": "unique_id",
    "e": "encoding",
    "en": "enabled_by_default",
    "ent_cat": "entity_category",
    "ic": "icon",
    "json_attr_t": "json_attributes_topic",
    "json_attr_tpl": "json_attributes_template",
    "dev_cla": "device_class",
    "exp_aft": "expire_after",
    "frc_upd": "force_update",
    "lrst_val_tpl": "last_reset_value_template",
    "ops": "options",
    "stat_cla": "state_class",
    "unit_of_meas": "unit_of_measurement",
    "off_dly": "off_delay",
    "pl_on": "payload_on",
    "pl_off": "payload_off",
}
DEVICE_ABBREVIATIONS = {
    "cns": "connections",
    "cu": "configuration_url",
    "ids": "identifiers",
    "name": "name",
    "mf": "manufacturer",
    "mdl": "model",
    "sw": "sw_version",
    "hw": "hw_version",
    "sn": "serial_number",
    "sa": "suggested_area",
}
ORIGIN_ABBREVIATIONS = {"name": "name", "sw": "sw_version", "url": "support_url"}

Check = Callable[[Any], bool]


def string(value: Any) -> bool:
    return isinstance(value, str)


def optional_string(value: Any) -> bool:  # vol.Any(cv.string, None)
    return value is None or isinstance(value, str)


def topic(value: Any) -> bool:
    """A topic the entity subscribes to; the agent's are concrete (no wildcards)."""
    return isinstance(value, str) and bool(value) and "+" not in value and "#" not in value


def template(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def qos(value: Any) -> bool:
    return type(value) is int and value in (0, 1, 2)


def boolean(value: Any) -> bool:
    return isinstance(value, bool)


def positive_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def url(value: Any) -> bool:
    return isinstance(value, str) and re.match(r"^https?://\S+$", value) is not None


def icon(value: Any) -> bool:  # cv.icon: "prefix:name"
    return isinstance(value, str) and re.fullmatch(r"[a-z0-9_-]+:[a-z0-9_-]+", value) is not None


def one_of(*allowed: Any) -> Check:
    return lambda value: value in allowed


def string_list(value: Any) -> bool:  # cv.ensure_list, [cv.string]
    items = value if isinstance(value, list) else [value]
    return all(isinstance(item, str) for item in items)


def availability_list(value: Any) -> bool:
    entries = value if isinstance(value, list) else [value]
    entry_keys: dict[str, Check] = {
        "topic": topic,
        "payload_available": string,
        "payload_not_available": string,
        "value_template": template,
    }
    return all(
        isinstance(e, dict)
        and "topic" in e
        and set(e) <= set(entry_keys)
        and all(entry_keys[k](v) for k, v in e.items())
        for e in entries
    )


AVAILABILITY: dict[str, Check] = {
    "availability_topic": topic,
    "availability_template": template,
    "payload_available": string,
    "payload_not_available": string,
    "availability_mode": one_of("all", "any", "latest"),
    "availability": availability_list,
}
DEVICE_INFO: dict[str, Check] = {
    "identifiers": string_list,
    "connections": lambda v: isinstance(v, list) and all(isinstance(c, list) and len(c) == 2 for c in v),
    "manufacturer": string,
    "model": string,
    "name": string,
    "hw_version": string,
    "serial_number": string,
    "sw_version": string,
    "via_device": string,
    "suggested_area": string,
    "configuration_url": url,
}
ORIGIN: dict[str, Check] = {"name": string, "sw_version": string, "support_url": url}
DEVICE_DISCOVERY: dict[str, Check] = {
    **AVAILABILITY,
    "device": lambda v: isinstance(v, dict),
    "components": lambda v: isinstance(v, dict),
    "origin": lambda v: isinstance(v, dict),
    "state_topic": topic,
    "command_topic": topic,
    "qos": qos,
    "encoding": string,
}
DEVICE_DISCOVERY_REQUIRED = {"device", "components", "origin"}
# Options of the root that components inherit when they do not set them (both versions).
SHARED_OPTIONS = (
    "availability",
    "availability_mode",
    "availability_template",
    "availability_topic",
    "command_topic",
    "payload_available",
    "payload_not_available",
    "state_topic",
)
SUPPORTED_COMPONENTS = {
    "alarm_control_panel", "binary_sensor", "button", "camera", "climate", "cover", "device_automation",
    "device_tracker", "event", "fan", "humidifier", "image", "lawn_mower", "light", "lock", "notify",
    "number", "scene", "select", "sensor", "siren", "switch", "tag", "text", "update", "vacuum", "valve",
    "water_heater",
}  # fmt: skip
NOT_ENTITIES = {"device_automation", "tag"}

ENTITY_COMMON: dict[str, Check] = {
    **AVAILABILITY,
    "device": lambda v: isinstance(v, dict),
    "origin": lambda v: isinstance(v, dict),
    "enabled_by_default": boolean,
    "entity_category": one_of("config", "diagnostic"),
    "icon": icon,
    "json_attributes_topic": topic,
    "json_attributes_template": template,
    "unique_id": string,
}
MQTT_BASE: dict[str, Check] = {"qos": qos, "encoding": string}
MQTT_RO: dict[str, Check] = {**MQTT_BASE, "state_topic": topic, "value_template": template}

PLATFORMS: dict[str, tuple[dict[str, Check], set[str]]] = {
    "sensor": (
        {
            **MQTT_RO,
            "device_class": optional_string,
            "expire_after": positive_int,
            "force_update": boolean,
            "last_reset_value_template": template,
            "name": optional_string,
            "options": lambda v: isinstance(v, list),
            "suggested_display_precision": positive_int,
            "state_class": one_of("measurement", "total", "total_increasing", None),
            "unit_of_measurement": optional_string,
            **ENTITY_COMMON,
        },
        {"state_topic"},
    ),
    "binary_sensor": (
        {
            **MQTT_RO,
            "device_class": optional_string,
            "expire_after": positive_int,
            "force_update": boolean,
            "name": optional_string,
            "off_delay": positive_int,
            "payload_off": string,
            "payload_on": string,
            **ENTITY_COMMON,
        },
        {"state_topic"},
    ),
    "image": (
        {
            **MQTT_BASE,
            "content_type": string,
            "name": optional_string,
            "url_topic": topic,
            "image_topic": topic,
            "image_encoding": one_of("b64"),
            "url_template": template,
            **ENTITY_COMMON,
        },
        set(),
    ),
}


def _expanded(mapping: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    return {table.get(key, key): value for key, value in mapping.items()}


def _check_keys(
    where: str, data: Mapping[str, Any], allowed: Mapping[str, Check], required: set[str]
) -> list[str]:
    problems = [f"{where}: {key} is required" for key in sorted(required - set(data))]
    for key, value in data.items():
        if key not in allowed:
            problems.append(f"{where}: {key} is not an option")
        elif not allowed[key](value):
            problems.append(f"{where}: {key}={value!r} has the wrong type or value")
    if "availability_topic" in data and "availability" in data:
        problems.append(f"{where}: availability_topic and availability exclude each other")
    return problems


def _platform_checks(where: str, platform: str, config: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    if platform == "sensor":
        if "last_reset_value_template" in config and config.get("state_class") != "total":
            problems.append(f"{where}: last_reset_value_template needs state_class total")
        if config.get("options") is not None and (
            config.get("device_class") != "enum"
            or config.get("state_class")
            or config.get("unit_of_measurement")
        ):
            problems.append(f"{where}: options needs device_class enum, no state_class or unit")
    if platform == "image":
        if ("image_topic" in config) == ("url_topic" in config):
            problems.append(f"{where}: exactly one of image_topic and url_topic is needed")
        if "content_type" in config and "url_topic" in config:
            problems.append(f"{where}: content_type cannot be used with url_topic")
    return problems


def check_device_discovery(config_topic: str, payload: Mapping[str, Any]) -> list[str]:
    """What Home Assistant would refuse (or silently drop) in this device discovery config; [] if none.
    Removals (`{"p": platform}`) are accepted."""
    problems: list[str] = []
    if DEVICE_TOPIC.match(config_topic) is None:
        problems.append(f"topic {config_topic!r} is not <prefix>/device/<[a-zA-Z0-9_-]+>/config")
    root = _expanded(payload, ABBREVIATIONS)
    problems += _check_keys("root", root, DEVICE_DISCOVERY, DEVICE_DISCOVERY_REQUIRED)
    device = _expanded(root.get("device") or {}, DEVICE_ABBREVIATIONS)
    origin = _expanded(root.get("origin") or {}, ORIGIN_ABBREVIATIONS)
    problems += _check_keys("device", device, DEVICE_INFO, set())
    if not device.get("identifiers") and not device.get("connections"):
        problems.append("device: needs identifiers or connections")
    problems += _check_keys("origin", origin, ORIGIN, {"name"})
    if "availability" in root:
        entries = root["availability"] if isinstance(root["availability"], list) else [root["availability"]]
        root["availability"] = [_expanded(e, ABBREVIATIONS) if isinstance(e, dict) else e for e in entries]
        if not availability_list(root["availability"]):
            problems.append(f"root: availability={root['availability']!r} is not a list of topic entries")
    for cid, raw in (root.get("components") or {}).items():
        where = f"component {cid}"
        if not isinstance(raw, dict):
            problems.append(f"{where}: not a mapping")
            continue
        component = _expanded(raw, ABBREVIATIONS)
        platform = component.pop("platform", None)
        if platform not in SUPPORTED_COMPONENTS:
            problems.append(f"{where}: platform {platform!r} is not supported")
            continue
        if not component:
            continue  # a removal
        if platform not in PLATFORMS:
            problems.append(f"{where}: platform {platform} is not one this checker knows")
            continue
        if platform not in NOT_ENTITIES and "unique_id" not in component:
            problems.append(f"{where}: an entity component needs unique_id")
        merged = dict(component, device=device, origin=origin)
        for option in SHARED_OPTIONS:
            if option in root and option not in merged:
                merged[option] = root[option]
        allowed, required = PLATFORMS[platform]
        problems += _check_keys(f"{where} ({platform})", merged, allowed, required)
        problems += _platform_checks(f"{where} ({platform})", platform, merged)
    return problems


def entity_topics(payload: Mapping[str, Any]) -> dict[str, set[str]]:
    """The topics the config makes Home Assistant read: state/image topics and availability topics."""
    root = _expanded(payload, ABBREVIATIONS)
    availability = {str(e.get("topic", e.get("t"))) for e in root.get("availability") or []}
    state = set()
    for raw in (root.get("components") or {}).values():
        component = _expanded(raw, ABBREVIATIONS)
        state |= {str(component[key]) for key in ("state_topic", "image_topic") if key in component}
    return {"state": state, "availability": availability}


def unique_ids(payload: Mapping[str, Any]) -> list[str]:
    components = _expanded(payload, ABBREVIATIONS).get("components") or {}
    return [
        str(_expanded(c, ABBREVIATIONS)["unique_id"])
        for c in components.values()
        if "unique_id" in _expanded(c, ABBREVIATIONS)
    ]
