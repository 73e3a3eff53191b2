"""What detection finds: the accelerator kinds, the runtimes that could use each, and the
`CpuInfo`, `Accelerator` and `HardwareInfo` records (with the fingerprint backend choice keys on)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias

# Accelerator kinds.
NVIDIA_JETSON = "nvidia-jetson"
NVIDIA_GPU = "nvidia-gpu"
INTEL_NPU = "intel-npu"
INTEL_GPU = "intel-gpu"
INTEL_NCS2 = "intel-ncs2"
CORAL_USB = "coral-usb"
CORAL_PCIE = "coral-pcie"
HAILO = "hailo"
ROCKCHIP_NPU = "rockchip-npu"
KINDS: tuple[str, ...] = (
    NVIDIA_JETSON,
    NVIDIA_GPU,
    INTEL_NPU,
    HAILO,
    CORAL_PCIE,
    CORAL_USB,
    INTEL_NCS2,
    ROCKCHIP_NPU,
    INTEL_GPU,
)
"""Every kind, in the order `HardwareInfo.accelerators` lists them (not a ranking of backends)."""

DetailValue: TypeAlias = str | int | bool | tuple[str, ...]

# Backend names (see providers/): what could use each kind.
_TRT_CUDA = ("onnxruntime/TensorrtExecutionProvider", "onnxruntime/CUDAExecutionProvider")
RUNTIMES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        NVIDIA_JETSON: _TRT_CUDA,
        NVIDIA_GPU: _TRT_CUDA,
        INTEL_NPU: ("openvino/NPU",),
        INTEL_GPU: ("openvino/GPU",),
        INTEL_NCS2: ("openvino/MYRIAD",),
        CORAL_USB: ("tflite/edgetpu",),
        CORAL_PCIE: ("tflite/edgetpu",),
        HAILO: ("hailort",),
        ROCKCHIP_NPU: ("rknn",),
    }
)

FINGERPRINT_DETAIL_KEYS: tuple[str, ...] = (
    "driver_version",
    "driver_loaded",
    "l4t_version",
    "jetpack_version",
)
"""The details of an accelerator that take part in `HardwareInfo.fingerprint()`."""


@dataclass(frozen=True)
class CpuInfo:
    """The CPU. `flags` holds only the ISA features backends care about (see `CPU_FLAGS`)."""

    model: str
    """e.g. "Intel(R) Xeon(R) Processor", "ARM Cortex-A78AE", "ARM Cortex-A55 x4 + Cortex-A76 x4"."""
    arch: str
    """"x86_64", "aarch64", "armv7l", ...; "unknown" when nothing says."""
    vendor: str
    """"GenuineIntel", "AuthenticAMD", "ARM", "NVIDIA", ...; "" when unknown."""
    logical_cores: int | None
    flags: tuple[str, ...]
    """Sorted kernel flag names, plus "neon" where the kernel says "asimd" and "amx" with amx_tile."""
    memory_total_bytes: int | None

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "arch": self.arch,
            "vendor": self.vendor,
            "logical_cores": self.logical_cores,
            "flags": list(self.flags),
            "memory_total_bytes": self.memory_total_bytes,
        }


@dataclass(frozen=True)
class Accelerator:
    """One accelerator, with what could use it (`runtimes`) and what to install (`install_hint`).

    `details` is read-only and holds what was found: driver version, PCI address / USB path,
    device nodes, L4T/JetPack version, notes, and `driver_loaded`: the device node a runtime
    opens is there (for a USB stick, its usbfs node; for the others, their kernel driver's).
    """

    kind: str
    model: str
    details: Mapping[str, DetailValue] = field(default_factory=dict, hash=False)
    runtimes: tuple[str, ...] = ()
    install_hint: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @property
    def driver_version(self) -> str | None:
        value = self.details.get("driver_version")
        return value if isinstance(value, str) else None

    @property
    def device_nodes(self) -> tuple[str, ...]:
        value = self.details.get("device_nodes", ())
        return value if isinstance(value, tuple) else ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": self.model,
            "details": {k: list(v) if isinstance(v, tuple) else v for k, v in self.details.items()},
            "runtimes": list(self.runtimes),
            "install_hint": self.install_hint,
        }


@dataclass(frozen=True)
class HardwareInfo:
    cpu: CpuInfo
    accelerators: tuple[Accelerator, ...]
    os_release: str | None
    """PRETTY_NAME of /etc/os-release."""
    kernel: str | None
    """The kernel release, e.g. "6.8.0-45-generic"."""
    root: Path
    """The root that was read ("/" on a real box)."""

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.kind for a in self.accelerators))

    def by_kind(self, kind: str) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.kind == kind)

    def fingerprint(self) -> str:
        """A short, stable hash of what matters for backend choice.

        Covers the CPU's arch, model and flags and each accelerator's kind, model and
        `FINGERPRINT_DETAIL_KEYS` (driver, L4T and JetPack versions, whether the driver is
        loaded). Not memory, core counts, addresses, serials, the root or any time.
        """
        accelerators = sorted(
            [a.kind, a.model, *(f"{k}={a.details[k]}" for k in FINGERPRINT_DETAIL_KEYS if k in a.details)]
            for a in self.accelerators
        )
        payload = {
            "v": 1,
            "arch": self.cpu.arch,
            "cpu": self.cpu.model,
            "flags": list(self.cpu.flags),
            "accelerators": accelerators,
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "os_release": self.os_release,
            "kernel": self.kernel,
            "cpu": self.cpu.to_dict(),
            "accelerators": [a.to_dict() for a in self.accelerators],
            "fingerprint": self.fingerprint(),
        }
