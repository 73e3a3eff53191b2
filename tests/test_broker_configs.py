"""The fleet's mosquitto ACL (configs/mosquitto/acl): generated from an inventory by
agent.fleet.acl.render_acl / scripts/fleet_acl.py, and the checked-in file is that output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.fleet.acl import parse_inventory, render_acl

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs" / "mosquitto"
ACL = CONFIGS / "acl"
TIMEOUT_S = 30.0


# -- the ACL generator ---------------------------------------------------------------------------------


def test_the_checked_in_acl_is_the_generator_output_for_the_example_inventory(tmp_path: Path) -> None:
    inventory = CONFIGS / "inventory.example.yaml"
    devices, sites = parse_inventory(yaml.safe_load(inventory.read_text()))
    assert ACL.read_text() == render_acl(devices, sites=sites), (
        "configs/mosquitto/acl is stale: scripts/fleet_acl.py configs/mosquitto/inventory.example.yaml "
        "-o configs/mosquitto/acl"
    )
    out = tmp_path / "acl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fleet_acl.py"), str(inventory), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == ACL.read_text()


def test_render_acl_lines() -> None:
    acl = render_acl(
        {"b-dev": ["north", "lobby", "north"], "a-dev": [], "c-dev": ["lobby"]},
        prefix="plant7",
        controller="ops",
        sites={"site-a": ["c-dev"]},
    )
    lines = [line for line in acl.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "pattern read plant7/%u/desired",
        "pattern read plant7/%u/cmd/#",
        "pattern write plant7/%u/status",
        "pattern write plant7/%u/results/#",
        "pattern write plant7/%u/telemetry",
        "pattern write plant7/%u/reported",
        "pattern write plant7/%u/cmd/+/reply",
        # sorted by device, groups sorted and de-duplicated; a device in no group gets no block
        "user b-dev",
        "topic read plant7/groups/lobby/desired",
        "topic read plant7/groups/north/desired",
        "user c-dev",
        "topic read plant7/groups/lobby/desired",
        "user site-a",
        "topic read plant7/c-dev/desired",
        "topic read plant7/c-dev/cmd/#",
        "topic write plant7/c-dev/status",
        "topic write plant7/c-dev/results/#",
        "topic write plant7/c-dev/telemetry",
        "topic write plant7/c-dev/reported",
        "topic write plant7/c-dev/cmd/+/reply",
        "topic read plant7/groups/lobby/desired",
        "user ops",
        "topic readwrite plant7/#",
    ]
    # No pattern or line grants a device a write of desired state or of commands.
    assert not [line for line in lines if "write" in line and ("desired" in line or line.endswith("cmd/#"))]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inventory": {"cam/01": []}}, "device 'cam/01'"),
        ({"inventory": {"cam+1": []}}, "device 'cam+1'"),
        ({"inventory": {"groups": []}}, "device 'groups': MQTT topic device 'groups' is reserved"),
        ({"inventory": {"cam 01": []}}, "device 'cam 01'"),
        ({"inventory": {"cam-01\ntopic readwrite #": []}}, "device 'cam-01\\ntopic readwrite #'"),
        ({"inventory": {"": []}}, "device ''"),
        ({"inventory": {"cam-01": ["#"]}}, "device 'cam-01' group '#'"),
        ({"inventory": {"cam-01": ["lobby", ""]}}, "device 'cam-01' group ''"),
        ({"inventory": {"cam-01": "lobby"}}, "device 'cam-01': groups must be a list"),
        ({"inventory": {"cam-01": []}, "prefix": "a/b"}, "topic prefix 'a/b'"),
        ({"inventory": {"cam-01": []}, "controller": "cam-01"}, "controller 'cam-01' is also a device"),
        ({"inventory": {"cam-01": []}, "controller": "ops x"}, "controller 'ops x'"),
        ({"inventory": {"cam-01": []}, "controller": "groups"}, "controller 'groups': MQTT topic device"),
        ({"inventory": {"cam-01": []}, "sites": {"cam-01": []}}, "site 'cam-01' is also a device"),
        ({"inventory": {"cam-01": []}, "sites": {"groups": []}}, "site 'groups': MQTT topic device"),
        ({"inventory": {"cam-01": []}, "sites": {"s": ["cam-09"]}}, "site 's' device 'cam-09' is not in"),
    ],
)
def test_render_acl_refuses_bad_entries_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        render_acl(**kwargs)
    assert message in str(raised.value)


def test_the_script_refuses_a_bad_inventory_naming_the_entry(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("devices:\n  cam-01: [lobby]\n  cam+02: [dock]\n")
    out = tmp_path / "acl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fleet_acl.py"), str(inventory), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2
    assert "device 'cam+02'" in done.stderr
    assert not out.exists()  # nothing half-written
    for bad, message in [
        ("cameras: {}", "unknown inventory keys ['cameras']"),
        ("devices: [cam-01]", "'devices' must map device ids"),
        ("devices: {cam-01: lobby}", "device 'cam-01' groups must be a list"),
    ]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_inventory(yaml.safe_load(bad))
