"""This box as a decision sees it: its hardware and backends (`Box`, probed once and cached under
the state dir), the selection policy from the config, what hardware each backend has here, and
whether this process may write under the state dir."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, PipelineConfig
from agent.hardware import HardwareInfo, detect_hardware
from providers import Backend, SelectionPolicy, all_backends
from providers.catalog import cached_backends


def box_backends(config: AgentConfig, hardware: HardwareInfo | None = None) -> list[Backend]:
    """This box's backends as the daemon sees them: probed in a child process and cached under the
    state dir (providers/catalog.py), so that only the runtime a pipeline serves on is imported here."""
    fingerprint = (hardware or detect_hardware()).fingerprint()
    return cached_backends(config.state_dir / "cache", fingerprint)


def policy_for(
    config: AgentConfig, pipeline: PipelineConfig | None = None, backends: Sequence[Backend] | None = None
) -> SelectionPolicy:
    """The agent's selection settings, with the pipeline's prefer/deny/fixed on top. `backends`:
    the backends to set cache dirs for (default: every runtime's, imported here)."""
    agent = config.backends
    prefer = list(pipeline.backend.prefer) + list(agent.prefer) if pipeline else list(agent.prefer)
    deny = list(agent.deny) + (list(pipeline.backend.deny) if pipeline else [])
    fixed = (pipeline.backend.fixed if pipeline else None) or agent.fixed
    return SelectionPolicy(
        prefer=tuple(prefer),
        deny=tuple(deny),
        fixed=fixed,
        benchmark=agent.benchmark,
        max_trials=agent.max_trials,
        warmup=agent.warmup,
        runs=agent.runs,
        min_time_s=agent.min_time_s,
        budget_s=agent.budget_s,
        timeout_s=agent.timeout_s,
        rounds=agent.rounds,
        turn_s=agent.turn_s,
        rtol=agent.rtol,
        atol=agent.atol,
        max_mismatch=agent.max_mismatch,
        spare_core=agent.spare_core,
        options=_with_cache_dirs(
            agent.options, config.state_dir / "cache", all_backends() if backends is None else backends
        ),
    )


def _with_cache_dirs(
    options: Mapping[str, Mapping[str, Any]], cache: Path, backends: Sequence[Backend]
) -> dict[str, dict[str, Any]]:
    """Compiled engines and blobs are cached under the state dir unless the config says otherwise:
    they are built before a model serves, and a restart must not build them again."""
    merged = {name: dict(values) for name, values in options.items()}
    for backend in backends:
        if backend.name.startswith("openvino/") and backend.name != "openvino/*":
            merged.setdefault(backend.name, {}).setdefault("cache_dir", str(cache / "openvino"))
        if backend.name == "onnxruntime/TensorrtExecutionProvider":
            merged.setdefault(backend.name, {}).setdefault("engine_cache_dir", str(cache / "tensorrt"))
    return merged


def hardware_notes(hardware: HardwareInfo) -> dict[str, str]:
    """Backend name -> what this box has for it, e.g. {"openvino/NPU": "Intel NPU (Meteor Lake) found"}."""
    notes: dict[str, str] = {}
    for accelerator in hardware.accelerators:
        for runtime in accelerator.runtimes:
            notes.setdefault(runtime, f"{accelerator.model} found")
    return notes


def providers_report(
    hardware: HardwareInfo | None = None, backends: Sequence[Backend] | None = None
) -> dict[str, Any]:
    """Hardware found and every backend with available/why, naming hardware left unused."""
    hardware = hardware or detect_hardware()
    notes = hardware_notes(hardware)
    rows = []
    for backend in backends if backends is not None else all_backends():
        probe = backend.probe()
        reason = probe.reason
        if not probe.available and backend.name in notes:
            reason = f"{notes[backend.name]}, but {reason}"
        rows.append(
            {
                "backend": backend.name,
                "available": probe.available,
                "reason": reason,
                "versions": dict(probe.versions),
                "devices": list(probe.devices),
            }
        )
    known = {row["backend"] for row in rows}
    for name, found in notes.items():
        if name not in known:
            reason = f"{found}, but edge-agent has no {name} backend"
            rows.append(
                {"backend": name, "available": False, "reason": reason, "versions": {}, "devices": []}
            )
    return {"hardware": hardware.to_dict(), "backends": rows}


def owns_state_dir(config: AgentConfig) -> bool:
    """Whether this process may write under the state dir: it is its owner (the daemon's user), or
    the dir is not made yet. A tool run as another user (`sudo edge-agent ...`) writes nothing there:
    files and folders it made would be in the daemon's way."""
    path = config.state_dir.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if path != config.state_dir.absolute():
        return os.access(path, os.W_OK)  # not made yet: whoever can make it owns it
    try:
        return path.stat().st_uid == os.geteuid()
    except OSError:
        return False


_scratch: list[Path] = []  # this process's private folder for twins, removed when it exits


def derived_dir_of(config: AgentConfig) -> Path:
    """Where opset-upgraded twins are kept: the store's derived/ folder; for another user than the
    state dir's owner, a private folder of this process's (made again by the next run)."""
    if owns_state_dir(config):
        return config.state_dir / "store" / "derived"
    if not _scratch:
        _scratch.append(Path(tempfile.mkdtemp(prefix="edge-agent-derived-")))
        atexit.register(shutil.rmtree, _scratch[0], ignore_errors=True)
    return _scratch[0]


@dataclass(frozen=True)
class Box:
    """This box as a decision sees it: its hardware and its backends (probed once, cached)."""

    hardware: HardwareInfo
    backends: tuple[Backend, ...]

    @classmethod
    def here(cls, config: AgentConfig) -> Box:
        """The daemon's view: the probes cached under the state dir (probed in-process, and not
        cached, for a user who does not own it)."""
        hardware = detect_hardware()
        backends = box_backends(config, hardware) if owns_state_dir(config) else all_backends()
        return cls(hardware, tuple(backends))
