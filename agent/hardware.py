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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias, TypeVar

# Detection's root, shared with the backends' probes (re-exported: callers import it from here).
from providers.base import SYSROOT_ENV as SYSROOT_ENV
from providers.base import sysroot as sysroot

log = logging.getLogger(__name__)


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

_MAX_READ = 1 << 20  # a /proc or /sys file, /etc/os-release, ...
_MAX_CPUINFO = 8 << 20  # /proc/cpuinfo of a many-core server
_MAX_DPKG_STATUS = 64 << 20
_MAX_LINK_HOPS = 40


# --------------------------------------------------------------------------- records


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


# --------------------------------------------------------------------------- file access


class _Tree:
    """Read-only access to a box's files under `root`; every method answers, none raises."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._host_root = os.path.realpath(root) == "/"

    def path(self, rel: str) -> Path | None:
        """Where the box's `/rel` lies on this machine, following links as a chroot would."""
        if self._host_root:
            return Path("/", rel.lstrip("/"))
        pending = [p for p in rel.split("/") if p not in ("", ".")]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = self.root.joinpath(*resolved, part)
            try:
                target = os.readlink(candidate)
            except (OSError, ValueError):  # not a link, or not there: open() decides later
                resolved.append(part)
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return None
            if target.startswith("/"):
                resolved = []
            pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
        return self.root.joinpath(*resolved)

    def read(self, rel: str, limit: int = _MAX_READ) -> str | None:
        """The text of a regular file (at most `limit` bytes, bad UTF-8 replaced), else None."""
        path = self.path(rel)
        if path is None:
            return None
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
            try:
                chunks: list[bytes] = []
                size = 0
                while size < limit:
                    chunk = os.read(fd, min(1 << 16, limit - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, exc)
            return None
        return b"".join(chunks).decode("utf-8", errors="replace")

    def value(self, rel: str) -> str | None:
        """A one-value file (sysfs attribute): stripped of whitespace and NULs; None when empty."""
        text = self.read(rel, 4096)
        if text is None:
            return None
        text = text.strip().strip("\x00").strip()
        return text or None

    def lines(self, rel: str, limit: int) -> Iterator[str]:
        """The lines of a large regular file (at most `limit` bytes), without line ends."""
        path = self.path(rel)
        if path is None:
            return
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return
            with open(path, "rb") as handle:
                size = 0
                for raw in handle:
                    size += len(raw)
                    if size > limit:
                        return
                    yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, exc)

    def listdir(self, rel: str) -> list[str]:
        path = self.path(rel)
        if path is None:
            return []
        try:
            return sorted(os.listdir(path))
        except (OSError, ValueError):
            return []

    def exists(self, rel: str) -> bool:
        path = self.path(rel)
        return path is not None and os.path.exists(path)

    def link_name(self, rel: str) -> str | None:
        """The last component of a link's target (a sysfs `driver` link names the driver)."""
        parent, _, name = rel.rstrip("/").rpartition("/")
        path = self.path(parent)
        if path is None:
            return None
        try:
            target = os.readlink(path / name)
        except (OSError, ValueError):
            return None
        return target.rstrip("/").rpartition("/")[2] or None


# --------------------------------------------------------------------------- small parsers

_HEX = re.compile(r"(?:0x)?([0-9a-fA-F]{1,8})")


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    match = _HEX.fullmatch(text.strip())
    return int(match.group(1), 16) if match else None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d{1,18}", text) else None


def _clean(text: str | None, limit: int = 200) -> str | None:
    """A name from a file made printable and bounded; None when nothing is left."""
    if text is None:
        return None
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())[:limit]
    return text or None


def _colon_fields(text: str | None) -> dict[str, str]:
    """`Key: value` lines (/proc/driver/nvidia/gpus/*/information, uevent-like files)."""
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def _uevent(text: str | None) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _dt_strings(text: str | None) -> list[str]:
    """A device-tree string list (NUL-separated, NUL-terminated)."""
    return [s for s in (_clean(part) for part in (text or "").split("\x00")) if s]


# --------------------------------------------------------------------------- CPU

CPU_FLAGS: tuple[str, ...] = (
    # x86
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    # arm
    "neon",
    "asimd",
    "asimdhp",
    "asimddp",
    "fphp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
    "sme",
)
"""The ISA flags reported in `CpuInfo.flags` (kernel spelling), when every core has them."""

_ARM_IMPLEMENTERS = {
    0x41: "ARM",
    0x42: "Broadcom",
    0x4E: "NVIDIA",
    0x51: "Qualcomm",
    0x61: "Apple",
    0xC0: "Ampere",
}
_ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53",
    (0x41, 0xD04): "Cortex-A35",
    (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72",
    (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE",
    (0x41, 0xD44): "Cortex-X1",
    (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520",
    (0x41, 0xD81): "Cortex-A720",
    (0x4E, 0x004): "Carmel",
}
_ARCH_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    block: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if block:
                blocks.append(block)
                block = {}
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip():
            block.setdefault(key.strip(), value.strip())
    if block:
        blocks.append(block)
    return blocks


def _parse_arch(text: str | None) -> str | None:
    value = (_clean(text) or "").lower()
    value = _ARCH_ALIASES.get(value, value)
    return value if re.fullmatch(r"[a-z0-9_]{2,16}", value) else None


def _detect_cpu(tree: _Tree) -> CpuInfo:
    blocks = _cpuinfo_blocks(tree.read("proc/cpuinfo", _MAX_CPUINFO) or "")
    processors = [b for b in blocks if _int(b.get("processor")) is not None]
    extra: dict[str, str] = {}  # lines outside processor blocks (Raspberry Pi: Revision, Model)
    for block in blocks:
        if _int(block.get("processor")) is None:
            extra.update(block)

    x86 = any("vendor_id" in b or "flags" in b for b in processors)
    flag_sets = [set(b.get("flags" if x86 else "Features", "").split()) for b in processors]
    flag_sets = [s for s in flag_sets if s]
    common = set.intersection(*flag_sets) if flag_sets else set()
    if "asimd" in common:
        common.add("neon")
    flags = {f for f in common if f in CPU_FLAGS}
    if "amx_tile" in common:
        flags.add("amx")

    arch = _parse_arch(tree.read("proc/sys/kernel/arch"))
    if arch is None and processors:
        if x86:
            arch = "x86_64" if "lm" in common else "i686"
        elif "asimd" in common or any(b.get("CPU architecture") == "AArch64" for b in processors):
            arch = "aarch64"
        elif "CPU architecture" in processors[0]:
            arch = "armv7l"
    if arch is None:
        version = tree.read("proc/version") or ""
        for token, name in (("aarch64", "aarch64"), ("x86_64", "x86_64"), ("x86-64", "x86_64")):
            if token in version:
                arch = name
                break

    vendor = ""
    model: str | None = None
    first = processors[0] if processors else {}
    if x86:
        vendor = _clean(first.get("vendor_id")) or ""
        model = _clean(first.get("model name"))
    elif processors:
        parts: dict[str, int] = {}
        for block in processors:
            implementer, part = _hex(block.get("CPU implementer")), _hex(block.get("CPU part"))
            if implementer is None or part is None:
                continue
            vendor = vendor or _ARM_IMPLEMENTERS.get(implementer, "")
            name = _ARM_PARTS.get((implementer, part), f"implementer 0x{implementer:02x} part 0x{part:03x}")
            parts[name] = parts.get(name, 0) + 1
        if len(parts) == 1:
            model = f"{vendor or 'ARM'} {next(iter(parts))}"
        elif parts:
            model = f"{vendor or 'ARM'} " + " + ".join(f"{name} x{count}" for name, count in parts.items())
        model = model or _clean(first.get("model name")) or _clean(extra.get("Hardware"))

    cores = len(processors) or _count_cpu_list(tree.value("sys/devices/system/cpu/online"))
    return CpuInfo(
        model=model or "unknown",
        arch=arch or "unknown",
        vendor=vendor,
        logical_cores=cores or None,
        flags=tuple(sorted(flags)),
        memory_total_bytes=_mem_total(tree.read("proc/meminfo")),
    )


def _count_cpu_list(text: str | None) -> int:
    """Count a CPU list such as "0-3,6,8-11"; 0 when it is not one."""
    count = 0
    for part in (text or "").split(","):
        match = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", part.strip())
        if not match:
            return 0
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            return 0
        count += high - low + 1
    return count


def _mem_total(text: str | None) -> int | None:
    match = re.search(r"^MemTotal:\s+(\d{1,15})\s*kB\s*$", text or "", re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _os_release(tree: _Tree) -> str | None:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        text = tree.read(rel)
        if text is None:
            continue
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if not sep:
                continue
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            values[key.strip()] = value
        pretty = _clean(values.get("PRETTY_NAME")) or _clean(
            " ".join(v for v in (values.get("NAME"), values.get("VERSION")) if v)
        )
        if pretty:
            return pretty
    return None


def _kernel(tree: _Tree) -> str | None:
    match = re.match(r"Linux version (\S{1,100})", tree.read("proc/version") or "")
    if match:
        return _clean(match.group(1))
    return _clean(tree.value("proc/sys/kernel/osrelease"), 100)


# --------------------------------------------------------------------------- buses


@dataclass(frozen=True)
class _Pci:
    address: str
    vendor: int
    device: int
    cls: int
    subsystem: str | None
    driver: str | None

    @property
    def pci_id(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"


_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _pci_devices(tree: _Tree) -> list[_Pci]:
    devices: list[_Pci] = []
    for name in tree.listdir("sys/bus/pci/devices"):
        if not _PCI_ADDRESS.fullmatch(name):
            continue
        base = f"sys/bus/pci/devices/{name}"
        vendor, device, cls = (_hex(tree.value(f"{base}/{a}")) for a in ("vendor", "device", "class"))
        if vendor is None or device is None or cls is None:
            continue
        sub_vendor = _hex(tree.value(f"{base}/subsystem_vendor"))
        sub_device = _hex(tree.value(f"{base}/subsystem_device"))
        subsystem = None
        if sub_vendor is not None and sub_device is not None:
            subsystem = f"{sub_vendor:04x}:{sub_device:04x}"
        devices.append(_Pci(name, vendor, device, cls, subsystem, tree.link_name(f"{base}/driver")))
    return devices


@dataclass(frozen=True)
class _Usb:
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


def _usb_devices(tree: _Tree) -> list[_Usb]:
    devices: list[_Usb] = []
    for name in tree.listdir("sys/bus/usb/devices"):
        if ":" in name:  # an interface, not a device
            continue
        base = f"sys/bus/usb/devices/{name}"
        vendor, product_id = _hex(tree.value(f"{base}/idVendor")), _hex(tree.value(f"{base}/idProduct"))
        if vendor is None or product_id is None:
            continue
        speed = re.match(r"\d+", tree.value(f"{base}/speed") or "")
        devices.append(
            _Usb(
                path=name,
                vendor=vendor,
                product_id=product_id,
                product=_clean(tree.value(f"{base}/product")),
                manufacturer=_clean(tree.value(f"{base}/manufacturer")),
                busnum=_int(tree.value(f"{base}/busnum")),
                devnum=_int(tree.value(f"{base}/devnum")),
                speed=int(speed.group()) if speed else None,
            )
        )
    return devices


def _nodes(tree: _Tree, *rels: str) -> tuple[str, ...]:
    return tuple(f"/{rel}" for rel in rels if tree.exists(rel))


def _class_nodes(tree: _Tree, pci: _Pci, subdir: str, prefix: str, dev_dir: str) -> tuple[str, ...]:
    """Device nodes of a PCI device's class devices (e.g. <pci>/drm/renderD128 -> /dev/dri/renderD128)."""
    names = [n for n in tree.listdir(f"sys/bus/pci/devices/{pci.address}/{subdir}") if n.startswith(prefix)]
    return _nodes(tree, *(f"{dev_dir}/{n}" for n in names))


def _dev_glob(tree: _Tree, dev_dir: str, prefix: str) -> list[str]:
    names = [n for n in tree.listdir(dev_dir) if re.fullmatch(re.escape(prefix) + r"\d{1,4}", n)]
    return [f"/{dev_dir}/{n}" for n in sorted(names, key=lambda n: int(n[len(prefix) :]))]


def _pci_details(pci: _Pci) -> dict[str, DetailValue]:
    details: dict[str, DetailValue] = {"pci_address": pci.address, "pci_id": pci.pci_id}
    if pci.subsystem:
        details["pci_subsystem_id"] = pci.subsystem
    if pci.driver:
        details["kernel_driver"] = pci.driver
    return details


# --------------------------------------------------------------------------- NVIDIA

_CUDA_FOR_DRIVER = (  # (minimum Linux driver major, newest CUDA it runs), CUDA toolkit release notes
    (580, "13.0"),
    (575, "12.9"),
    (570, "12.8"),
    (560, "12.6"),
    (555, "12.5"),
    (550, "12.4"),
    (545, "12.3"),
    (535, "12.2"),
    (530, "12.1"),
    (525, "12.0"),
    (520, "11.8"),
    (450, "11.0"),
)


def _nvidia_driver(text: str | None) -> tuple[str | None, str | None]:
    """(version, "open" | "proprietary") from /proc/driver/nvidia/version."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d{2,4}\.\d{1,4}(?:\.\d{1,4})?)\b", text or "")
    if not match:
        return None, None
    return match.group(1), "open" if "Open Kernel Module" in (text or "") else "proprietary"


def _nvidia_gpus(tree: _Tree, pcis: list[_Pci], on_tegra: bool) -> list[Accelerator]:
    driver_version, flavour = _nvidia_driver(tree.read("proc/driver/nvidia/version"))
    infos: dict[str, dict[str, str]] = {}
    for name in tree.listdir("proc/driver/nvidia/gpus"):
        info = _colon_fields(tree.read(f"proc/driver/nvidia/gpus/{name}/information"))
        address = (info.get("Bus Location") or name).lower()
        if info and _PCI_ADDRESS.fullmatch(address):  # a directory alone is not enough
            infos.setdefault(address, info)
    by_address = {p.address: p for p in pcis if p.vendor == 0x10DE and p.cls >> 16 == 0x03}
    # On a Jetson the SoC's own GPU/display can show in /proc/driver/nvidia: not a dGPU.
    addresses = sorted(by_address) if on_tegra else sorted(set(by_address) | set(infos))

    found: list[Accelerator] = []
    for address in addresses:
        pci, info = by_address.get(address), infos.get(address, {})
        details: dict[str, DetailValue] = _pci_details(pci) if pci else {"pci_address": address}
        model = _clean(info.get("Model")) or (
            f"NVIDIA GPU (PCI {pci.pci_id})" if pci else f"NVIDIA GPU at {address}"
        )
        loaded = driver_version is not None and (pci is None or pci.driver in (None, "nvidia"))
        if driver_version:
            details["driver_version"] = driver_version
            details["driver_flavour"] = flavour or ""
            major = int(driver_version.split(".")[0])
            cuda = next((cuda for minimum, cuda in _CUDA_FOR_DRIVER if major >= minimum), None)
            if cuda:
                details["cuda_driver_api"] = cuda
        details["driver_loaded"] = loaded
        minor = _int(info.get("Device Minor"))
        gpu_node = [f"dev/nvidia{minor}"] if minor is not None else []
        details["device_nodes"] = _nodes(tree, *gpu_node, "dev/nvidiactl", "dev/nvidia-uvm")
        if not loaded:
            hint = (
                "install the NVIDIA driver (e.g. nvidia-driver-580-open) and reboot, then install "
                "onnxruntime-gpu (CUDA 12) for the CUDA and TensorRT execution providers"
            )
            if pci and pci.driver not in (None, "nvidia"):
                details["note"] = f"the GPU is bound to {pci.driver}, not to the nvidia driver"
        elif driver_version and int(driver_version.split(".")[0]) < 525:
            hint = (
                f"driver {driver_version} predates CUDA 12: upgrade the NVIDIA driver to >= 525, "
                "then install onnxruntime-gpu (CUDA 12)"
            )
        else:
            hint = (
                "install onnxruntime-gpu (CUDA 12 build); the TensorRT execution provider also needs "
                "the TensorRT 10 libraries (pip install tensorrt-cu12)"
            )
        found.append(Accelerator(NVIDIA_GPU, model, details, RUNTIMES[NVIDIA_GPU], hint))
    return found


_TEGRA_SOCS = {
    "tegra264": "Thor",
    "tegra234": "Orin",
    "tegra194": "Xavier",
    "tegra186": "TX2",
    "tegra210": "Nano/TX1",
}

JETPACK_FOR_L4T: Mapping[str, str] = MappingProxyType(
    {
        # Exact Jetson Linux (L4T) releases -> JetPack, from NVIDIA's JetPack archive
        # (developer.nvidia.com/embedded/jetpack-archive). An L4T release missing here has no
        # JetPack version rather than a guessed one.
        "38.2": "7.0",
        "36.4.4": "6.2.1",
        "36.4.3": "6.2",
        "36.4": "6.1",
        "36.3": "6.0",
        "36.2": "6.0 DP",
        "35.6.1": "5.1.5",
        "35.6": "5.1.4",
        "35.5": "5.1.3",
        "35.4.1": "5.1.2",
        "35.3.1": "5.1.1",
        "35.2.1": "5.1",
        "35.1": "5.0.2",
        "34.1.1": "5.0.1 DP",
        "34.1": "5.0 DP",
        "32.7.6": "4.6.6",
        "32.7.5": "4.6.5",
        "32.7.4": "4.6.4",
        "32.7.3": "4.6.3",
        "32.7.2": "4.6.2",
        "32.7.1": "4.6.1",
        "32.6.1": "4.6",
        "32.5.1": "4.5.1",
        "32.5": "4.5",
        "32.4.4": "4.4.1",
        "32.4.3": "4.4",
    }
)


def _l4t_name(major: str, minor: str, patch: str | None) -> str:
    """NVIDIA's spelling: 36.3 (not 36.3.0), 36.4.3."""
    return f"{int(major)}.{int(minor)}" + (f".{int(patch)}" if patch and int(patch) else "")


def jetpack_for_l4t(l4t: str) -> str | None:
    """The JetPack release of a Jetson Linux (L4T) release: "36.3" or "36.3.0" -> "6.0"."""
    match = re.fullmatch(r"(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?", l4t.strip())
    return JETPACK_FOR_L4T.get(_l4t_name(*match.groups())) if match else None


def _dpkg_versions(tree: _Tree, packages: frozenset[str]) -> dict[str, str]:
    """Versions of installed `packages` from /var/lib/dpkg/status."""
    found: dict[str, str] = {}
    package = version = status = None
    for line in itertools.chain(tree.lines("var/lib/dpkg/status", _MAX_DPKG_STATUS), [""]):
        if not line.strip():
            if package in packages and version and status and status.endswith(" installed"):
                found[package] = version
            package = version = status = None
            continue
        key, sep, value = line.partition(":")
        if not sep or line[0].isspace():
            continue
        if key == "Package":
            package = value.strip()
        elif key == "Version":
            version = _clean(value, 100)
        elif key == "Status":
            status = value.strip()
    return found


def _jetson(tree: _Tree, dt_model: str | None, compatible: list[str]) -> Accelerator | None:
    socs = [c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")]
    release = tree.read("etc/nv_tegra_release")
    if not socs and release is None:
        return None
    details: dict[str, DetailValue] = {}
    soc = next((s for s in socs if s in _TEGRA_SOCS), socs[0] if socs else None)
    if soc:
        details["soc"] = soc
        if soc in _TEGRA_SOCS:
            details["soc_family"] = _TEGRA_SOCS[soc]
    if compatible:
        details["device_tree_compatible"] = tuple(compatible)

    dpkg = _dpkg_versions(
        tree, frozenset({"nvidia-l4t-core", "nvidia-jetpack", "tensorrt", "libnvinfer10", "libnvinfer8"})
    )
    l4t = None
    match = re.search(r"#\s*R(\d{1,3})\s*\(release\),\s*REVISION:\s*(\d{1,3})(?:\.(\d{1,3}))?", release or "")
    if match:
        l4t = _l4t_name(*match.groups())
        details["l4t_source"] = "/etc/nv_tegra_release"
    elif "nvidia-l4t-core" in dpkg:
        match = re.match(r"(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?", dpkg["nvidia-l4t-core"])
        if match:
            l4t = _l4t_name(*match.groups())
            details["l4t_source"] = "dpkg nvidia-l4t-core"
    jetpack = None
    jetpack_match = re.match(r"\d{1,2}\.\d{1,2}(?:\.\d{1,2})?", dpkg.get("nvidia-jetpack", ""))
    if jetpack_match:
        jetpack = jetpack_match.group()
        details["jetpack_source"] = "dpkg nvidia-jetpack"
    elif l4t:
        jetpack = jetpack_for_l4t(l4t)
        if jetpack:
            details["jetpack_source"] = "L4T release map"
    if l4t:
        details["l4t_version"] = l4t  # the GPU driver is part of L4T: no separate driver version
    if jetpack:
        details["jetpack_version"] = jetpack
    trt = dpkg.get("tensorrt") or dpkg.get("libnvinfer10") or dpkg.get("libnvinfer8")
    trt_match = re.match(r"\d{1,3}(?:\.\d{1,5}){1,3}", trt or "")
    if trt_match:
        details["tensorrt_version"] = trt_match.group()

    gpu_nodes = _nodes(tree, "dev/nvgpu/igpu0/ctrl", "dev/nvhost-ctrl-gpu", "dev/nvhost-gpu")
    dla = [n for n in tree.listdir("dev") if re.fullmatch(r"nvhost-ctrl-nvdla\d", n)]
    details["dla_cores"] = len(dla)
    details["driver_loaded"] = bool(gpu_nodes)
    details["device_nodes"] = gpu_nodes + _nodes(tree, "dev/nvmap", *(f"dev/{n}" for n in dla))

    family = _TEGRA_SOCS.get(soc or "")
    model = dt_model if dt_model and "jetson" in dt_model.lower() else None
    model = model or (f"NVIDIA Jetson ({family})" if family else dt_model or "NVIDIA Jetson")
    if gpu_nodes:
        wheel = f"JetPack {jetpack}" if jetpack else "this JetPack release"
        hint = (
            f"install the onnxruntime-gpu wheel built for {wheel} (Jetson AI Lab / jetson-zoo, not the "
            "PyPI wheel); CUDA and TensorRT come with JetPack (sudo apt install nvidia-jetpack)"
        )
    else:
        hint = (
            "no Jetson GPU device node (/dev/nvgpu/igpu0/ctrl or /dev/nvhost-ctrl-gpu) is visible: "
            "in a container run it with --runtime nvidia; then use the JetPack onnxruntime-gpu wheel"
        )
    return Accelerator(NVIDIA_JETSON, model, details, RUNTIMES[NVIDIA_JETSON], hint)


# --------------------------------------------------------------------------- Intel

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


def _intel_npus(tree: _Tree, pcis: list[_Pci]) -> list[Accelerator]:
    npus = [p for p in pcis if p.vendor == 0x8086 and (p.device in _INTEL_NPUS or p.cls >> 8 == 0x1200)]
    found: list[Accelerator] = []
    for pci in npus:
        details = _pci_details(pci)
        nodes = _class_nodes(tree, pci, "accel", "accel", "dev/accel")
        if not nodes and len(npus) == 1:
            nodes = tuple(_dev_glob(tree, "dev/accel", "accel"))
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


def _intel_gpus(tree: _Tree, pcis: list[_Pci]) -> list[Accelerator]:
    gpus = [p for p in pcis if p.vendor == 0x8086 and p.cls >> 16 == 0x03]
    found: list[Accelerator] = []
    for pci in gpus:
        details = _pci_details(pci)
        nodes = _class_nodes(tree, pci, "drm", "renderD", "dev/dri")
        if not nodes and len(gpus) == 1:
            nodes = tuple(_dev_glob(tree, "dev/dri", "renderD"))
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


# --------------------------------------------------------------------------- USB sticks

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


def _usb_accelerators(tree: _Tree, usbs: list[_Usb]) -> list[Accelerator]:
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
            nodes = _nodes(tree, f"dev/bus/usb/{usb.busnum:03d}/{usb.devnum:03d}")
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


# --------------------------------------------------------------------------- Coral PCIe, Hailo


def _pci_with_nodes(
    tree: _Tree,
    pcis: list[_Pci],
    pci_ids: set[tuple[int, int]],
    class_dir: str,
    node_prefix: str,
) -> list[tuple[_Pci, tuple[str, ...]]]:
    """PCI devices with those ids and their /dev/<prefix>N nodes (by sysfs class dir, else in order)."""
    matches = [p for p in pcis if (p.vendor, p.device) in pci_ids]
    spare = _dev_glob(tree, "dev", node_prefix)
    result: list[tuple[_Pci, tuple[str, ...]]] = []
    for index, pci in enumerate(matches):
        nodes = _class_nodes(tree, pci, class_dir, node_prefix, "dev")
        if not nodes and len(spare) == len(matches):
            nodes = (spare[index],)
        result.append((pci, nodes))
    return result


def _coral_pcie(tree: _Tree, pcis: list[_Pci]) -> list[Accelerator]:
    found: list[Accelerator] = []
    for pci, nodes in _pci_with_nodes(tree, pcis, {(0x1AC1, 0x089A)}, "apex", "apex_"):
        details = _pci_details(pci)
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


def _hailo(tree: _Tree, pcis: list[_Pci]) -> list[Accelerator]:
    found: list[Accelerator] = []
    for pci, nodes in _pci_with_nodes(tree, pcis, {(0x1E60, 0x2864)}, "hailo_chardev", "hailo"):
        details = _pci_details(pci)
        details["device_nodes"] = nodes
        details["driver_loaded"] = bool(nodes)
        details["note"] = "Hailo-8 and Hailo-8L share PCI id 1e60:2864 (hailortcli fw-control identify tells)"
        hint = (
            "install HailoRT and its PCIe driver of the same version (Raspberry Pi OS: sudo apt install "
            "hailo-all; elsewhere hailort and hailort-pcie-driver from the Hailo Developer Zone)"
        )
        found.append(Accelerator(HAILO, "Hailo-8/Hailo-8L AI accelerator", details, RUNTIMES[HAILO], hint))
    return found


# --------------------------------------------------------------------------- Rockchip

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


def _rockchip(tree: _Tree, compatible: list[str]) -> Accelerator | None:
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
            uevent = _uevent(tree.read(f"sys/class/{class_dir}/{node}/device/uevent"))
            driver = uevent.get("DRIVER", "").lower()
            if driver in ("rknpu", "rocket") or "rknpu" in uevent.get("OF_COMPATIBLE_0", ""):
                drivers[driver or "rknpu"] = node
                nodes.extend(_nodes(tree, f"{dev_dir}/{node}"))
    nodes.extend(_dev_glob(tree, "dev", "rknpu") + list(_nodes(tree, "dev/rknpu")))
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


# --------------------------------------------------------------------------- entry point

_T = TypeVar("_T")


def _guarded(what: str, default: _T, detect: Callable[[], _T]) -> _T:
    """Run one detector; a bug in it must cost only its own findings, never the daemon's start."""
    try:
        return detect()
    except Exception:
        log.exception("hardware detection of %s failed; reporting none", what)
        return default


def _device_tree(tree: _Tree) -> tuple[str | None, list[str]]:
    for base in ("proc/device-tree", "sys/firmware/devicetree/base"):
        model = next(iter(_dt_strings(tree.read(f"{base}/model"))), None)
        compatible = _dt_strings(tree.read(f"{base}/compatible"))
        if model or compatible:
            return model, compatible
    return None, []


def detect_hardware(root: Path | None = None) -> HardwareInfo:
    """Detect the CPU and accelerators of the box whose files lie under `root` (see `sysroot`).

    Never raises because of the files it reads: missing, unreadable or garbled files are skipped.
    """
    tree = _Tree(sysroot(root))
    empty_cpu = CpuInfo("unknown", "unknown", "", None, (), None)
    cpu = _guarded("the CPU", empty_cpu, lambda: _detect_cpu(tree))
    no_device_tree: tuple[str | None, list[str]] = (None, [])
    dt_model, compatible = _guarded("the device tree", no_device_tree, lambda: _device_tree(tree))
    pcis: list[_Pci] = _guarded("PCI devices", [], lambda: _pci_devices(tree))
    usbs: list[_Usb] = _guarded("USB devices", [], lambda: _usb_devices(tree))
    on_tegra = any(c.startswith("nvidia,tegra") for c in compatible)

    accelerators: list[Accelerator] = []
    jetson = _guarded(NVIDIA_JETSON, None, lambda: _jetson(tree, dt_model, compatible))
    rockchip = _guarded(ROCKCHIP_NPU, None, lambda: _rockchip(tree, compatible))
    accelerators += [a for a in (jetson, rockchip) if a is not None]
    accelerators += _guarded(NVIDIA_GPU, [], lambda: _nvidia_gpus(tree, pcis, on_tegra or jetson is not None))
    accelerators += _guarded(INTEL_NPU, [], lambda: _intel_npus(tree, pcis))
    accelerators += _guarded(INTEL_GPU, [], lambda: _intel_gpus(tree, pcis))
    accelerators += _guarded("USB accelerators", [], lambda: _usb_accelerators(tree, usbs))
    accelerators += _guarded(CORAL_PCIE, [], lambda: _coral_pcie(tree, pcis))
    accelerators += _guarded(HAILO, [], lambda: _hailo(tree, pcis))

    def order(accelerator: Accelerator) -> tuple[int, str]:
        where = accelerator.details.get("pci_address") or accelerator.details.get("usb_path") or ""
        return KINDS.index(accelerator.kind), str(where)

    info = HardwareInfo(
        cpu=cpu,
        accelerators=tuple(sorted(accelerators, key=order)),
        os_release=_guarded("os-release", None, lambda: _os_release(tree)),
        kernel=_guarded("the kernel", None, lambda: _kernel(tree)),
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
