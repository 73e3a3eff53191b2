"""How busy the box's CPUs were while something was measured: said beside every speed verdict (a
backend proof, a health window), so an operator can tell a slow model from a busy box."""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class CpuUse:
    busy_percent: float  # all cores, every process
    # The share not spent by this process and the children it waited for (a trial, a timing
    # worker): the neighbours' work. None where it cannot be told (see CpuLoad.use).
    others_percent: float | None = None

    def describe(self) -> str:
        """ "the box's CPU was 97 % busy (61 % by other processes)"."""
        return f"the box's CPU was {self.busy()}"

    def busy(self) -> str:
        """ "97 % busy (61 % by other processes)"."""
        said = f"{self.busy_percent:.0f} % busy"
        if self.others_percent is None:
            return said
        return f"{said} ({self.others_percent:.0f} % by other processes)"


class CpuLoad:
    """The box's CPU use from when it is made to each `use()` / `percent()`. `processes` (pids of
    running children, e.g. timing workers) count as this process's own work."""

    def __init__(self, processes: Sequence[int] = ()) -> None:
        self._times = psutil.cpu_times()
        self._wall = time.monotonic()
        self._own = _rusage_s()
        self._processes = {pid: _process_s(pid) for pid in processes}

    def percent(self) -> float:
        """How busy every core was, in %: all processes, this one included."""
        end = psutil.cpu_times()
        idle = (end.idle - self._times.idle) + (
            getattr(end, "iowait", 0.0) - getattr(self._times, "iowait", 0.0)
        )
        total = sum(end) - sum(self._times)
        return 0.0 if total <= 0 else max(0.0, min(100.0, 100.0 * (1 - idle / total)))

    def use(self) -> CpuUse:
        """The busy share and, of it, what other processes used: the CPU time this process, its
        `processes` and the children it waited for spent is taken off (other children still running
        are not counted yet: call this once they were waited for)."""
        busy = self.percent()
        cores_s = (time.monotonic() - self._wall) * (psutil.cpu_count() or 1)
        if cores_s <= 0:
            return CpuUse(busy)
        own_s = _rusage_s() - self._own
        for pid, began in self._processes.items():
            now = _process_s(pid)
            if now is not None and began is not None:
                own_s += now - began
        own = 100.0 * own_s / cores_s
        return CpuUse(busy, max(0.0, min(busy, busy - own)))


def _rusage_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    spent = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        spent += usage.ru_utime + usage.ru_stime
    return spent


def _process_s(pid: int) -> float | None:
    """CPU seconds of a running process (None: it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)
