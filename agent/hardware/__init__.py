"""Hardware detection: what this box has, read from files only.

Everything here reads plain files under a root directory: /proc, /sys, /dev (existence only, a
device node is never opened) and /etc (plus /var/lib/dpkg/status on a Jetson). No vendor tool
(nvidia-smi, lsusb, hailortcli, ...) is run and no runtime is imported, so detection works on a
box where nothing is installed yet, and tests point it at fixture trees that look like real
boxes (tests/fixtures/sysroots/).

The root is the `root` argument, else the `EDGE_AGENT_SYSROOT` environment variable (read at
call time), else "/". Symbolic links inside a root other than "/" are followed as a chroot
would: an absolute target, or ".." past the top, stays inside the root.

Missing, unreadable (a directory, a broken link, a FIFO, a permission error) and malformed files
are normal and skipped: `detect_hardware()` never raises because of what it reads.

What is read, per accelerator kind:

- nvidia-gpu: PCI vendor 0x10de with class 0x03xxxx under /sys/bus/pci/devices, and
  /proc/driver/nvidia/version (driver) plus /proc/driver/nvidia/gpus/*/information (Model,
  Bus Location, Device Minor); /dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm.
- nvidia-jetson: /proc/device-tree/model and compatible (nvidia,tegra234 = Orin, ...),
  /etc/nv_tegra_release (L4T), the nvidia-l4t-core, nvidia-jetpack and tensorrt entries of
  /var/lib/dpkg/status; /dev/nvmap, /dev/nvhost-*, /dev/nvgpu/igpu0/ctrl.
- intel-npu: PCI 8086 with class 0x1200xx (Meteor Lake 7d1d, Arrow Lake ad1d, Lunar Lake 643e,
  Panther Lake b03e, Wildcat Lake fd3e) and /dev/accel/accel*.
- intel-gpu: PCI 8086 with class 0x03xxxx and /dev/dri/renderD*.
- intel-ncs2: USB 03e7:2485 (NCS2, Myriad X), 03e7:2150 (NCS1, Myriad 2), 03e7:f63b (booted).
- coral-usb: USB 1a6e:089a (before the runtime loads its firmware) or 18d1:9302 (after).
- coral-pcie: PCI 1ac1:089a and /dev/apex_*.
- hailo: PCI 1e60:2864 (Hailo-8 and Hailo-8L share it) and /dev/hailo*.
- rockchip-npu: device-tree compatible rockchip,rk3588 (rk3588s, rk3576, rk3568, rk3566, rk3562),
  with the driver's version file (/sys/kernel/debug/rknpu/version, /proc/debug/rknpu/...,
  as the RKNN docs show), /sys/class/devfreq/*.npu and its DRM/accel node.
USB devices come from /sys/bus/usb/devices/*/{idVendor,idProduct,product,manufacturer,...}.

The package: `records` (the kinds and the records detection returns), `files` (the chroot-like
reader and its small parsers), `buses` (PCI and USB devices), `cpu` (the CPU, OS release, kernel)
and a module per accelerator family (`nvidia`, `intel`, `addons` for USB sticks and PCIe cards,
`rockchip`); `detect_hardware()` here runs each detector guarded and orders what they find.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.hardware.addons import coral_pcie, hailo_devices, usb_accelerators
from agent.hardware.buses import Pci, Usb, pci_devices, usb_devices
from agent.hardware.cpu import CPU_FLAGS, detect_cpu, kernel_release, read_os_release
from agent.hardware.files import Tree, dt_strings
from agent.hardware.intel import intel_gpus, intel_npus
from agent.hardware.nvidia import JETPACK_FOR_L4T, detect_jetson, jetpack_for_l4t, nvidia_gpus
from agent.hardware.records import (
    CORAL_PCIE,
    CORAL_USB,
    FINGERPRINT_DETAIL_KEYS,
    HAILO,
    INTEL_GPU,
    INTEL_NCS2,
    INTEL_NPU,
    KINDS,
    NVIDIA_GPU,
    NVIDIA_JETSON,
    ROCKCHIP_NPU,
    RUNTIMES,
    Accelerator,
    CpuInfo,
    DetailValue,
    HardwareInfo,
)
from agent.hardware.rockchip import rockchip_npu

# Detection's root, shared with the backends' probes (re-exported: callers import it from here).
from providers.base import SYSROOT_ENV, sysroot

__all__ = [
    "CORAL_PCIE",
    "CORAL_USB",
    "CPU_FLAGS",
    "FINGERPRINT_DETAIL_KEYS",
    "HAILO",
    "INTEL_GPU",
    "INTEL_NCS2",
    "INTEL_NPU",
    "JETPACK_FOR_L4T",
    "KINDS",
    "NVIDIA_GPU",
    "NVIDIA_JETSON",
    "ROCKCHIP_NPU",
    "RUNTIMES",
    "SYSROOT_ENV",
    "Accelerator",
    "CpuInfo",
    "DetailValue",
    "HardwareInfo",
    "detect_hardware",
    "jetpack_for_l4t",
    "sysroot",
]

log = logging.getLogger(__name__)


_T = TypeVar("_T")


def _guarded(what: str, default: _T, detect: Callable[[], _T]) -> _T:
    """Run one detector; a bug in it must cost only its own findings, never the daemon's start."""
    try:
        return detect()
    except Exception:
        log.exception("hardware detection of %s failed; reporting none", what)
        return default


def _device_tree(tree: Tree) -> tuple[str | None, list[str]]:
    for base in ("proc/device-tree", "sys/firmware/devicetree/base"):
        model = next(iter(dt_strings(tree.read(f"{base}/model"))), None)
        compatible = dt_strings(tree.read(f"{base}/compatible"))
        if model or compatible:
            return model, compatible
    return None, []


def detect_hardware(root: Path | None = None) -> HardwareInfo:
    """Detect the CPU and accelerators of the box whose files lie under `root` (see `sysroot`).

    Never raises because of the files it reads: missing, unreadable or garbled files are skipped.
    """
    tree = Tree(sysroot(root))
    empty_cpu = CpuInfo("unknown", "unknown", "", None, (), None)
    cpu = _guarded("the CPU", empty_cpu, lambda: detect_cpu(tree))
    no_device_tree: tuple[str | None, list[str]] = (None, [])
    dt_model, compatible = _guarded("the device tree", no_device_tree, lambda: _device_tree(tree))
    pcis: list[Pci] = _guarded("PCI devices", [], lambda: pci_devices(tree))
    usbs: list[Usb] = _guarded("USB devices", [], lambda: usb_devices(tree))
    on_tegra = any(c.startswith("nvidia,tegra") for c in compatible)

    accelerators: list[Accelerator] = []
    jetson = _guarded(NVIDIA_JETSON, None, lambda: detect_jetson(tree, dt_model, compatible))
    rockchip = _guarded(ROCKCHIP_NPU, None, lambda: rockchip_npu(tree, compatible))
    accelerators += [a for a in (jetson, rockchip) if a is not None]
    accelerators += _guarded(NVIDIA_GPU, [], lambda: nvidia_gpus(tree, pcis, on_tegra or jetson is not None))
    accelerators += _guarded(INTEL_NPU, [], lambda: intel_npus(tree, pcis))
    accelerators += _guarded(INTEL_GPU, [], lambda: intel_gpus(tree, pcis))
    accelerators += _guarded("USB accelerators", [], lambda: usb_accelerators(tree, usbs))
    accelerators += _guarded(CORAL_PCIE, [], lambda: coral_pcie(tree, pcis))
    accelerators += _guarded(HAILO, [], lambda: hailo_devices(tree, pcis))

    def order(accelerator: Accelerator) -> tuple[int, str]:
        where = accelerator.details.get("pci_address") or accelerator.details.get("usb_path") or ""
        return KINDS.index(accelerator.kind), str(where)

    info = HardwareInfo(
        cpu=cpu,
        accelerators=tuple(sorted(accelerators, key=order)),
        os_release=_guarded("os-release", None, lambda: read_os_release(tree)),
        kernel=_guarded("the kernel", None, lambda: kernel_release(tree)),
        root=tree.root,
    )
    log.debug(
        "hardware under %s: %s %s, accelerators: %s",
        info.root,
        cpu.arch,
        cpu.model,
        ", ".join(f"{a.kind} ({a.model})" for a in info.accelerators) or "none",
    )
    return info
