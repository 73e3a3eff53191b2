"""Rockchip NPUs (RK3588 and kin): the SoC from the device tree, the rknpu driver's version and nodes."""

from __future__ import annotations

import re

from agent.hardware.buses import dev_glob, dev_nodes
from agent.hardware.files import Tree, uevent_fields
from agent.hardware.records import ROCKCHIP_NPU, RUNTIMES, Accelerator, DetailValue

_ROCKCHIP_NPUS = {  # SoC -> (name, NPU cores); the RKNN toolkit's platforms
    "rk3588": ("RK3588", 3),
    "rk3588s": ("RK3588S", 3),
    "rk3576": ("RK3576", 2),
    "rk3568": ("RK3568", 1),
    "rk3566": ("RK3566", 1),
    "rk3562": ("RK3562", 1),
}
_RKNPU_VERSION_FILES = (  # where the RKNN docs say the driver version can be read
    "sys/kernel/debug/rknpu/version",
    "sys/kernel/debug/rknpu/driver_version",
    "proc/debug/rknpu/driver_version",
    "proc/debug/rknpu/version",
)


def rockchip_npu(tree: Tree, compatible: list[str]) -> Accelerator | None:
    socs = [c.split(",", 1)[1] for c in compatible if c.startswith("rockchip,")]
    soc = next((s for s in socs if s in _ROCKCHIP_NPUS), None)
    if soc is None:
        return None
    name, cores = _ROCKCHIP_NPUS[soc]
    details: dict[str, DetailValue] = {"soc": soc, "npu_cores": cores}
    for rel in _RKNPU_VERSION_FILES:
        match = re.search(r"v?(\d{1,3}\.\d{1,3}\.\d{1,3})", tree.value(rel) or "")
        if match:
            details["driver_version"] = match.group(1)
            break
    devfreq = [n for n in tree.listdir("sys/class/devfreq") if n.endswith(".npu")]
    if devfreq:
        details["devfreq"] = devfreq[0]
    drivers: dict[str, str] = {}
    nodes: list[str] = []
    for class_dir, prefix, dev_dir in (("drm", "renderD", "dev/dri"), ("accel", "accel", "dev/accel")):
        for node in tree.listdir(f"sys/class/{class_dir}"):
            if not node.startswith(prefix):
                continue
            uevent = uevent_fields(tree.read(f"sys/class/{class_dir}/{node}/device/uevent"))
            driver = uevent.get("DRIVER", "").lower()
            if driver in ("rknpu", "rocket") or "rknpu" in uevent.get("OF_COMPATIBLE_0", ""):
                drivers[driver or "rknpu"] = node
                nodes.extend(dev_nodes(tree, f"{dev_dir}/{node}"))
    nodes.extend(dev_glob(tree, "dev", "rknpu") + list(dev_nodes(tree, "dev/rknpu")))
    details["device_nodes"] = tuple(dict.fromkeys(nodes))
    if drivers:
        details["kernel_driver"] = next(iter(drivers))
    details["driver_loaded"] = bool(nodes or devfreq or "driver_version" in details)
    if "rocket" in drivers:
        details["note"] = (
            "the mainline rocket driver serves Mesa's Teflon TFLite delegate; RKNN (librknnrt) needs "
            "Rockchip's rknpu driver"
        )
    hint = (
        "install rknn-toolkit-lite2 and librknnrt.so from github.com/airockchip/rknn-toolkit2 matching "
        "the NPU driver; models must be converted to .rknn with rknn-toolkit2"
    )
    if not details["driver_loaded"]:
        hint = f"the rknpu kernel driver is not loaded: use a Rockchip BSP kernel with it; {hint}"
    return Accelerator(ROCKCHIP_NPU, f"Rockchip {name} NPU", details, RUNTIMES[ROCKCHIP_NPU], hint)
