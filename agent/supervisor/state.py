"""What the supervisor tracks and reports: the `ApplyReport` of one `apply`, each named pipeline's
`PipelineSlot` (phase, step, download, attempts) with the `Change` in flight (which is also what its
build reports through: its phases with their deadlines), and the `RegistryLink`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.clock import iso_utc
from agent.config import HealthWindowConfig, PipelineConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import RegistryError
from agent.pipeline import Pipeline
from agent.registry import public_url
from agent.stage import Stage
from agent.status import (
    IN_FLIGHT,
    ChangeStatus,
    Download,
    Origin,
    Phase,
    PipelineStatus,
    Step,
    phase_of,
    pipeline_status,
)
from agent.store import ModelStore

log = logging.getLogger(__package__)  # the package's logger, as before it was split


@dataclass
class ApplyReport:
    """What one `apply` set in motion (the outcomes come later, in `states()`)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
        }


class Cancelled(Exception):
    """A change was pre-empted by a newer one (or the agent is stopping)."""


# While the registry is unreachable and a pipeline waits on it: how often it is asked again.
REGISTRY_PROBE_S = 10.0


class RegistryLink:
    """Whether the registry answered when the agent last needed it (a version not in the store yet).
    Installed versions are served without asking it: offline, the box runs what its store has."""

    def __init__(self, url: str | None, back: Callable[[], object]) -> None:
        """`back`: called when the registry answers again after it could not be reached (the
        supervisor retries at once the pipelines that failed waiting on it)."""
        self.url = public_url(url) if url else None
        self.state = "not asked yet" if url else "none configured"
        self.error: str | None = None
        self.since = time.time()
        self._back = back
        self._probing = False
        self._probed_at = 0.0  # monotonic

    def reached(self, url: str) -> None:
        if self.state != "reachable":
            was_away = self.state == "unreachable"
            self.state, self.error, self.since = "reachable", None, time.time()
            if was_away:
                log.info("registry %s reachable again", url)
                self._back()

    def failed(self, url: str, exc: RegistryError, store: ModelStore) -> None:
        if not unreachable(exc):
            self.reached(url)  # it answered (with an error of its own): the version is the problem
            return
        if self.state != "unreachable":
            installed = ", ".join(m.ref for m in store.list()) or "nothing"
            log.warning(
                "registry %s unreachable (%s); serving what the store has: %s", url, exc.message, installed
            )
            self.state, self.since = "unreachable", time.time()
        self.error = exc.message

    def probe_due(self) -> bool:
        """Unreachable, no probe asking now, and none for REGISTRY_PROBE_S."""
        return (
            self.state == "unreachable"
            and not self._probing
            and time.monotonic() - self._probed_at >= REGISTRY_PROBE_S
        )

    def probe(self, ask: Callable[[], object]) -> None:
        """Run `ask` (which reports through `reached`/`failed`) on a thread of its own: a registry
        that accepts and never answers holds that thread, not the caller's."""
        self._probing, self._probed_at = True, time.monotonic()

        def run() -> None:
            try:
                ask()
            except Exception:  # a probe that cannot even ask (bad URL, no memory): the next one may
                log.debug("registry probe failed", exc_info=True)
            finally:
                self._probing = False

        threading.Thread(target=run, name="registry-probe", daemon=True).start()

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "error": self.error, "since": iso_utc(self.since)}


def unreachable(problem: RegistryError | str | None) -> bool:
    """Whether a pull failed because the registry could not be reached (not an answer of its own)."""
    text = problem.message if isinstance(problem, RegistryError) else problem or ""
    return "cannot reach registry" in text


class Change:
    """One version being brought in: its thread, its cancel flag, its deadline. Its build reports
    through it (building.BuildProgress): the slot's phase and step change under the supervisor's lock,
    and each phase must end within `phase_timeout_s`."""

    def __init__(
        self,
        slot: PipelineSlot,
        desired: DesiredPipeline,
        lock: threading.RLock,
        stopping: threading.Event,
        phase_timeout_s: float,
        note: str | None = None,
    ) -> None:
        """`note`: set when a rollback is brought in at start (see Supervisor._begin)."""
        self.slot = slot
        self.desired = desired
        self.note = note
        self.cancel = threading.Event()
        self.deadline = 0.0  # monotonic: the current phase must end by then
        self.thread: threading.Thread | None = None
        self.new_pipeline = False  # a new source: a new Pipeline replaced the old one (not a stage swap)
        self.swapped_in: Stage | None = None  # the stage it swapped into a running pipeline (not committed)
        self._lock = lock
        self._stopping = stopping
        self._phase_timeout_s = phase_timeout_s

    def check(self) -> None:
        """Raise Cancelled when a newer change pre-empted this one, or the agent stops."""
        if self.cancel.is_set() or self._stopping.is_set():
            raise Cancelled()

    def phase(self, phase: str, step: str, extra_s: float = 0.0) -> None:
        """Enter `phase` (one of agent/status.py's); it must end within fleet.phase_timeout_s (plus
        `extra_s`: a health window)."""
        entered = phase_of(phase)
        with self._lock:
            self.check()
            self.deadline = time.monotonic() + self._phase_timeout_s + extra_s
            self.slot.set_phase(entered)
            self.slot.set_step(step)

    def step(self, text: str) -> None:
        with self._lock:
            self.slot.set_step(text)

    def download(self, what: str, done: int, total: int, rate: float) -> None:
        self.slot.download = Download(what, done, total, round(rate))


class PipelineSlot:
    """A named pipeline: what runs, what is wanted, and where the change between them stands."""

    def __init__(self, desired: DesiredPipeline) -> None:
        self.name = desired.config.name
        self.desired = desired
        self.running: DesiredPipeline | None = None  # the version the pipeline serves
        self.pipeline: Pipeline | None = None
        self.change: Change | None = None
        self.phase: Phase = "pending"
        self.reason: str | None = None
        self.since = time.time()
        self.step = ""  # what the phase is doing now (pulling x, a backend trial, compiling an engine)
        self.step_started = time.monotonic()
        self.step_logged = self.step_started
        self.download: Download | None = None  # how far the pull in this step got
        self.attempts = 0
        self.retry_at: float | None = None  # monotonic: when a pipeline that never ran is tried again

    def set_phase(self, phase: Phase, reason: str | None = None) -> None:
        if phase != self.phase or reason != self.reason:
            self.phase, self.reason, self.since = phase, reason, time.time()

    def set_step(self, text: str) -> None:
        now = time.monotonic()
        self.step, self.step_started, self.step_logged = text, now, now
        self.download = None
        if text:
            log.info("pipeline %s: %s", self.name, text)

    def status(self, default_health: HealthWindowConfig | None = None) -> PipelineStatus:
        """The pipeline's status: the running pipeline's own (counters, source) with the change's.
        Its last error is cleared after the desired version's health window of clean running."""
        run = None if self.pipeline is None else self.pipeline.status(self.desired.health or default_health)
        return pipeline_status(run, self.change_status())

    def change_status(self) -> ChangeStatus:
        """Where the change stands: `desired_model` is the version wanted; `running_from` says where
        the committed version came from when it is not the desired one (a change failed, rolled
        back or in flight)."""
        running, in_flight = self.running, self.phase in IN_FLIGHT and self.step
        if running is not None and running.config == self.desired.config:
            running = None  # the desired version serves: where it came from is said already
        return ChangeStatus(
            phase=self.phase,
            reason=self.reason,
            since=iso_utc(self.since),
            desired=Origin(self.desired.layer, self.desired.generation),
            attempts=self.attempts,
            desired_model=model_ref(self.desired.config),
            running_from=None if running is None else Origin(running.layer, running.generation),
            step=Step(self.step, round(time.monotonic() - self.step_started, 1)) if in_flight else None,
            download=self.download,
        )


def model_ref(config: PipelineConfig) -> str:
    """`name@version` of the pipeline's model."""
    return f"{config.model.name}@{config.model.version}"
