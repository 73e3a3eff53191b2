"""Hardware detection against fixture trees of real-looking boxes, this machine's own /, and bad files.

Every tree under tests/fixtures/sysroots/ is read by the real detection code; nothing is mocked
except, in one test, a permission error that root (which runs these tests) cannot otherwise meet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from agent import hardware
from agent.hardware import (
    CORAL_PCIE,
    CORAL_USB,
    HAILO,
    INTEL_GPU,
    INTEL_NCS2,
    INTEL_NPU,
    NVIDIA_GPU,
    NVIDIA_JETSON,
    ROCKCHIP_NPU,
    SYSROOT_ENV,
    Accelerator,
    HardwareInfo,
    detect_hardware,
    jetpack_for_l4t,
)

SYSROOTS = Path(__file__).parent / "fixtures" / "sysroots"
H100 = SYSROOTS / "x86_64-nvidia-h100"
ORIN = SYSROOTS / "jetson-agx-orin"

ARM_FLAGS = ("asimd", "asimddp", "asimdhp", "fphp", "neon")
AVX2_FLAGS = ("avx", "avx2", "f16c", "fma", "sse4_2")


@dataclasses.dataclass(frozen=True)
class Expected:
    arch: str
    cpu_model: str
    vendor: str
    cores: int
    memory_kb: int
    flags: tuple[str, ...]
    accelerators: tuple[tuple[str, str], ...]  # (kind, model), in the order detection lists them
    os_release: str
    kernel: str


EXPECTED: dict[str, Expected] = {
    "x86_64-nvidia-h100": Expected(
        "x86_64",
        "Intel(R) Xeon(R) Processor",
        "GenuineIntel",
        16,
        131981020,
        (
            "amx",
            "amx_bf16",
            "amx_int8",
            "amx_tile",
            "avx",
            "avx2",
            "avx512_bf16",
            "avx512_fp16",
            "avx512_vnni",
            "avx512bw",
            "avx512f",
            "avx512vl",
            "avx_vnni",
            "f16c",
            "fma",
            "sse4_2",
        ),
        ((NVIDIA_GPU, "NVIDIA H100 80GB HBM3"),),
        "Ubuntu 24.04.3 LTS",
        "6.18.44-fc-v657-gpu",
    ),
    "jetson-agx-orin": Expected(
        "aarch64",
        "ARM Cortex-A78AE",
        "ARM",
        12,
        64335836,
        ARM_FLAGS,
        ((NVIDIA_JETSON, "NVIDIA Jetson AGX Orin Developer Kit"),),
        "Ubuntu 22.04.4 LTS",
        "5.15.136-tegra",
    ),
    "x86_64-ncs2": Expected(
        "x86_64",
        "Intel(R) Core(TM) i5-8259U CPU @ 2.30GHz",
        "GenuineIntel",
        8,
        16211940,
        AVX2_FLAGS,
        (
            (INTEL_NCS2, "Intel Neural Compute Stick 2 (Movidius Myriad X)"),
            (INTEL_GPU, "Intel Iris Plus Graphics 655 (Coffee Lake)"),
        ),
        "Ubuntu 20.04.6 LTS",
        "5.15.0-91-generic",
    ),
    "x86_64-intel-npu": Expected(
        "x86_64",
        "Intel(R) Core(TM) Ultra 7 155H",
        "GenuineIntel",
        22,
        32189304,
        ("avx", "avx2", "avx_vnni", "f16c", "fma", "sse4_2"),
        (
            (INTEL_NPU, "Intel AI Boost NPU (Meteor Lake)"),
            (INTEL_GPU, "Intel Arc Graphics (Meteor Lake)"),
        ),
        "Ubuntu 24.04.1 LTS",
        "6.8.0-45-generic",
    ),
    "x86_64-coral-usb": Expected(
        "x86_64",
        "AMD Ryzen 5 5600G with Radeon Graphics",
        "AuthenticAMD",
        12,
        32797468,
        AVX2_FLAGS,
        ((CORAL_USB, "Google Coral USB Accelerator (Edge TPU)"),),
        "Debian GNU/Linux 12 (bookworm)",
        "6.1.0-18-amd64",
    ),
    "x86_64-coral-pcie": Expected(
        "x86_64",
        "Intel(R) N100",
        "GenuineIntel",
        4,
        16123708,
        ("avx", "avx2", "avx_vnni", "f16c", "fma", "sse4_2"),
        (
            (CORAL_PCIE, "Google Coral Edge TPU (PCIe/M.2)"),
            (INTEL_GPU, "Intel UHD Graphics (Alder Lake-N)"),
        ),
        "Ubuntu 22.04.5 LTS",
        "6.8.0-49-generic",
    ),
    "rpi5-hailo": Expected(
        "aarch64",
        "ARM Cortex-A76",
        "ARM",
        4,
        8245800,
        ARM_FLAGS,
        ((HAILO, "Hailo-8/Hailo-8L AI accelerator"),),
        "Debian GNU/Linux 12 (bookworm)",
        "6.6.51+rpt-rpi-2712",
    ),
    "rock5b-rk3588": Expected(
        "aarch64",
        "ARM Cortex-A55 x4 + Cortex-A76 x4",
        "ARM",
        8,
        16131164,
        ARM_FLAGS,
        ((ROCKCHIP_NPU, "Rockchip RK3588 NPU"),),
        "Debian GNU/Linux 12 (bookworm)",
        "6.1.43-15-rk2312",
    ),
    "x86_64-cpu-only": Expected(
        "x86_64",
        "AMD EPYC 7763 64-Core Processor",
        "AuthenticAMD",
        8,
        32873468,
        AVX2_FLAGS,
        (),
        "Debian GNU/Linux 12 (bookworm)",
        "6.1.0-26-cloud-amd64",
    ),
}


def only(info: HardwareInfo, kind: str) -> Accelerator:
    found = info.by_kind(kind)
    assert len(found) == 1, f"expected one {kind}, found {[a.model for a in found]}"
    return found[0]


def copy_tree(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(SYSROOTS / name, target, symlinks=True)
    return target


def write(root: Path, rel: str, text: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def regular_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "README.md")


# --------------------------------------------------------------------------- every fixture tree


def test_every_fixture_tree_has_expectations() -> None:
    trees = {p.name for p in SYSROOTS.iterdir() if p.is_dir()}
    assert trees == set(EXPECTED)
    for name in trees:
        assert (SYSROOTS / name / "README.md").is_file(), f"{name} has no README.md"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_tree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = EXPECTED[name]
    monkeypatch.delenv(SYSROOT_ENV, raising=False)
    info = detect_hardware(root=SYSROOTS / name)

    assert info.root == SYSROOTS / name
    assert info.cpu.arch == expected.arch
    assert info.cpu.model == expected.cpu_model
    assert info.cpu.vendor == expected.vendor
    assert info.cpu.logical_cores == expected.cores
    assert info.cpu.memory_total_bytes == expected.memory_kb * 1024
    assert info.cpu.flags == expected.flags
    assert [(a.kind, a.model) for a in info.accelerators] == list(expected.accelerators)
    assert info.os_release == expected.os_release
    assert info.kernel == expected.kernel
    for accelerator in info.accelerators:
        assert accelerator.runtimes == hardware.RUNTIMES[accelerator.kind]
        assert accelerator.install_hint
        assert accelerator.details["driver_loaded"] is True
        assert accelerator.device_nodes, f"{accelerator.kind} lists no device node"
        for node in accelerator.device_nodes:
            assert (SYSROOTS / name / node.lstrip("/")).is_file()

    # The same tree through the environment variable, read at call time.
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / name))
    assert detect_hardware() == info
    assert detect_hardware().to_dict() == info.to_dict()


def test_h100_real_capture() -> None:
    info = detect_hardware(root=H100)
    gpu = only(info, NVIDIA_GPU)
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.driver_version == "580.159.04"
    assert dict(gpu.details) == {
        "pci_address": "0000:00:06.0",
        "pci_id": "10de:2330",
        "pci_subsystem_id": "10de:16c1",
        "driver_version": "580.159.04",
        "driver_flavour": "open",
        "cuda_driver_api": "13.0",
        "driver_loaded": True,
        "device_nodes": ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"),
    }
    assert gpu.runtimes == ("onnxruntime/TensorrtExecutionProvider", "onnxruntime/CUDAExecutionProvider")
    assert "onnxruntime-gpu" in gpu.install_hint
    assert info.cpu.has("avx512f") and info.cpu.has("amx") and not info.cpu.has("neon")


def test_jetson_agx_orin() -> None:
    info = detect_hardware(root=ORIN)
    jetson = only(info, NVIDIA_JETSON)
    assert jetson.details["l4t_version"] == "36.3"
    assert jetson.details["jetpack_version"] == "6.0"
    assert jetson.details["jetpack_source"] == "dpkg nvidia-jetpack"
    assert jetson.details["l4t_source"] == "/etc/nv_tegra_release"
    assert jetson.details["soc"] == "tegra234"
    assert jetson.details["soc_family"] == "Orin"
    assert jetson.details["tensorrt_version"] == "8.6.2.3"
    assert jetson.details["dla_cores"] == 2
    assert jetson.details["device_tree_compatible"] == (
        "nvidia,p3737-0000+p3701-0005",
        "nvidia,p3701-0005",
        "nvidia,tegra234",
    )
    assert "/dev/nvgpu/igpu0/ctrl" in jetson.device_nodes and "/dev/nvmap" in jetson.device_nodes
    assert jetson.runtimes == ("onnxruntime/TensorrtExecutionProvider", "onnxruntime/CUDAExecutionProvider")
    assert "JetPack 6.0" in jetson.install_hint
    assert info.by_kind(NVIDIA_GPU) == ()
    assert info.cpu.has("neon") and info.cpu.has("asimddp") and not info.cpu.has("sve")


def test_ncs2() -> None:
    info = detect_hardware(root=SYSROOTS / "x86_64-ncs2")
    stick = only(info, INTEL_NCS2)
    assert stick.details["usb_id"] == "03e7:2485"
    assert stick.details["usb_path"] == "2-1"
    assert stick.details["usb_speed_mbps"] == 5000
    assert stick.details["usb_product"] == "Movidius MyriadX"
    assert stick.details["firmware_state"] == "not booted"
    assert stick.device_nodes == ("/dev/bus/usb/002/003",)
    assert "usb_note" not in stick.details
    assert stick.runtimes == ("openvino/MYRIAD",)
    assert "2022.3" in stick.install_hint and "2022.3" in str(stick.details["note"])
    assert only(info, INTEL_GPU).device_nodes == ("/dev/dri/renderD128",)


def test_intel_npu() -> None:
    info = detect_hardware(root=SYSROOTS / "x86_64-intel-npu")
    npu = only(info, INTEL_NPU)
    assert npu.details["pci_address"] == "0000:00:0b.0"
    assert npu.details["pci_id"] == "8086:7d1d"
    assert npu.details["kernel_driver"] == "intel_vpu"
    assert npu.details["npu_generation"] == "37xx"
    assert npu.device_nodes == ("/dev/accel/accel0",)
    assert npu.runtimes == ("openvino/NPU",)
    assert "openvino>=2024" in npu.install_hint
    gpu = only(info, INTEL_GPU)
    assert gpu.details["pci_id"] == "8086:7d55"
    assert gpu.device_nodes == ("/dev/dri/renderD128",)
    assert gpu.runtimes == ("openvino/GPU",)
    assert info.cpu.has("avx_vnni") and not info.cpu.has("avx512f")


def test_coral_usb_unprogrammed() -> None:
    coral = only(detect_hardware(root=SYSROOTS / "x86_64-coral-usb"), CORAL_USB)
    assert coral.details["usb_id"] == "1a6e:089a"
    assert coral.details["firmware_state"] == "unprogrammed"
    assert coral.device_nodes == ("/dev/bus/usb/001/003",)
    assert coral.runtimes == ("tflite/edgetpu",)
    assert "libedgetpu1-std" in coral.install_hint


def test_coral_pcie() -> None:
    coral = only(detect_hardware(root=SYSROOTS / "x86_64-coral-pcie"), CORAL_PCIE)
    assert coral.details["pci_id"] == "1ac1:089a"
    assert coral.details["pci_address"] == "0000:01:00.0"
    assert coral.details["kernel_driver"] == "apex"
    assert coral.device_nodes == ("/dev/apex_0",)
    assert coral.runtimes == ("tflite/edgetpu",)


def test_hailo_on_raspberry_pi_5() -> None:
    info = detect_hardware(root=SYSROOTS / "rpi5-hailo")
    hailo = only(info, HAILO)
    assert hailo.details["pci_address"] == "0001:01:00.0"
    assert hailo.details["pci_id"] == "1e60:2864"
    assert hailo.device_nodes == ("/dev/hailo0",)
    assert hailo.runtimes == ("hailort",)
    assert "hailo-all" in hailo.install_hint


def test_rockchip_rk3588() -> None:
    npu = only(detect_hardware(root=SYSROOTS / "rock5b-rk3588"), ROCKCHIP_NPU)
    assert npu.driver_version == "0.9.6"
    assert npu.details["soc"] == "rk3588"
    assert npu.details["npu_cores"] == 3
    assert npu.details["devfreq"] == "fdab0000.npu"
    assert npu.details["kernel_driver"] == "rknpu"
    assert npu.device_nodes == ("/dev/dri/renderD129",)  # renderD128 is the Mali GPU
    assert npu.runtimes == ("rknn",)
    assert "rknn-toolkit-lite2" in npu.install_hint


def test_cpu_only_box_has_no_accelerators() -> None:
    info = detect_hardware(root=SYSROOTS / "x86_64-cpu-only")
    assert info.accelerators == ()
    assert info.kinds == ()  # the QEMU VGA (class 0x030000, vendor 1234) is no GPU accelerator


# --------------------------------------------------------------------------- the root


def test_env_var_is_read_at_call_time_and_root_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SYSROOT_ENV, str(ORIN))
    assert detect_hardware().kinds == (NVIDIA_JETSON,)
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / "x86_64-coral-usb"))
    assert detect_hardware().kinds == (CORAL_USB,)
    assert detect_hardware(root=H100).kinds == (NVIDIA_GPU,)
    monkeypatch.setenv(SYSROOT_ENV, "")
    assert detect_hardware().root == Path("/")
    monkeypatch.delenv(SYSROOT_ENV)
    assert hardware.sysroot() == Path("/")


def test_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SYSROOT_ENV, raising=False)
    info = detect_hardware()
    assert info.root == Path("/")
    machine = os.uname().machine
    assert info.cpu.arch == {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)
    assert info.cpu.model not in ("", "unknown")
    assert info.cpu.logical_cores == os.cpu_count()
    assert info.cpu.memory_total_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if info.cpu.arch == "x86_64":
        cpuinfo = Path("/proc/cpuinfo").read_text()
        assert ("avx2" in cpuinfo.split()) == info.cpu.has("avx2")
    assert info.kernel == os.uname().release
    assert re.fullmatch(r"[0-9a-f]{16}", info.fingerprint())
    assert info.fingerprint() == detect_hardware().fingerprint()
    json.dumps(info.to_dict())


def test_missing_root_detects_nothing(tmp_path: Path) -> None:
    info = detect_hardware(root=tmp_path / "no-such-dir")
    assert info.cpu == hardware.CpuInfo("unknown", "unknown", "", None, (), None)
    assert info.accelerators == () and info.os_release is None and info.kernel is None


# --------------------------------------------------------------------------- fingerprint, records


def test_fingerprint_is_stable_and_tells_boxes_apart() -> None:
    prints = {}
    for name in EXPECTED:
        first = detect_hardware(root=SYSROOTS / name).fingerprint()
        assert first == detect_hardware(root=SYSROOTS / name).fingerprint()
        assert re.fullmatch(r"[0-9a-f]{16}", first)
        prints[name] = first
    assert len(set(prints.values())) == len(prints), prints


def test_fingerprint_ignores_location_memory_and_serials_but_not_driver(tmp_path: Path) -> None:
    original = detect_hardware(root=H100).fingerprint()
    copy = copy_tree("x86_64-nvidia-h100", tmp_path)
    assert detect_hardware(root=copy).fingerprint() == original

    meminfo = (copy / "proc/meminfo").read_text()
    write(copy, "proc/meminfo", meminfo.replace("131981020", "65990510").replace("130672584", "1234"))
    info_path = copy / "proc/driver/nvidia/gpus/0000:00:06.0/information"
    write(copy, str(info_path.relative_to(copy)), info_path.read_text().replace("e70815f9", "00000000"))
    assert detect_hardware(root=copy).cpu.memory_total_bytes == 65990510 * 1024
    assert detect_hardware(root=copy).fingerprint() == original

    version = (copy / "proc/driver/nvidia/version").read_text()
    write(copy, "proc/driver/nvidia/version", version.replace("580.159.04", "575.57.08"))
    changed = detect_hardware(root=copy)
    assert only(changed, NVIDIA_GPU).driver_version == "575.57.08"
    assert changed.fingerprint() != original


def test_records_are_frozen_and_serializable() -> None:
    info = detect_hardware(root=ORIN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.cpu = info.cpu  # type: ignore[misc]
    jetson = only(info, NVIDIA_JETSON)
    with pytest.raises(TypeError):
        jetson.details["l4t_version"] = "1.0"  # type: ignore[index]
    assert hash(jetson) == hash(only(detect_hardware(root=ORIN), NVIDIA_JETSON))
    data = json.loads(json.dumps(info.to_dict()))
    assert data["fingerprint"] == info.fingerprint()
    assert data["cpu"]["arch"] == "aarch64"
    assert data["accelerators"][0]["details"]["jetpack_version"] == "6.0"
    assert data["accelerators"][0]["details"]["device_tree_compatible"][-1] == "nvidia,tegra234"
    assert data["accelerators"][0]["runtimes"] == list(jetson.runtimes)


# --------------------------------------------------------------------------- variants of real boxes


@pytest.mark.parametrize(
    ("release", "keep_jetpack_package", "l4t", "jetpack", "source"),
    [
        (
            "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic",
            False,
            "36.3",
            "6.0",
            "L4T release map",
        ),
        (
            "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic",
            False,
            "36.4.3",
            "6.2",
            "L4T release map",
        ),
        (
            "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref",
            False,
            "35.4.1",
            "5.1.2",
            "L4T release map",
        ),
        (
            "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref",
            False,
            "32.7.1",
            "4.6.1",
            "L4T release map",
        ),
        ("# R36 (release), REVISION: 9.0, GCID: 1, BOARD: generic", False, "36.9", None, None),
        (
            "# R36 (release), REVISION: 9.0, GCID: 1, BOARD: generic",
            True,
            "36.9",
            "6.0",
            "dpkg nvidia-jetpack",
        ),
    ],
)
def test_jetson_l4t_and_jetpack_versions(
    tmp_path: Path,
    release: str,
    keep_jetpack_package: bool,
    l4t: str,
    jetpack: str | None,
    source: str | None,
) -> None:
    root = copy_tree("jetson-agx-orin", tmp_path)
    write(root, "etc/nv_tegra_release", release + "\n# KERNEL_VARIANT: oot\n")
    if not keep_jetpack_package:
        status = (root / "var/lib/dpkg/status").read_text()
        write(
            root,
            "var/lib/dpkg/status",
            status.replace("Package: nvidia-jetpack", "Package: nvidia-jetpack-x"),
        )
    jetson = only(detect_hardware(root=root), NVIDIA_JETSON)
    assert jetson.details["l4t_version"] == l4t
    assert jetson.details.get("jetpack_version") == jetpack
    assert jetson.details.get("jetpack_source") == source


def test_jetson_l4t_from_dpkg_and_missing_gpu_nodes(tmp_path: Path) -> None:
    root = copy_tree("jetson-agx-orin", tmp_path)
    (root / "etc/nv_tegra_release").unlink()
    shutil.rmtree(root / "dev")
    jetson = only(detect_hardware(root=root), NVIDIA_JETSON)
    assert jetson.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert jetson.details["l4t_version"] == "36.3"
    assert jetson.details["l4t_source"] == "dpkg nvidia-l4t-core"
    assert jetson.details["driver_loaded"] is False
    assert jetson.details["dla_cores"] == 0
    assert jetson.device_nodes == ()
    assert "--runtime nvidia" in jetson.install_hint


def test_jetson_ignores_its_own_gpu_in_proc_driver_nvidia(tmp_path: Path) -> None:
    root = copy_tree("jetson-agx-orin", tmp_path)
    write(
        root,
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.3.0\n",
    )
    write(
        root,
        "proc/driver/nvidia/gpus/0000:00:00.0/information",
        "Model: \t\t Orin\nBus Location: \t 0000:00:00.0\n",
    )
    assert detect_hardware(root=root).kinds == (NVIDIA_JETSON,)


@pytest.mark.parametrize(
    ("l4t", "jetpack"),
    [("36.4.3", "6.2"), ("36.4.0", "6.1"), ("36.4", "6.1"), ("36.3.0", "6.0"), ("32.7.1", "4.6.1")],
)
def test_jetpack_for_l4t(l4t: str, jetpack: str) -> None:
    assert jetpack_for_l4t(l4t) == jetpack


@pytest.mark.parametrize("l4t", ["99.1", "36.4.9", "", "R36", "36.x"])
def test_jetpack_for_unknown_l4t_is_none(l4t: str) -> None:
    assert jetpack_for_l4t(l4t) is None


def test_usb_sticks_keep_their_fingerprint_once_their_firmware_is_loaded(tmp_path: Path) -> None:
    coral = copy_tree("x86_64-coral-usb", tmp_path)
    before = detect_hardware(root=coral).fingerprint()
    write(coral, "sys/bus/usb/devices/1-4/idVendor", "18d1\n")
    write(coral, "sys/bus/usb/devices/1-4/idProduct", "9302\n")
    programmed = only(detect_hardware(root=coral), CORAL_USB)
    assert programmed.details["firmware_state"] == "programmed"
    assert detect_hardware(root=coral).fingerprint() == before

    ncs2 = copy_tree("x86_64-ncs2", tmp_path)
    before = detect_hardware(root=ncs2).fingerprint()
    write(ncs2, "sys/bus/usb/devices/2-1/idProduct", "f63b\n")
    write(ncs2, "sys/bus/usb/devices/2-1/speed", "480\n")
    booted = only(detect_hardware(root=ncs2), INTEL_NCS2)
    assert booted.details["firmware_state"] == "booted"
    assert "USB 2" in str(booted.details["usb_note"])
    assert detect_hardware(root=ncs2).fingerprint() == before


def test_nvidia_gpu_without_driver(tmp_path: Path) -> None:
    root = copy_tree("x86_64-nvidia-h100", tmp_path)
    shutil.rmtree(root / "proc/driver")
    gpu = only(detect_hardware(root=root), NVIDIA_GPU)
    assert gpu.model == "NVIDIA GPU (PCI 10de:2330)"
    assert gpu.driver_version is None
    assert gpu.details["driver_loaded"] is False
    assert "install the NVIDIA driver" in gpu.install_hint
    assert detect_hardware(root=root).fingerprint() != detect_hardware(root=H100).fingerprint()


def test_intel_npu_without_accel_node(tmp_path: Path) -> None:
    root = copy_tree("x86_64-intel-npu", tmp_path)
    shutil.rmtree(root / "dev/accel")
    npu = only(detect_hardware(root=root), INTEL_NPU)
    assert npu.details["driver_loaded"] is False
    assert npu.device_nodes == ()
    assert "no /dev/accel node" in npu.install_hint


def test_rockchip_without_its_driver_and_with_mainline_rocket(tmp_path: Path) -> None:
    root = copy_tree("rock5b-rk3588", tmp_path)
    shutil.rmtree(root / "sys")
    npu = only(detect_hardware(root=root), ROCKCHIP_NPU)
    assert npu.details["driver_loaded"] is False
    assert npu.driver_version is None and npu.device_nodes == ()
    assert "not loaded" in npu.install_hint

    # Mainline Linux (6.18+) drives the RK3588 NPU with the accel/rocket driver: /dev/accel/accel0,
    # which on this SoC is no Intel NPU.
    write(root, "sys/class/accel/accel0/device/uevent", "DRIVER=rocket\nOF_NAME=npu\n")
    write(root, "dev/accel/accel0", "")
    info = detect_hardware(root=root)
    assert info.kinds == (ROCKCHIP_NPU,)
    npu = only(info, ROCKCHIP_NPU)
    assert npu.details["kernel_driver"] == "rocket"
    assert npu.device_nodes == ("/dev/accel/accel0",)
    assert "Teflon" in str(npu.details["note"])


def test_links_stay_inside_the_root(tmp_path: Path) -> None:
    root = copy_tree("jetson-agx-orin", tmp_path)
    # As on a real box: /proc/device-tree -> /sys/firmware/devicetree/base (an absolute link).
    shutil.move(root / "proc/device-tree", tmp_path / "dt")
    (root / "sys/firmware/devicetree").mkdir(parents=True)
    shutil.move(tmp_path / "dt", root / "sys/firmware/devicetree/base")
    os.symlink("/sys/firmware/devicetree/base", root / "proc/device-tree")
    # sysfs's own layout: /sys/bus/pci/devices/X -> ../../../devices/pci0000:00/X (relative).
    pci = root / "sys/devices/pci0000:00/0000:00:02.0"
    for attribute, value in (("vendor", "0x8086"), ("device", "0x46d1"), ("class", "0x030000")):
        write(pci, attribute, value + "\n")
    write(pci, "drm/renderD128/dev", "226:128\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:02.0", root / "sys/bus/pci/devices/0000:00:02.0")
    # A link that climbs out of the root, and one through an absolute path inside it.
    write(tmp_path, "outside/os-release", 'PRETTY_NAME="escaped the root"\n')
    (root / "etc/os-release").unlink()
    os.symlink("../../outside/os-release", root / "etc/os-release")  # outside/ is beside the root
    write(root, "usr/lib/os-release", 'PRETTY_NAME="inside the root"\n')

    info = detect_hardware(root=root)
    assert only(info, NVIDIA_JETSON).model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert only(info, NVIDIA_JETSON).details["soc"] == "tegra234"
    assert only(info, INTEL_GPU).details["pci_id"] == "8086:46d1"
    # etc/os-release resolves to <root>/outside/os-release, which is absent: the fallback file is read.
    assert info.os_release == "inside the root"


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_garbage_in_every_file_does_not_raise(name: str, tmp_path: Path) -> None:
    rng = random.Random(name)
    for seed in range(3):
        root = tmp_path / f"{name}-{seed}"
        shutil.copytree(SYSROOTS / name, root, symlinks=True)
        for path in regular_files(root):
            kind = rng.randrange(4)
            if kind == 0:
                path.write_bytes(rng.randbytes(rng.randrange(1, 3000)))
            elif kind == 1:
                data = path.read_bytes()
                path.write_bytes(data[: rng.randrange(len(data) + 1)])
            elif kind == 2:
                path.write_text(": : :\n\x00\x00 0x 0xZZ -1 999999999999999999999999\nprocessor\t: zz\n\n")
            else:
                path.write_bytes(b"\xff\xfe" * rng.randrange(1, 50))
        info = detect_hardware(root=root)
        assert isinstance(info.cpu.model, str) and isinstance(info.cpu.arch, str)
        assert all(a.kind in hardware.KINDS for a in info.accelerators)
        assert re.fullmatch(r"[0-9a-f]{16}", info.fingerprint())
        json.dumps(info.to_dict())


@pytest.mark.parametrize("how", ["directory", "broken-link", "link-loop"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_unreadable_files_do_not_raise(name: str, how: str, tmp_path: Path) -> None:
    root = copy_tree(name, tmp_path)
    files = regular_files(root)
    for path in files:
        path.unlink()
        if how == "directory":
            path.mkdir()
        elif how == "broken-link":
            os.symlink(f"/nonexistent/{path.name}", path)
        else:
            os.symlink(path.name, path)
    info = detect_hardware(root=root)
    assert info.cpu == hardware.CpuInfo("unknown", "unknown", "", None, (), None)
    assert info.os_release is None and info.kernel is None
    # With every file unreadable, only sysfs class directories are left: nothing is identified.
    assert info.accelerators == ()


def test_one_unreadable_file_costs_only_what_it_held(tmp_path: Path) -> None:
    root = copy_tree("x86_64-nvidia-h100", tmp_path)
    (root / "proc/driver/nvidia/version").unlink()
    (root / "proc/driver/nvidia/version").mkdir()
    os.mkfifo(root / "proc/meminfo.fifo")
    (root / "proc/meminfo").unlink()
    os.symlink("meminfo.fifo", root / "proc/meminfo")  # a FIFO must not block detection
    info = detect_hardware(root=root)
    gpu = only(info, NVIDIA_GPU)
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.driver_version is None and gpu.details["driver_loaded"] is False
    assert info.cpu.memory_total_bytes is None
    assert info.cpu.model == "Intel(R) Xeon(R) Processor" and info.cpu.logical_cores == 16


def test_permission_error_on_one_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, which reads any mode; so the refusal a normal user would get is raised here.
    real_open = os.open

    def refusing_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        if str(path).endswith("/information"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(hardware.files.os, "open", refusing_open)
    gpu = only(detect_hardware(root=H100), NVIDIA_GPU)
    assert gpu.model == "NVIDIA GPU (PCI 10de:2330)"
    assert gpu.driver_version == "580.159.04"
    assert gpu.details["pci_address"] == "0000:00:06.0"


def test_large_dpkg_status(tmp_path: Path) -> None:
    root = copy_tree("jetson-agx-orin", tmp_path)
    status = (root / "var/lib/dpkg/status").read_text()
    filler = "".join(
        f"Package: pkg{i}\nStatus: install ok installed\nVersion: 1.{i}\nDescription: x\n\n"
        for i in range(20000)
    )
    write(root, "var/lib/dpkg/status", filler + status)
    jetson = only(detect_hardware(root=root), NVIDIA_JETSON)
    assert jetson.details["jetpack_source"] == "dpkg nvidia-jetpack"
    assert jetson.details["tensorrt_version"] == "8.6.2.3"
