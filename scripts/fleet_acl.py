#!/usr/bin/env python3
"""Write the mosquitto acl_file for a fleet from an inventory (configs/mosquitto/README.md).

    scripts/fleet_acl.py configs/mosquitto/inventory.example.yaml -o /etc/mosquitto/acl

The inventory is YAML: `devices:` maps each device id (its MQTT username) to its groups; the optional
`sites:` maps a site broker's bridge username to the device ids it carries; the optional
`home_assistant:` gives Home Assistant's username and discovery prefix. Exits 2 naming the bad entry
when the inventory is wrong; the output file is replaced whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.fleetctl.acl import parse_home_assistant, parse_inventory, render_acl
from agent.fsutil import atomic_write_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("inventory", type=Path, help="inventory YAML (devices: {id: [groups]}, sites: ...)")
    parser.add_argument("--prefix", default="edge", help="topic prefix, mqtt.topic_prefix (default: edge)")
    parser.add_argument("--controller", default="controller", help="the controller's username")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        data = yaml.safe_load(args.inventory.read_text())
        devices, sites = parse_inventory(data)
        home_assistant = parse_home_assistant(data)
        acl = render_acl(
            devices,
            prefix=args.prefix,
            controller=args.controller,
            sites=sites,
            home_assistant=home_assistant,
        )
    except (OSError, yaml.YAMLError, ValueError) as exc:
        print(f"fleet_acl: {args.inventory}: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(acl)
    else:
        atomic_write_bytes(args.output, acl.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
