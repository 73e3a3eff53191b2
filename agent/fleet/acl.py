"""mosquitto acl_file for the fleet protocol (docs/fleet.md), generated from an inventory.

Devices authenticate with username == device id (client id edge-agent-<id>). The rights of every
device are `pattern` lines keyed on `%u`, the authenticated username, so one block serves the whole
fleet: a device reads its own desired state and commands and writes its status, results, telemetry,
reported state and command replies, nothing else. mosquitto ACLs grant and never subtract, so the
writes are listed one by one: a device cannot write its own desired state because nothing grants it.

Group membership is the one thing patterns cannot say (mosquitto knows nothing of groups), so each
device in a group gets a `user <id>` block reading `<prefix>/groups/<group>/desired`, generated from the
inventory. A site broker bridged to this one (configs/mosquitto/bridge-site.conf) logs in as its site
name and gets the rights of the devices it carries, listed by device. The controller reads and writes
the whole prefix.

Names are checked with agent.mqtt.topics' rules (no empty level, '/', '+', '#'; a device may not be
called "groups") and the alphabet agent.yaml allows for device ids and groups, which also keeps every
name to one word on one line of the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from agent.config import NAME_PATTERN
from agent.mqtt.topics import desired_topic, group_desired_topic

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
    # Replies to MQTT 3.1.1 requests, and the response topic MQTT 5 requesters must use (README.md).
    ("write", "cmd/+/reply"),
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
    inventory: Mapping[str, Sequence[str]], prefix: str, controller: str, sites: Mapping[str, Sequence[str]]
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
    return devices, carried


def render_acl(
    inventory: Mapping[str, Sequence[str]],
    prefix: str = "edge",
    controller: str = "controller",
    sites: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The whole acl_file: device patterns, group lines per device, site bridges, the controller.

    `inventory` maps device id -> its groups; `sites` maps a site bridge's username -> the device ids
    its site broker carries. ValueError names the first bad entry. Output is sorted, so the same
    inventory always gives the same file.
    """
    devices, carried = _validated(inventory, prefix, controller, sites or {})
    out = [
        f"# mosquitto acl_file for the edge-agent fleet protocol (docs/fleet.md), topic prefix {prefix!r}.",
        "# Generated by scripts/fleet_acl.py from an inventory: edit the inventory, not this file.",
        "# Reload a running broker after regenerating it: kill -HUP <pid> (systemctl reload mosquitto).",
        "",
        "# Every device (username == device id): its own desired state and commands in, its status,",
        "# results, telemetry, reported state and command replies out. Nothing else, and nothing of",
        "# other devices: ACLs only grant, so what is not listed here is refused.",
    ]
    out += [f"pattern {access} {prefix}/%u/{suffix}" for access, suffix in DEVICE_RIGHTS]
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
        groups = sorted({g for device in site_devices for g in devices[device]})
        out += [f"topic read {group_desired_topic(prefix, g)}" for g in groups]
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
    unknown = sorted(str(k) for k in data if k not in ("devices", "sites"))
    if unknown:
        raise ValueError(f"unknown inventory keys {unknown} (expected 'devices' and optionally 'sites')")
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
