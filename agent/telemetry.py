"""Periodic health for <prefix>/<device>/telemetry: the box (CPU, memory, temperatures, disk), the
agent process, the outbox and the MQTT link, and per pipeline what happened since the last report
(frames per second, inference time, drops, errors, outages).

Temperatures come from the kernel's thermal zones (/sys/class/thermal/thermal_zone*/{type,temp},
millidegrees), read under EDGE_AGENT_SYSROOT like hardware detection: a Jetson names its zones
cpu-thermal, gpu-thermal, tj-thermal, ...; a box without zones (most VMs) reports none.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import psutil

from agent.clock import iso_utc
from agent.status import PipelineStatus, RunStatus
from providers.base import sysroot

_MB = 1024 * 1024


def read_temperatures(root: Path | str | None = None) -> dict[str, float]:
    """°C per thermal zone type (zone name when it has no type); unreadable zones are left out."""
    temperatures: dict[str, float] = {}
    base = sysroot(root) / "sys" / "class" / "thermal"
    try:
        zones = sorted(base.glob("thermal_zone*"))
    except OSError:
        return temperatures
    for zone in zones:
        try:
            millidegrees = int((zone / "temp").read_text().strip())
        except (OSError, ValueError):  # a zone whose sensor is off reads as an I/O error
            continue
        try:
            name = (zone / "type").read_text().strip() or zone.name
        except OSError:
            name = zone.name
        if name in temperatures:
            name = f"{name}-{zone.name.removeprefix('thermal_zone')}"
        temperatures[name] = round(millidegrees / 1000.0, 1)
    return temperatures


class TelemetrySampler:
    """Builds telemetry payloads; per-pipeline figures are for the time since the previous sample."""

    def __init__(self, device: str, state_dir: Path) -> None:
        self.device = device
        self.state_dir = state_dir
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the measurement
        psutil.cpu_percent(None)
        self._started = time.monotonic()
        self._last_at = self._started
        self._last: dict[str, _Totals] = {}  # pipeline -> its cumulative counters then

    def sample(
        self, pipelines: Mapping[str, PipelineStatus], outbox: dict[str, Any], mqtt: dict[str, Any]
    ) -> dict[str, Any]:
        now = time.monotonic()
        interval = max(now - self._last_at, 1e-6)
        self._last_at = now
        memory = psutil.virtual_memory()
        with self._process.oneshot():
            agent = {
                "rss_mb": round(self._process.memory_info().rss / _MB, 1),
                "cpu_percent": self._process.cpu_percent(None),  # 100 = one core busy
                "threads": self._process.num_threads(),
            }
        return {
            "device": self.device,
            "timestamp": iso_utc(time.time()),
            "interval_s": round(interval, 2),
            "uptime_s": round(now - self._started, 1),
            "system": {
                "cpu_percent": psutil.cpu_percent(None),  # all cores, since the previous sample
                "load": [round(v, 2) for v in os.getloadavg()],
                "memory": {
                    "used_mb": round((memory.total - memory.available) / _MB),
                    "total_mb": round(memory.total / _MB),
                    "percent": memory.percent,
                },
                "disk": self._disk(),
                "temperatures_c": read_temperatures(),
            },
            "agent": agent,
            "outbox": {key: outbox.get(key) for key in ("pending", "dropped") if key in outbox},
            "mqtt": {"connected": mqtt.get("connected")},
            "pipelines": {name: self._pipeline(name, state, interval) for name, state in pipelines.items()},
        }

    def _disk(self) -> dict[str, Any]:
        try:
            usage = shutil.disk_usage(self.state_dir)
        except OSError as exc:
            return {"path": str(self.state_dir), "error": str(exc)}
        return {
            "path": str(self.state_dir),
            "free_mb": round(usage.free / _MB),
            "percent": round(100.0 * usage.used / usage.total, 1) if usage.total else None,
        }

    def _pipeline(self, name: str, state: PipelineStatus, interval: float) -> dict[str, Any]:
        run = state.run  # None: nothing runs (yet)
        totals = _Totals.of(run)
        # A pipeline rebuilt since (fleet update, backend retry) starts its counters at 0 again.
        before = self._last.get(name)
        if before is None or totals.inferences < before.inferences:
            before = _Totals()
        self._last[name] = totals
        delta = totals.minus(before)
        return {
            "state": state.state,
            "backend": None if run is None else run.stage.serving.backend,
            "fps": round(delta.inferences / interval, 2),
            "inference_ms": round(delta.inference_ms / delta.inferences, 3) if delta.inferences else None,
            "results": delta.results,
            "errors": delta.errors,
            "frames_dropped": delta.dropped,
            "outages": delta.outages,
            "queued": None if run is None else run.source.queued,
            **({"error": state.error} if state.error else {}),
        }


@dataclass(frozen=True)
class _Totals:
    """A pipeline's cumulative counters at a sample (all 0 while nothing runs)."""

    inferences: int = 0
    inference_ms: float = 0.0  # the time the model ran, all inferences together
    results: int = 0
    errors: int = 0
    dropped: int = 0  # frames the source dropped
    outages: int = 0

    @staticmethod
    def of(run: RunStatus | None) -> _Totals:
        if run is None:
            return _Totals()
        counts, source = run.counts, run.source
        spent = counts.inferences * (counts.mean_inference_ms or 0.0)
        dropped, outages = source.frames_dropped, source.outages
        return _Totals(counts.inferences, spent, counts.results, counts.errors, dropped, outages)

    def minus(self, before: _Totals) -> _Totals:
        return _Totals(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))
