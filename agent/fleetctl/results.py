"""What the fleet controller (agent/fleetctl/client.py) returns: the waves of a deploy or rollback,
the deploy's result, a command's reply. Plain data with `to_dict` for `--json`; the CLI
(agent/cli/fleet.py) turns a result's `status` into its exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.fleetctl.records import BAD_OUTCOMES, CONVERGED, FAILED, OFFLINE, ROLLED_BACK, TIMED_OUT

Phase = Literal["canary", "all", "rollback"]
Progress = Callable[[str, int, Mapping[str, int], int], None]  # phase, generation, counts, devices


@dataclass(frozen=True)
class Wave:
    """One published generation and where each device it was waited for ended."""

    phase: Phase
    generation: int
    outcomes: Mapping[str, tuple[str, str | None]]  # device -> (outcome, reason)
    seconds: float

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys((CONVERGED, FAILED, ROLLED_BACK, OFFLINE, TIMED_OUT), 0)
        for outcome, _ in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    @property
    def failed_pct(self) -> float:
        """Bad outcomes (failed, rolled back, timed out) per 100 devices that are not offline; 100
        when every device is offline: nothing proved the generation works."""
        considered = [o for o, _ in self.outcomes.values() if o != OFFLINE]
        if not self.outcomes:
            return 0.0
        if not considered:
            return 100.0
        return 100.0 * sum(o in BAD_OUTCOMES for o in considered) / len(considered)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "generation": self.generation,
            "devices": len(self.outcomes),
            "counts": self.counts(),
            "failed_pct": round(self.failed_pct, 2),
            "seconds": round(self.seconds, 3),
            "outcomes": {d: {"outcome": o, "reason": r} for d, (o, r) in sorted(self.outcomes.items())},
        }


@dataclass
class DeployResult:
    """What a deploy or rollback did. `status`: published (not waited for), converged, failed,
    rolled-back (the controller rolled the target back), timed-out or offline."""

    target: str
    topic: str
    published: list[int] = field(default_factory=list)
    waves: list[Wave] = field(default_factory=list)
    status: str = "published"
    message: str = ""
    signed_by: str | None = None

    @property
    def generation(self) -> int:
        return self.published[-1] if self.published else 0

    @property
    def outcomes(self) -> Mapping[str, tuple[str, str | None]]:
        """Each device's outcome in the last wave it was waited for."""
        merged: dict[str, tuple[str, str | None]] = {}
        for wave in self.waves:
            merged.update(wave.outcomes)
        return merged

    def to_dict(self) -> dict[str, Any]:
        outcomes = self.outcomes
        summary = dict.fromkeys((CONVERGED, FAILED, ROLLED_BACK, OFFLINE, TIMED_OUT), 0)
        for outcome, _ in outcomes.values():
            summary[outcome] += 1
        return {
            "status": self.status,
            "message": self.message,
            "target": self.target,
            "topic": self.topic,
            "generation": self.generation,
            "published": self.published,
            "signed_by": self.signed_by,
            "summary": {"devices": len(outcomes), **summary},
            "waves": [w.to_dict() for w in self.waves],
            "devices": {d: {"outcome": o, "reason": r} for d, (o, r) in sorted(outcomes.items())},
        }


def final_status(wave: Wave) -> str:
    """A deploy's status once `wave` is its last: its worst outcome (a pipeline's own rollback on a
    device counts as failed)."""
    outcomes = {o for o, _ in wave.outcomes.values()}
    for status in (FAILED, ROLLED_BACK, TIMED_OUT, OFFLINE):
        if status in outcomes:
            return FAILED if status == ROLLED_BACK else status
    return CONVERGED


@dataclass(frozen=True)
class CommandReply:
    device: str
    name: str
    ok: bool
    result: Any
    error: Mapping[str, Any] | None
    seconds: float
    correlation_data: bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "command": self.name,
            "ok": self.ok,
            "result": self.result,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }


def describe(result: DeployResult, wave: Wave) -> str:
    """The result's one-line message about `wave`."""
    counts = ", ".join(f"{n} {o}" for o, n in wave.counts().items() if n)
    if not wave.outcomes:
        return f"{result.target} generation {wave.generation}: no device reports the target yet"
    where = f"{result.target} generation {wave.generation} ({wave.phase})"
    return f"{where}: {len(wave.outcomes)} device(s): {counts}"
