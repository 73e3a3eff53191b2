"""mosquitto acl_file for the fleet protocol (docs/fleet.md), generated from an inventory.

Devices authenticate with username == device id (client id edge-agent-<id>). The rights of every
device are `pattern` lines keyed on `%u`, the authenticated username, so one block serves the whole
fleet: a device reads its own desired state and commands and writes its status, results, telemetry,
reported state, state topics and command replies, nothing else. mosquitto ACLs grant and never
subtract, so the writes are listed one by one: a device cannot write its own desired state because
nothing grants it.

Group membership is the one thing patterns cannot say (mosquitto knows nothing of groups), so each
device in a group gets a `user <id>` block reading `<prefix>/groups/<group>/desired`, generated from the
inventory. A site broker bridged to this one (configs/mosquitto/bridge-site.conf) logs in as its site
name and gets the rights of the devices it carries, listed by device. The controller reads and writes
the whole prefix.

With Home Assistant in the inventory (`home_assistant: {username, discovery_prefix}`), each device may
also write its own device discovery config, `<discovery_prefix>/device/<device id>/config` (agent.yaml
`home_assistant.object_id` left at the device id), and read Home Assistant's birth message; Home
Assistant's login reads and writes the discovery prefix and reads every device's status and state
topics.

Names are checked with agent.mqtt.topics' rules (no empty level, '/', '+', '#'; a device may not be
called "groups") and the alphabet agent.yaml allows for device ids and groups, which also keeps every
name to one word on one line of the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from agent.config import NAME_PATTERN
from agent.mqtt.topics import desired_topic, group_desired_topic, ha_status_topic

_NAME_RE = re.compile(NAME_PATTERN)

# What a device may do under its own prefix <prefix>/<device>/..., as (access, topic suffix). Used with
# %u for the devices themselves and with each device's id for the site bridge that carries it.
DEVICE_RIGHTS: tuple[tuple[str, str], ...] = (
    ("read", "desired"),
    ("read", "cmd/#"),
    ("write", "status"),
    ("write", "results/#"),
    ("write", "telemetry"),
    ("write", "reported"),
    # Retained per pipeline state (agent.yaml state_topics, home_assistant; docs/integrations.md).
    ("write", "state/#"),
    # Replies to MQTT 3.1.1 requests, and the response topic MQTT 5 requesters must use (README.md).
    ("write", "cmd/+/reply"),
)


def ha_device_rights(discovery_prefix: str, device: str) -> tuple[tuple[str, str], ...]:
    """What a device may do under Home Assistant's discovery prefix: its own device config, the birth
    message. `device` is the device id, or `%u` in a pattern."""
    return (
        ("write", f"{discovery_prefix}/device/{device}/config"),
        ("read", f"{discovery_prefix}/status"),
    )


def _name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid name: use 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return value


def _check(what: str, build: Callable[..., str], *args: str) -> None:
    try:
        build(*args)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _groups_of(prefix: str, device: str, groups: object) -> list[str]:
    if isinstance(groups, str) or not isinstance(groups, Sequence):
        raise ValueError(f"device {device!r}: groups must be a list of names, got {groups!r}")
    checked = []
    for group in groups:
        _name(f"device {device!r} group", group)
        _check(f"device {device!r} group {group!r}", group_desired_topic, prefix, group)
        checked.append(group)
    return sorted(set(checked))


def _validated(
    inventory: Mapping[str, Sequence[str]],
    prefix: str,
    controller: str,
    sites: Mapping[str, Sequence[str]],
    home_assistant: tuple[str, str] | None,
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    _name("topic prefix", prefix)
    _check(f"topic prefix {prefix!r}", group_desired_topic, prefix, "g")
    devices: dict[str, list[str]] = {}
    for device, groups in inventory.items():
        _name("device", device)
        _check(f"device {device!r}", desired_topic, prefix, device)
        devices[device] = _groups_of(prefix, device, groups)
    # The controller and site bridges get the device patterns too (on <prefix>/<their name>/...):
    # the same topic rules keep those off the groups level.
    _name("controller", controller)
    _check(f"controller {controller!r}", desired_topic, prefix, controller)
    if controller in devices:
        raise ValueError(f"controller {controller!r} is also a device id: the device would get its rights")
    carried: dict[str, list[str]] = {}
    for site, site_devices in sites.items():
        _name("site", site)
        _check(f"site {site!r}", desired_topic, prefix, site)
        if site in devices or site == controller:
            raise ValueError(f"site {site!r} is also a device id or the controller: usernames must differ")
        if isinstance(site_devices, str) or not isinstance(site_devices, Sequence):
            raise ValueError(f"site {site!r}: devices must be a list of device ids, got {site_devices!r}")
        for device in site_devices:
            if device not in devices:
                raise ValueError(f"site {site!r} device {device!r} is not in the inventory's devices")
        carried[site] = sorted(set(site_devices))
    if home_assistant is not None:
        username, discovery_prefix = home_assistant
        _name("home_assistant username", username)
        if username in devices or username == controller or username in carried:
            raise ValueError(
                f"home_assistant username {username!r} is also a device id, the controller or a site: "
                "usernames must differ"
            )
        _check(f"home_assistant discovery_prefix {discovery_prefix!r}", ha_status_topic, discovery_prefix)
    return devices, carried


def render_acl(
    inventory: Mapping[str, Sequence[str]],
    prefix: str = "edge",
    controller: str = "controller",
    sites: Mapping[str, Sequence[str]] | None = None,
    home_assistant: tuple[str, str] | None = None,
) -> str:
    """The whole acl_file: device patterns, group lines per device, site bridges, Home Assistant, the
    controller.

    `inventory` maps device id -> its groups; `sites` maps a site bridge's username -> the device ids
    its site broker carries; `home_assistant` is (Home Assistant's username, its discovery prefix).
    ValueError names the first bad entry. Output is sorted, so the same inventory always gives the
    same file.
    """
    devices, carried = _validated(inventory, prefix, controller, sites or {}, home_assistant)
    out = [
        f"# mosquitto acl_file for the edge-agent fleet protocol (docs/fleet.md), topic prefix {prefix!r}.",
        "# Generated by scripts/fleet_acl.py from an inventory: edit the inventory, not this file.",
        "# Reload a running broker after regenerating it: kill -HUP <pid> (systemctl reload mosquitto).",
        "",
        "# Every device (username == device id): its own desired state and commands in, its status,",
        "# results, telemetry, reported state, state topics and command replies out. Nothing else, and",
        "# nothing of other devices: ACLs only grant, so what is not listed here is refused.",
    ]
    out += [f"pattern {access} {prefix}/%u/{suffix}" for access, suffix in DEVICE_RIGHTS]
    if home_assistant is not None:
        out += [
            "",
            "# Home Assistant discovery: each device writes its own device config (its object id is its",
            "# device id) and reads Home Assistant's birth message.",
        ]
        out += [f"pattern {access} {topic}" for access, topic in ha_device_rights(home_assistant[1], "%u")]
    out += [
        "",
        "# Group membership (patterns cannot express it): each device reads its groups' desired state.",
    ]
    for device, groups in sorted(devices.items()):
        if groups:
            out += ["", f"user {device}"]
            out += [f"topic read {group_desired_topic(prefix, g)}" for g in groups]
    if carried:
        out += [
            "",
            "# Site brokers' bridges (bridge-site.conf): the rights of the devices each one carries.",
        ]
    for site, site_devices in sorted(carried.items()):
        out += ["", f"user {site}"]
        for device in site_devices:
            out += [f"topic {access} {prefix}/{device}/{suffix}" for access, suffix in DEVICE_RIGHTS]
            if home_assistant is not None:
                rights = ha_device_rights(home_assistant[1], device)[:1]  # the birth message: once, below
                out += [f"topic {access} {topic}" for access, topic in rights]
        groups = sorted({g for device in site_devices for g in devices[device]})
        out += [f"topic read {group_desired_topic(prefix, g)}" for g in groups]
        if home_assistant is not None:
            out.append(f"topic read {ha_status_topic(home_assistant[1])}")
    if home_assistant is not None:
        username, discovery_prefix = home_assistant
        out += [
            "",
            "# Home Assistant's MQTT integration: its discovery prefix (the devices' configs, its birth and",
            "# will), every device's status (availability) and state topics. Nothing else.",
            "",
            f"user {username}",
            f"topic readwrite {discovery_prefix}/#",
            f"topic read {prefix}/+/status",
            f"topic read {prefix}/+/state/#",
        ]
    out += [
        "",
        "# The controller (edge-agent fleet ...): publishes desired state and commands, reads everything.",
        "",
        f"user {controller}",
        f"topic readwrite {prefix}/#",
    ]
    return "\n".join(out) + "\n"


def parse_inventory(data: object) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """An inventory document (parsed YAML) -> (devices: id -> groups, sites: site -> device ids).

    `{"devices": {"cam-01": ["lobby"], ...}, "sites": {"site-north": ["cam-01"]}}`; `sites` is optional,
    a device with no groups may have an empty list or nothing. ValueError names what is wrong.
    """
    if not isinstance(data, Mapping):
        raise ValueError("the inventory must be a mapping with a 'devices' key")
    unknown = sorted(str(k) for k in data if k not in ("devices", "sites", "home_assistant"))
    if unknown:
        raise ValueError(
            f"unknown inventory keys {unknown} (expected 'devices' and optionally 'sites', 'home_assistant')"
        )
    devices = data.get("devices")
    if not isinstance(devices, Mapping):
        raise ValueError("'devices' must map device ids to lists of groups")
    sites = data.get("sites") or {}
    if not isinstance(sites, Mapping):
        raise ValueError("'sites' must map site names to lists of device ids")

    def names(what: str, value: object) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValueError(f"{what} must be a list, got {value!r}")
        return [_name(f"{what} entry", item) for item in value]

    return (
        {_name("device", d): names(f"device {d!r} groups", g) for d, g in devices.items()},
        {_name("site", s): names(f"site {s!r} devices", ids) for s, ids in sites.items()},
    )


def parse_home_assistant(data: object) -> tuple[str, str] | None:
    """An inventory's `home_assistant: {username: homeassistant, discovery_prefix: homeassistant}` ->
    (username, discovery prefix); None without one. ValueError names what is wrong."""
    section = data.get("home_assistant") if isinstance(data, Mapping) else None
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError("'home_assistant' must map username and discovery_prefix")
    unknown = sorted(str(k) for k in section if k not in ("username", "discovery_prefix"))
    if unknown:
        raise ValueError(f"unknown home_assistant keys {unknown} (expected 'username', 'discovery_prefix')")
    username = _name("home_assistant username", section.get("username", "homeassistant"))
    prefix = section.get("discovery_prefix", "homeassistant")
    if not isinstance(prefix, str):
        raise ValueError(f"home_assistant discovery_prefix must be a topic prefix, got {prefix!r}")
    return username, prefix
