"""Intel NPUs (ivpu, /dev/accel) and integrated GPUs (/dev/dri render nodes), the OpenVINO devices on
PCI; the Movidius sticks are USB devices (`addons`)."""

from __future__ import annotations

from agent.hardware.buses import Pci, class_nodes, dev_glob, pci_details
from agent.hardware.files import Tree
from agent.hardware.records import INTEL_GPU, INTEL_NPU, RUNTIMES, Accelerator

_INTEL_NPUS = {  # PCI device id -> (platform, NPU generation), from the kernel's ivpu driver
    0x7D1D: ("Meteor Lake", "37xx"),
    0xAD1D: ("Arrow Lake", "37xx"),
    0x643E: ("Lunar Lake", "40xx"),
    0xB03E: ("Panther Lake", "50xx"),
    0xFD3E: ("Wildcat Lake", "50xx"),
}

_INTEL_GPUS = {  # a few edge-box iGPUs; others are named by their PCI id
    0x3EA5: "Intel Iris Plus Graphics 655 (Coffee Lake)",
    0x9A49: "Intel Iris Xe Graphics (Tiger Lake)",
    0x46A6: "Intel Iris Xe Graphics (Alder Lake-P)",
    0x46D1: "Intel UHD Graphics (Alder Lake-N)",
    0x7D55: "Intel Arc Graphics (Meteor Lake)",
    0x7DD5: "Intel Graphics (Meteor Lake)",
    0x64A0: "Intel Arc Graphics 140V (Lunar Lake)",
}


def intel_npus(tree: Tree, pcis: list[Pci]) -> list[Accelerator]:
    npus = [p for p in pcis if p.vendor == 0x8086 and (p.device in _INTEL_NPUS or p.cls >> 8 == 0x1200)]
    found: list[Accelerator] = []
    for pci in npus:
        details = pci_details(pci)
        nodes = class_nodes(tree, pci, "accel", "accel", "dev/accel")
        if not nodes and len(npus) == 1:
            nodes = tuple(dev_glob(tree, "dev/accel", "accel"))
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)
        known = _INTEL_NPUS.get(pci.device)
        if known:
            details["npu_generation"] = known[1]
            model = f"Intel AI Boost NPU ({known[0]})"
        else:
            model = f"Intel NPU (PCI {pci.pci_id})"
        if nodes:
            hint = (
                "install openvino>=2024 and the Intel NPU user-space driver (intel-driver-compiler-npu, "
                "intel-level-zero-npu from github.com/intel/linux-npu-driver); the user needs the render "
                "group for /dev/accel/accel*"
            )
        else:
            hint = (
                "the NPU has no /dev/accel node: use Linux >= 6.6 with the intel_vpu driver, install the "
                "Intel NPU user-space driver (github.com/intel/linux-npu-driver), then openvino>=2024"
            )
        found.append(Accelerator(INTEL_NPU, model, details, RUNTIMES[INTEL_NPU], hint))
    return found


def intel_gpus(tree: Tree, pcis: list[Pci]) -> list[Accelerator]:
    gpus = [p for p in pcis if p.vendor == 0x8086 and p.cls >> 16 == 0x03]
    found: list[Accelerator] = []
    for pci in gpus:
        details = pci_details(pci)
        nodes = class_nodes(tree, pci, "drm", "renderD", "dev/dri")
        if not nodes and len(gpus) == 1:
            nodes = tuple(dev_glob(tree, "dev/dri", "renderD"))
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)
        model = _INTEL_GPUS.get(pci.device, f"Intel GPU (PCI {pci.pci_id})")
        if nodes:
            hint = (
                "install openvino>=2024 and Intel's GPU compute runtime (intel-opencl-icd, "
                "intel-level-zero-gpu); the user needs the render group for /dev/dri/renderD*"
            )
        else:
            hint = (
                "no /dev/dri render node: the i915/xe kernel driver is not loaded; then install "
                "openvino>=2024 and intel-opencl-icd"
            )
        found.append(Accelerator(INTEL_GPU, model, details, RUNTIMES[INTEL_GPU], hint))
    return found
