"""The CPU (model, arch, vendor, ISA flags, cores, memory) from /proc/cpuinfo, and the OS release and
kernel."""

from __future__ import annotations

import re

from agent.hardware.files import Tree, clean_text, parse_hex, parse_int
from agent.hardware.records import CpuInfo

_MAX_CPUINFO = 8 << 20  # /proc/cpuinfo of a many-core server


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
    value = (clean_text(text) or "").lower()
    value = _ARCH_ALIASES.get(value, value)
    return value if re.fullmatch(r"[a-z0-9_]{2,16}", value) else None


def detect_cpu(tree: Tree) -> CpuInfo:
    blocks = _cpuinfo_blocks(tree.read("proc/cpuinfo", _MAX_CPUINFO) or "")
    processors = [b for b in blocks if parse_int(b.get("processor")) is not None]
    extra: dict[str, str] = {}  # lines outside processor blocks (Raspberry Pi: Revision, Model)
    for block in blocks:
        if parse_int(block.get("processor")) is None:
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
        vendor = clean_text(first.get("vendor_id")) or ""
        model = clean_text(first.get("model name"))
    elif processors:
        parts: dict[str, int] = {}
        for block in processors:
            implementer, part = parse_hex(block.get("CPU implementer")), parse_hex(block.get("CPU part"))
            if implementer is None or part is None:
                continue
            vendor = vendor or _ARM_IMPLEMENTERS.get(implementer, "")
            name = _ARM_PARTS.get((implementer, part), f"implementer 0x{implementer:02x} part 0x{part:03x}")
            parts[name] = parts.get(name, 0) + 1
        if len(parts) == 1:
            model = f"{vendor or 'ARM'} {next(iter(parts))}"
        elif parts:
            model = f"{vendor or 'ARM'} " + " + ".join(f"{name} x{count}" for name, count in parts.items())
        model = model or clean_text(first.get("model name")) or clean_text(extra.get("Hardware"))

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


def read_os_release(tree: Tree) -> str | None:
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
        pretty = clean_text(values.get("PRETTY_NAME")) or clean_text(
            " ".join(v for v in (values.get("NAME"), values.get("VERSION")) if v)
        )
        if pretty:
            return pretty
    return None


def kernel_release(tree: Tree) -> str | None:
    match = re.match(r"Linux version (\S{1,100})", tree.read("proc/version") or "")
    if match:
        return clean_text(match.group(1))
    return clean_text(tree.value("proc/sys/kernel/osrelease"), 100)


# --------------------------------------------------------------------------- buses
