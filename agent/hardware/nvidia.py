"""NVIDIA: discrete GPUs (PCI, /proc/driver/nvidia) and Jetson modules (device tree, L4T, JetPack,
TensorRT from dpkg)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from types import MappingProxyType

from agent.hardware.buses import PCI_ADDRESS, Pci, dev_nodes, pci_details
from agent.hardware.files import Tree, clean_text, colon_fields, parse_int
from agent.hardware.records import NVIDIA_GPU, NVIDIA_JETSON, RUNTIMES, Accelerator, DetailValue

_MAX_DPKG_STATUS = 64 << 20


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


def nvidia_gpus(tree: Tree, pcis: list[Pci], on_tegra: bool) -> list[Accelerator]:
    driver_version, flavour = _nvidia_driver(tree.read("proc/driver/nvidia/version"))
    infos: dict[str, dict[str, str]] = {}
    for name in tree.listdir("proc/driver/nvidia/gpus"):
        info = colon_fields(tree.read(f"proc/driver/nvidia/gpus/{name}/information"))
        address = (info.get("Bus Location") or name).lower()
        if info and PCI_ADDRESS.fullmatch(address):  # a directory alone is not enough
            infos.setdefault(address, info)
    by_address = {p.address: p for p in pcis if p.vendor == 0x10DE and p.cls >> 16 == 0x03}
    # On a Jetson the SoC's own GPU/display can show in /proc/driver/nvidia: not a dGPU.
    addresses = sorted(by_address) if on_tegra else sorted(set(by_address) | set(infos))

    found: list[Accelerator] = []
    for address in addresses:
        pci, info = by_address.get(address), infos.get(address, {})
        details: dict[str, DetailValue] = pci_details(pci) if pci else {"pci_address": address}
        model = clean_text(info.get("Model")) or (
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
        minor = parse_int(info.get("Device Minor"))
        gpu_node = [f"dev/nvidia{minor}"] if minor is not None else []
        details["device_nodes"] = dev_nodes(tree, *gpu_node, "dev/nvidiactl", "dev/nvidia-uvm")
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


def _dpkg_versions(tree: Tree, packages: frozenset[str]) -> dict[str, str]:
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
            version = clean_text(value, 100)
        elif key == "Status":
            status = value.strip()
    return found


def detect_jetson(tree: Tree, dt_model: str | None, compatible: list[str]) -> Accelerator | None:
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

    gpu_nodes = dev_nodes(tree, "dev/nvgpu/igpu0/ctrl", "dev/nvhost-ctrl-gpu", "dev/nvhost-gpu")
    dla = [n for n in tree.listdir("dev") if re.fullmatch(r"nvhost-ctrl-nvdla\d", n)]
    details["dla_cores"] = len(dla)
    details["driver_loaded"] = bool(gpu_nodes)
    details["device_nodes"] = gpu_nodes + dev_nodes(tree, "dev/nvmap", *(f"dev/{n}" for n in dla))

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
