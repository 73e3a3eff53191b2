"""Add-on accelerators: USB sticks (Intel NCS/NCS2 Movidius, Coral USB Edge TPU) and PCIe/M.2 cards
(Coral Edge TPU, Hailo-8/8L)."""

from __future__ import annotations

from agent.hardware.buses import Pci, Usb, class_nodes, dev_glob, dev_nodes, pci_details
from agent.hardware.files import Tree
from agent.hardware.records import (
    CORAL_PCIE,
    CORAL_USB,
    HAILO,
    INTEL_NCS2,
    RUNTIMES,
    Accelerator,
    DetailValue,
)

_NCS2_MODEL = "Intel Neural Compute Stick 2 (Movidius Myriad X)"
_CORAL_USB_MODEL = "Google Coral USB Accelerator (Edge TPU)"
_USB_KINDS = {  # (vendor, product) -> (kind, model, firmware state)
    (0x03E7, 0x2485): (INTEL_NCS2, _NCS2_MODEL, "not booted"),
    # After OpenVINO boots a stick it re-enumerates as f63b; same model, so the fingerprint holds.
    (0x03E7, 0xF63B): (INTEL_NCS2, _NCS2_MODEL, "booted"),
    (0x03E7, 0x2150): (INTEL_NCS2, "Intel Neural Compute Stick (Movidius Myriad 2)", "not booted"),
    (0x1A6E, 0x089A): (CORAL_USB, _CORAL_USB_MODEL, "unprogrammed"),
    (0x18D1, 0x9302): (CORAL_USB, _CORAL_USB_MODEL, "programmed"),
}
_NCS2_HINT = (
    "OpenVINO dropped the MYRIAD plugin after 2022.3 LTS: install openvino==2022.3.* "
    "(Python <= 3.10) and the Movidius udev rules (97-myriad-usbboot.rules); newer OpenVINO "
    "releases cannot use this stick"
)
_CORAL_HINT = (
    "install the Edge TPU runtime libedgetpu1-std (Coral apt repository) and a TFLite runtime "
    "(ai-edge-litert or tflite-runtime); models must be compiled with edgetpu_compiler"
)


def usb_accelerators(tree: Tree, usbs: list[Usb]) -> list[Accelerator]:
    found: list[Accelerator] = []
    for usb in usbs:
        known = _USB_KINDS.get((usb.vendor, usb.product_id))
        if known is None:
            continue
        kind, model, state = known
        details: dict[str, DetailValue] = {"usb_id": usb.usb_id, "usb_path": usb.path}
        details["firmware_state"] = state
        nodes: tuple[str, ...] = ()
        if usb.busnum is not None and usb.devnum is not None:
            details["usb_bus"], details["usb_device"] = usb.busnum, usb.devnum
            nodes = dev_nodes(tree, f"dev/bus/usb/{usb.busnum:03d}/{usb.devnum:03d}")
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)  # the runtimes drive the stick through usbfs (libusb)
        if usb.speed is not None:
            details["usb_speed_mbps"] = usb.speed
        if usb.product:
            details["usb_product"] = usb.product
        if usb.manufacturer:
            details["usb_manufacturer"] = usb.manufacturer
        if kind == INTEL_NCS2:
            details["note"] = "OpenVINO supports MYRIAD devices only up to 2022.3 LTS"
            if usb.speed is not None and usb.speed < 5000:
                details["usb_note"] = "running at USB 2 speed: a USB 3 port is much faster"
        hint = _NCS2_HINT if kind == INTEL_NCS2 else _CORAL_HINT
        found.append(Accelerator(kind, model, details, RUNTIMES[kind], hint))
    return found


def _pci_with_nodes(
    tree: Tree,
    pcis: list[Pci],
    pci_ids: set[tuple[int, int]],
    class_dir: str,
    node_prefix: str,
) -> list[tuple[Pci, tuple[str, ...]]]:
    """PCI devices with those ids and their /dev/<prefix>N nodes (by sysfs class dir, else in order)."""
    matches = [p for p in pcis if (p.vendor, p.device) in pci_ids]
    spare = dev_glob(tree, "dev", node_prefix)
    result: list[tuple[Pci, tuple[str, ...]]] = []
    for index, pci in enumerate(matches):
        nodes = class_nodes(tree, pci, class_dir, node_prefix, "dev")
        if not nodes and len(spare) == len(matches):
            nodes = (spare[index],)
        result.append((pci, nodes))
    return result


def coral_pcie(tree: Tree, pcis: list[Pci]) -> list[Accelerator]:
    found: list[Accelerator] = []
    for pci, nodes in _pci_with_nodes(tree, pcis, {(0x1AC1, 0x089A)}, "apex", "apex_"):
        details = pci_details(pci)
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)
        if nodes:
            hint = _CORAL_HINT + "; the user needs the apex group for /dev/apex_*"
        else:
            hint = (
                "no /dev/apex_* node: install gasket-dkms (the apex driver) from the Coral apt repository; "
                + _CORAL_HINT.replace("install", "then install", 1)
            )
        found.append(
            Accelerator(CORAL_PCIE, "Google Coral Edge TPU (PCIe/M.2)", details, RUNTIMES[CORAL_PCIE], hint)
        )
    return found


def hailo_devices(tree: Tree, pcis: list[Pci]) -> list[Accelerator]:
    found: list[Accelerator] = []
    for pci, nodes in _pci_with_nodes(tree, pcis, {(0x1E60, 0x2864)}, "hailo_chardev", "hailo"):
        details = pci_details(pci)
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)
        details["note"] = "Hailo-8 and Hailo-8L share PCI id 1e60:2864 (hailortcli fw-control identify tells)"
        hint = (
            "install HailoRT and its PCIe driver of the same version (Raspberry Pi OS: sudo apt install "
            "hailo-all; elsewhere hailort and hailort-pcie-driver from the Hailo Developer Zone)"
        )
        found.append(Accelerator(HAILO, "Hailo-8/Hailo-8L AI accelerator", details, RUNTIMES[HAILO], hint))
    return found
