"""PCI and USB devices as sysfs lists them, and the device nodes that go with them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.hardware.files import Tree, clean_text, parse_hex, parse_int
from agent.hardware.records import DetailValue


@dataclass(frozen=True)
class Pci:
    address: str
    vendor: int
    device: int
    cls: int
    subsystem: str | None
    driver: str | None

    @property
    def pci_id(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"


PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def pci_devices(tree: Tree) -> list[Pci]:
    devices: list[Pci] = []
    for name in tree.listdir("sys/bus/pci/devices"):
        if not PCI_ADDRESS.fullmatch(name):
            continue
        base = f"sys/bus/pci/devices/{name}"
        vendor, device, cls = (parse_hex(tree.value(f"{base}/{a}")) for a in ("vendor", "device", "class"))
        if vendor is None or device is None or cls is None:
            continue
        sub_vendor = parse_hex(tree.value(f"{base}/subsystem_vendor"))
        sub_device = parse_hex(tree.value(f"{base}/subsystem_device"))
        subsystem = None
        if sub_vendor is not None and sub_device is not None:
            subsystem = f"{sub_vendor:04x}:{sub_device:04x}"
        devices.append(Pci(name, vendor, device, cls, subsystem, tree.link_name(f"{base}/driver")))
    return devices


@dataclass(frozen=True)
class Usb:
    path: str
    vendor: int
    product_id: int
    product: str | None
    manufacturer: str | None
    busnum: int | None
    devnum: int | None
    speed: int | None

    @property
    def usb_id(self) -> str:
        return f"{self.vendor:04x}:{self.product_id:04x}"


def usb_devices(tree: Tree) -> list[Usb]:
    devices: list[Usb] = []
    for name in tree.listdir("sys/bus/usb/devices"):
        if ":" in name:  # an interface, not a device
            continue
        base = f"sys/bus/usb/devices/{name}"
        vendor, product_id = (
            parse_hex(tree.value(f"{base}/idVendor")),
            parse_hex(tree.value(f"{base}/idProduct")),
        )
        if vendor is None or product_id is None:
            continue
        speed = re.match(r"\d+", tree.value(f"{base}/speed") or "")
        devices.append(
            Usb(
                path=name,
                vendor=vendor,
                product_id=product_id,
                product=clean_text(tree.value(f"{base}/product")),
                manufacturer=clean_text(tree.value(f"{base}/manufacturer")),
                busnum=parse_int(tree.value(f"{base}/busnum")),
                devnum=parse_int(tree.value(f"{base}/devnum")),
                speed=int(speed.group()) if speed else None,
            )
        )
    return devices


def dev_nodes(tree: Tree, *rels: str) -> tuple[str, ...]:
    return tuple(f"/{rel}" for rel in rels if tree.exists(rel))


def class_nodes(tree: Tree, pci: Pci, subdir: str, prefix: str, dev_dir: str) -> tuple[str, ...]:
    """Device nodes of a PCI device's class devices (e.g. <pci>/drm/renderD128 -> /dev/dri/renderD128)."""
    names = [n for n in tree.listdir(f"sys/bus/pci/devices/{pci.address}/{subdir}") if n.startswith(prefix)]
    return dev_nodes(tree, *(f"{dev_dir}/{n}" for n in names))


def dev_glob(tree: Tree, dev_dir: str, prefix: str) -> list[str]:
    names = [n for n in tree.listdir(dev_dir) if re.fullmatch(re.escape(prefix) + r"\d{1,4}", n)]
    return [f"/{dev_dir}/{n}" for n in sorted(names, key=lambda n: int(n[len(prefix) :]))]


def pci_details(pci: Pci) -> dict[str, DetailValue]:
    details: dict[str, DetailValue] = {"pci_address": pci.address, "pci_id": pci.pci_id}
    if pci.subsystem:
        details["pci_subsystem_id"] = pci.subsystem
    if pci.driver:
        details["kernel_driver"] = pci.driver
    return details
