"""The supervised set of pipelines, changed only through `apply(desired)`.

`apply` is the one way pipelines start, change and stop: at boot (agent.yaml), from the fleet
reconciler (desired state over MQTT) and on a config reload. It compares what is wanted with what
runs, name by name, and brings each change in on a thread of its own, so one pipeline's dead camera
or slow pull never holds up another:

    pending -> pulling -> validating -> building -> (health-check) -> running
                                                                   -> failed | rolled-back

- *validating* proves the model on this box (backend selection against the version's test data or a
  frame of the pipeline's own source); a version whose outputs are wrong everywhere fails here.
- *building* makes a warm `Stage`. A running pipeline whose source is unchanged keeps its source: the
  stage is swapped in between two frames and the old one stays warm. A changed source means a new
  pipeline, started once its stage is ready (the old one stops just before).
- *health-check* (versions from desired state): the new stage runs live frames for the health window;
  errors, NaN outputs, latency over budget or no frames at all roll it back to the previous stage by
  itself. The old version is then kept until a newer generation comes.

Every in-flight phase has a deadline (`fleet.phase_timeout_s`): a build that overruns is abandoned
and the pipeline ends `failed`, never "in progress" for ever. A newer `apply` pre-empts a change still
in flight. A pipeline that never started is retried with backoff; a failed upgrade is not retried
(the old version serves) until the desired state changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.backend_choice import DecisionSwitcher, check_on_testdata, choose_and_load, make_prover
from agent.clock import iso_utc
from agent.config import REVEAL_SECRETS, AgentConfig, HealthWindowConfig, PipelineConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import EdgeAgentError, RegistryError
from agent.fsutil import atomic_write_bytes
from agent.model_hints import embedded_hints, with_model_hints
from agent.pipeline import LoadedModel, Pipeline, ResultSink, Stage
from agent.registry import open_registry, public_url
from agent.retry import backoff_delay
from agent.session_pool import SessionPool
from agent.sources import BrokerLink, Frame, Slot, Source, is_live, open_source
from agent.store import ModelStore, Progress
from providers import BackendError

log = logging.getLogger(__name__)

REBUILD_MIN_S = 10.0
REBUILD_MAX_S = 600.0
_SWAP_TIMEOUT_S = 10.0  # the worker swaps between two frames: a frame that takes longer is stuck
_STOP_TIMEOUT_S = 10.0
_BUILD_JOIN_S = 5.0  # a build stuck in a download must not eat the stop budget
# A build step this long (a TensorRT engine build can take many minutes) is logged again meanwhile.
_PHASE_LOG_EVERY_S = 30.0

_MIN_INFERENCES_FOR_LATENCY = 5  # the health window judges latency on at least this many frames
IN_FLIGHT = ("pending", "pulling", "validating", "building", "health-check")


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


class RegistryLink:
    """Whether the registry answered when the agent last needed it (a version not in the store yet).
    Installed versions are served without asking it: offline, the box runs what its store has."""

    def __init__(self, url: str | None) -> None:
        self.url = public_url(url) if url else None
        self.state = "not asked yet" if url else "none configured"
        self.error: str | None = None
        self.since = time.time()

    def reached(self, url: str) -> None:
        if self.state != "reachable":
            if self.state == "unreachable":
                log.info("registry %s reachable again", url)
            self.state, self.error, self.since = "reachable", None, time.time()

    def failed(self, url: str, exc: RegistryError, store: ModelStore) -> None:
        if "cannot reach registry" not in exc.message:
            return  # it answered (with an error of its own): reachable, the version is the problem
        if self.state != "unreachable":
            installed = ", ".join(m.ref for m in store.list()) or "nothing"
            log.warning(
                "registry %s unreachable (%s); serving what the store has: %s", url, exc.message, installed
            )
            self.state, self.since = "unreachable", time.time()
        self.error = exc.message

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "error": self.error, "since": iso_utc(self.since)}


@dataclass
class _Change:
    """One version being brought in: its thread, its cancel flag, its deadline."""

    desired: DesiredPipeline
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float = 0.0  # monotonic: the current phase must end by then
    thread: threading.Thread | None = None
    new_pipeline: bool = False  # a new source: a new Pipeline replaced the old one (not a stage swap)
    note: str | None = None  # set: a rollback brought in at start (see Supervisor._begin)
    swapped_in: Stage | None = None  # the stage it swapped into a running pipeline (not yet committed)


class PipelineSlot:
    """A named pipeline: what runs, what is wanted, and where the change between them stands."""

    def __init__(self, desired: DesiredPipeline) -> None:
        self.name = desired.config.name
        self.desired = desired
        self.running: DesiredPipeline | None = None  # the version the pipeline serves
        self.pipeline: Pipeline | None = None
        self.change: _Change | None = None
        self.phase = "pending"
        self.reason: str | None = None
        self.since = time.time()
        self.step = ""  # what the phase is doing now (pulling x, a backend trial, compiling an engine)
        self.step_started = time.monotonic()
        self.step_logged = self.step_started
        self.download: dict[str, Any] | None = None  # {"artifact", "bytes", "total", "rate_bps"}
        self.attempts = 0
        self.retry_at: float | None = None  # monotonic: when a pipeline that never ran is tried again

    def set_phase(self, phase: str, reason: str | None = None) -> None:
        if phase != self.phase or reason != self.reason:
            self.phase, self.reason, self.since = phase, reason, time.time()

    def to_dict(self, default_health: HealthWindowConfig | None = None) -> dict[str, Any]:
        """The pipeline's status: the running pipeline's own (counters, source) plus the change's.
        `running_model` is the version frames go through now (None: nothing serves), `desired_model`
        the one wanted; `running_layer`/`running_generation` say where the committed version came
        from when it is not the desired one (a change failed, rolled back or in flight)."""
        if self.pipeline is not None:
            # Its last error is cleared after the desired version's health window of clean running.
            state = self.pipeline.status(self.desired.health or default_health)
            state["running_model"] = state["model"]
        else:
            state = {
                "state": "error" if self.phase == "failed" else "starting",
                "error": self.reason,
                "backend_why": None,
                "running_model": None,
            }
        state.update(
            {
                "phase": self.phase,
                "reason": self.reason,
                "since": iso_utc(self.since),
                "layer": self.desired.layer,
                "generation": self.desired.generation,
                "attempts": self.attempts,
            }
        )
        state["desired_model"] = _ref(self.desired.config)
        if self.running is not None and self.running.config != self.desired.config:
            state["running_layer"], state["running_generation"] = self.running.layer, self.running.generation
        if self.phase in IN_FLIGHT and self.step:
            state["step"] = self.step
            state["step_s"] = round(time.monotonic() - self.step_started, 1)
        if self.download is not None:
            state["download"] = dict(self.download)
        return state


class Supervisor:
    def __init__(
        self,
        config: AgentConfig,
        store: ModelStore,
        sessions: SessionPool,
        sink: ResultSink,
        broker: BrokerLink | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.sessions = sessions
        self.sink = sink
        self.broker = broker
        self.registry_link = RegistryLink(config.registry.url if config.registry else None)
        self._on_change = on_change or (lambda: None)
        self._lock = threading.RLock()
        self._slots: dict[str, PipelineSlot] = {}
        self._stopping = threading.Event()
        self.phase_timeout_s = config.fleet.phase_timeout_s
        self.memory = VersionMemory(config.state_dir / "pipelines.json")

    # --- the one entry point ---------------------------------------------------------------------

    def apply(self, desired: Sequence[DesiredPipeline]) -> ApplyReport:
        """Make the running set what `desired` says: start new pipelines, bring changed ones in, stop
        removed ones; unchanged ones are not touched. Returns at once; progress shows in `states()`."""
        report = ApplyReport()
        wanted = {d.config.name: d for d in desired if d.config.enabled}
        with self._lock:
            if self._stopping.is_set():
                return report
            for name, slot in list(self._slots.items()):
                if name not in wanted:
                    report.removed.append(name)
                    self._remove(slot)
            for name, want in wanted.items():
                existing = self._slots.get(name)
                if existing is None:
                    slot = self._slots[name] = PipelineSlot(want)
                    report.added.append(name)
                    self._start_new(slot, want)
                    continue
                slot = existing
                if slot.desired.config == want.config:
                    slot.desired = want  # same pipeline (maybe a new generation saying the same): untouched
                    report.unchanged.append(name)
                else:
                    report.changed.append(name)
                    slot.desired = want
                    self._begin(slot, want)
        if report.added or report.changed or report.removed:
            log.info("apply: %s", ", ".join(f"{k} {v}" for k, v in report.to_dict().items() if v))
        self._on_change()
        return report

    def _start_new(self, slot: PipelineSlot, want: DesiredPipeline) -> None:
        """A version that failed here before a restart is not tried again: the last good one runs."""
        good, why = self.memory.fallback_for(want)
        if good is None:
            self._begin(slot, want)
            return
        failed, last_good = _ref(want.config), _ref(good.config)
        self._begin(slot, good, f"{failed} failed here before ({why}); running the last good {last_good}")

    def _begin(self, slot: PipelineSlot, desired: DesiredPipeline, note: str | None = None) -> None:
        """Start bringing `desired` in (pre-empting a change in flight); `note`: it stands in for the
        wanted version as its rollback (reported `rolled-back` with the note). Holds the lock."""
        if slot.change is not None:
            slot.change.cancel.set()
            log.info("pipeline %s: a newer version pre-empts the change in flight", slot.name)
        if slot.running is not None and slot.running.config == desired.config and slot.pipeline is not None:
            slot.change = None  # back to what runs (a change in flight was withdrawn)
            slot.set_phase("running")
            return
        change = _Change(desired, note=note)
        slot.change = change
        slot.set_phase("pending")
        slot.retry_at = None
        change.thread = threading.Thread(
            target=self._bring_in, args=(slot, change), name=f"build-{slot.name}", daemon=True
        )
        change.thread.start()

    def _remove(self, slot: PipelineSlot) -> None:
        """Stop and forget a pipeline no longer wanted (the stop runs off the caller's thread)."""
        if slot.change is not None:
            slot.change.cancel.set()
            slot.change = None
        del self._slots[slot.name]
        pipeline, slot.pipeline = slot.pipeline, None
        slot.set_phase("removed")
        if pipeline is not None:
            threading.Thread(
                target=self._stop_pipeline, args=(pipeline,), name=f"stop-{slot.name}", daemon=True
            ).start()

    # --- bringing one version in (its own thread) ------------------------------------------------

    def _bring_in(self, slot: PipelineSlot, change: _Change) -> None:
        desired = change.desired
        slot.attempts += 1
        source: tuple[Source, Slot] | None = None
        stage: Stage | None = None
        try:
            running = slot.pipeline
            keeps_source = running is not None and running.source_config == desired.config.source
            if running is None and is_live(desired.config.source):
                # Live data (sensor values, audio) arriving while the model is built is kept, and the
                # sample for choosing a backend comes from this same source.
                source = open_source(desired.config.source, slot.name, self.broker)
                source[0].start()
            peek = self._peek_for(running if keeps_source else None, source)
            stage = self._build_stage(slot, change, peek, first=running is None)
            self._phase(slot, change, "building", "starting the new version")
            if keeps_source and running is not None:
                if not running.swap_in(stage, _SWAP_TIMEOUT_S):
                    raise EdgeAgentError(
                        f"the running pipeline did not take the new stage in {_SWAP_TIMEOUT_S:.0f} s"
                    )
                pipeline = running
                change.swapped_in, stage = stage, None  # the pipeline owns it now
            else:
                pipeline = Pipeline(desired.config, stage, self.sink, source=source)
                stage, source = None, None  # the pipeline owns them now
                with self._lock:
                    self._check(change)
                    previous, slot.pipeline = slot.pipeline, pipeline
                    change.new_pipeline = True
                if previous is not None:  # a changed source: the old pipeline stops as the new one starts
                    self._stop_pipeline(previous, close_stage=False)
                    pipeline.keep_previous(previous.stage)  # warm, for a rollback
                pipeline.start()
            self._on_change()
            if desired.health is not None and not self._health_check(slot, change, pipeline, desired.health):
                return  # rolled back (or stopped, when there was nothing to go back to)
            self._commit(slot, change, pipeline)
        except Cancelled:
            log.info("pipeline %s: change to %s abandoned", slot.name, _ref(desired.config))
            # Pre-empted in its health window: back to the last good stage; the newer version will be
            # swapped in from there. (At a stop the stages are closed as they are.)
            live = slot.pipeline
            swapped = change.swapped_in
            if (
                swapped is not None
                and live is not None
                and live.stage is swapped
                and not self._stopping.is_set()
            ):
                live.roll_back(_SWAP_TIMEOUT_S)
        except Exception as exc:  # whatever a model or source does wrong, the daemon runs on
            self._failed(slot, change, exc)
        finally:
            if stage is not None:
                stage.close()
            if source is not None:
                source[0].stop(timeout=5)
            self._on_change()

    def _peek_for(
        self, running: Pipeline | None, source: tuple[Source, Slot] | None
    ) -> Callable[[float], Frame | None] | None:
        """Where a frame to prove backends on comes from without costing the pipeline one: the running
        pipeline's last frame, or the source opened early; None: open the source a second time."""
        if running is not None:
            last = running.last_frame
            if last is not None:
                return lambda _timeout: last
            return running.slot.peek
        if source is not None:
            return source[1].peek
        return None

    def _build_stage(
        self,
        slot: PipelineSlot,
        change: _Change,
        peek: Callable[[float], Frame | None] | None,
        first: bool = False,
    ) -> Stage:
        """The new version's stage, built and warmed. `first`: nothing serves in this slot yet, so an
        unproven model starts on the CPU reference at once (backends.prove_in_background); a new version
        beside a serving one takes the time to be proven first."""
        config = change.desired.config
        model = config.model
        self._phase(slot, change, "pulling", f"pulling {model.name}@{model.version}")
        download: Progress = lambda what, done, total, rate: self._set_download(slot, what, done, total, rate)  # noqa: E731
        if model.path is not None:
            installed = self.store.import_file(model.path, model.name, model.version)
        else:
            assert self.config.registry is not None  # the config model requires it for registry models
            asks_registry = not self.store.is_installed(model.name, model.version)
            registry = open_registry(self.config.registry.url, self.config.registry)
            try:
                # After a failure, re-hash the installed blobs: a bit-rotted file of the right size
                # would otherwise fail to load for ever. The first attempt trusts sizes (fast start).
                installed = self.store.pull(
                    registry,
                    model.name,
                    model.version,
                    verify=slot.attempts > 1,
                    progress=download,
                    digest=model.digest,
                )
            except RegistryError as exc:
                self.registry_link.failed(registry.url, exc, self.store)
                raise
            finally:
                registry.close()
            if asks_registry:
                self.registry_link.reached(registry.url)
        self._check(change)
        # Preprocessing, state and labels the version ships (manifest), then the file's own metadata.
        config = with_model_hints(config, installed.manifest, embedded_hints(installed.model_artifacts()))
        self._phase(slot, change, "validating", f"proving backends for {installed.ref}")
        session, choice = choose_and_load(
            self.config,
            config,
            installed.model_artifacts(),
            installed.ref,
            installed.testdata_artifacts(),
            progress=lambda text: self._step(slot, text),
            load=self.sessions.load,
            peek=peek,
            prove_later=first and self.config.backends.prove_in_background,
        )
        decision, testdata = choice.decision, installed.testdata_artifacts()
        try:
            if not decision.checked:  # no trials ran: the version's own test data proves the choice
                check_on_testdata(session, choice, testdata)
        except Exception:
            session.close()
            raise
        log.info("pipeline %s: %s", config.name, decision.explain())
        loaded = LoadedModel(
            installed.name, installed.version, decision.artifact_sha256, session, decision, choice.key
        )
        try:
            self._check(change)
            self._phase(slot, change, "building", f"warming up on {session.backend}")
            stage = Stage(config, loaded)
            stage.warm_up()
            prove = None
            if choice.policy.benchmark and not decision.checked:  # no sample at build time: a frame will do
                prove = make_prover(self.config, config, choice, testdata)
            stage.switcher = DecisionSwitcher(
                decision,
                choice.artifacts,
                choice.policy,
                warm_up=stage.feeder.warm_up_feeds(),
                backends=choice.box.backends,
                prove=prove,
            )
        except Exception:
            session.close()
            raise
        return stage

    def _health_check(
        self, slot: PipelineSlot, change: _Change, pipeline: Pipeline, health: HealthWindowConfig
    ) -> bool:
        """Watch the new stage on live frames for the window; False (rolled back) when it fails."""
        watching = f"watching {pipeline.stage.ref} for {health.window_s:.0f} s"
        self._phase(slot, change, "health-check", watching, extra_s=health.window_s)
        stage = pipeline.stage
        stage.watch_outputs = health.nan_is_failure
        before = pipeline.previous_stage.stats.median_latency_ms() if pipeline.previous_stage else None
        window_ends = time.monotonic() + health.window_s
        problem = None
        while problem is None and time.monotonic() < window_ends:
            if change.cancel.wait(min(0.5, max(0.0, window_ends - time.monotonic()))):
                raise Cancelled()
            problem = _unhealthy(stage, health, before, final=False)
        problem = problem or _unhealthy(stage, health, before, final=True)
        stage.watch_outputs = False
        if problem is None:
            return True
        with self._lock:
            if change.cancel.is_set():
                raise Cancelled()
        self._roll_back(slot, change, pipeline, f"{stage.ref} failed its health window: {problem}")
        return False

    def _roll_back(self, slot: PipelineSlot, change: _Change, pipeline: Pipeline, why: str) -> None:
        """Back to the version that ran before (`rolled-back`), or stopped when there was none (`failed`)."""
        log.error("pipeline %s: %s; rolling back", slot.name, why)
        self.memory.failed(slot.name, change.desired, why)
        if not change.new_pipeline and pipeline.roll_back(_SWAP_TIMEOUT_S):
            with self._lock:
                slot.change = None
                slot.set_phase("rolled-back", why)
            return
        # A new pipeline (changed source, or the first version): stop it; restart the old one if any.
        old_stage, running = pipeline.previous_stage, slot.running
        self._stop_pipeline(pipeline, close_stage=False)
        pipeline.stage.close()
        with self._lock:
            slot.change = None
            if old_stage is not None and running is not None:
                restored = Pipeline(running.config, old_stage, self.sink)
                restored.start()
                slot.pipeline = restored
                slot.set_phase("rolled-back", why)
            else:
                slot.pipeline = None
                slot.set_phase("failed", why)

    def _commit(self, slot: PipelineSlot, change: _Change, pipeline: Pipeline) -> None:
        with self._lock:
            if change.cancel.is_set():
                raise Cancelled()
            pipeline.commit()
            first = slot.running is None
            slot.running = change.desired
            slot.change = None
            if change.note:
                slot.set_phase("rolled-back", change.note)
            else:
                slot.set_phase("running")
        self.memory.good(slot.name, change.desired)
        backend, ref = pipeline.model.session.backend, pipeline.stage.ref
        if first:
            log.info("pipeline %s started: %s on %s", slot.name, ref, backend)
        else:
            log.info("pipeline %s: now running %s on %s", slot.name, ref, backend)
        self._prune_store()

    def _failed(self, slot: PipelineSlot, change: _Change, exc: Exception) -> None:
        expected = isinstance(exc, (EdgeAgentError, BackendError, OSError))
        with self._lock:
            if change.cancel.is_set() or slot.change is not change:
                return  # pre-empted (or timed out, and already reported)
            slot.change = None
            slot.download = None
            serving = slot.pipeline is not None
            if not serving:  # never ran: try again later (a camera or registry may come back)
                delay = backoff_delay(slot.attempts, REBUILD_MIN_S, REBUILD_MAX_S)
                slot.retry_at = time.monotonic() + delay
                slot.set_phase("failed", str(exc))
                log.error(
                    "pipeline %s not started: %s (retry in %.0f s)",
                    slot.name,
                    exc,
                    delay,
                    exc_info=not expected,
                )
            else:  # an upgrade: the version that runs keeps running
                slot.set_phase("failed", str(exc))
                self.memory.failed(slot.name, change.desired, str(exc))
                running = slot.pipeline.stage.ref if slot.pipeline else "?"
                log.error(
                    "pipeline %s: %s not brought in: %s; %s keeps running",
                    slot.name,
                    _ref(change.desired.config),
                    exc,
                    running,
                    exc_info=not expected,
                )

    # --- phases, deadlines, retries -----------------------------------------------------------

    def _check(self, change: _Change) -> None:
        if change.cancel.is_set() or self._stopping.is_set():
            raise Cancelled()

    def _phase(
        self, slot: PipelineSlot, change: _Change, phase: str, step: str, extra_s: float = 0.0
    ) -> None:
        """Enter `phase`; it must end within fleet.phase_timeout_s (plus `extra_s`: a health window)."""
        with self._lock:
            self._check(change)
            change.deadline = time.monotonic() + self.phase_timeout_s + extra_s
            slot.set_phase(phase)
            self._set_step(slot, step)
        self._on_change()

    def _step(self, slot: PipelineSlot, text: str) -> None:
        with self._lock:
            self._set_step(slot, text)

    def _set_step(self, slot: PipelineSlot, text: str) -> None:
        now = time.monotonic()
        slot.step, slot.step_started, slot.step_logged = text, now, now
        slot.download = None
        if text:
            log.info("pipeline %s: %s", slot.name, text)

    def _set_download(self, slot: PipelineSlot, what: str, done: int, total: int, rate: float) -> None:
        slot.download = {"artifact": what, "bytes": done, "total": total, "rate_bps": round(rate)}

    def tick(self) -> None:
        """Called every half second: deadlines, retries, and "still ..." log lines for long steps."""
        now = time.monotonic()
        with self._lock:
            for slot in self._slots.values():
                change = slot.change
                if change is not None and change.deadline and now > change.deadline:
                    change.cancel.set()
                    slot.change = None
                    why = (
                        f"{slot.phase} took longer than {self.phase_timeout_s:.0f} s (fleet.phase_timeout_s)"
                    )
                    log.error("pipeline %s: %s; abandoned", slot.name, why)
                    slot.set_phase("failed", why)
                    if slot.pipeline is None:
                        slot.retry_at = now + backoff_delay(slot.attempts, REBUILD_MIN_S, REBUILD_MAX_S)
                    self._on_change()
                elif change is None and slot.retry_at is not None and now >= slot.retry_at:
                    self._begin(slot, slot.desired)
                elif change is not None and slot.step and now - slot.step_logged >= _PHASE_LOG_EVERY_S:
                    slot.step_logged = now
                    log.info("pipeline %s: still %s (%.0f s)", slot.name, slot.step, now - slot.step_started)

    # --- status and health ---------------------------------------------------------------------

    def states(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            slots = list(self._slots.values())
        return {slot.name: slot.to_dict(self.config.fleet.health) for slot in slots}

    def serving_records(self) -> list[dict[str, Any]]:
        """Per running pipeline, the decision its serving stage follows now and what serves it
        (`edge-agent explain` asks the daemon for these: a rollback or a proof on a frame changes
        them, the records written when a stage was built do not)."""
        records = []
        for pipeline in self.pipelines():
            stage = pipeline.stage
            decision = stage.decision()
            if decision is None:
                continue
            records.append(
                {
                    "pipeline": pipeline.name,
                    "model": stage.ref,
                    "decision": decision.to_dict(),
                    "serving": stage.serving(),
                    "live": True,
                }
            )
        return records

    def slots(self) -> list[PipelineSlot]:
        with self._lock:
            return list(self._slots.values())

    def pipelines(self) -> list[Pipeline]:
        with self._lock:
            return [s.pipeline for s in self._slots.values() if s.pipeline is not None]

    def pipeline(self, name: str) -> Pipeline:
        """The running pipeline called `name`; EdgeAgentError when there is none."""
        with self._lock:
            slot = self._slots.get(name)
            if slot is None or slot.pipeline is None:
                known = ", ".join(sorted(n for n, s in self._slots.items() if s.pipeline)) or "none"
                raise EdgeAgentError(f"no running pipeline {name!r} (running: {known})")
            return slot.pipeline

    def restart(self, name: str) -> None:
        """Build the pipeline again from scratch (source reopened, backend chosen again unless cached);
        what ran is stopped first. EdgeAgentError when there is no such pipeline."""
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                raise EdgeAgentError(
                    f"no pipeline {name!r} (known: {', '.join(sorted(self._slots)) or 'none'})"
                )
            if slot.change is not None:
                slot.change.cancel.set()
                slot.change = None
            pipeline, slot.pipeline, slot.running = slot.pipeline, None, None
        log.info("pipeline %s: restarting (asked by a command)", name)
        if pipeline is not None:
            self._stop_pipeline(pipeline)
        with self._lock:
            if self._slots.get(name) is slot and slot.change is None:
                self._begin(slot, slot.desired)
        self._on_change()

    def stall(self) -> str | None:
        """Why the watchdog pings must stop: a pipeline's worker died, or is stuck in one frame
        for longer than its `stall_s`. None while every pipeline makes progress."""
        for p in self.pipelines():
            if p.finished and p.source.state != "finished":
                return f"pipeline {p.name}: its worker thread ended unexpectedly"
            stuck_s, limit_s = p.busy_for_s(), p.config.stall_s
            if stuck_s > limit_s:
                return f"pipeline {p.name}: stuck in one frame for {stuck_s:.0f} s (stall_s: {limit_s:g})"
        return None

    def models_in_use(self) -> set[tuple[str, str]]:
        """Versions the store must keep: what is wanted, what runs, and what a rollback would need."""
        refs = {(p.model.name, p.model.version) for p in self.config.pipelines}
        with self._lock:
            for slot in self._slots.values():
                for d in (slot.desired, slot.running):
                    if d is not None:
                        refs.add((d.config.model.name, d.config.model.version))
                if slot.pipeline is not None:
                    for stage in (slot.pipeline.stage, slot.pipeline.previous_stage):
                        if stage is not None:
                            refs.add((stage.model.name, stage.model.version))
        return refs

    def _prune_store(self) -> None:
        """Keep what `store:` says (the newest versions of each model, size and age limits), never a
        version in use. A failure is logged: serving comes first."""
        limits = self.config.store
        try:
            max_age_s = limits.max_age_days * 86400 if limits.max_age_days is not None else None
            # A pull by `edge-agent models pull` may hold the store: try again after the next start.
            report = self.store.gc(
                self.models_in_use(), limits.keep_versions, limits.max_bytes, max_age_s, wait_s=5.0
            )
        except EdgeAgentError as exc:
            log.warning("model store clean-up failed: %s", exc)
            return
        if report.removed:
            log.info(
                "model store: removed %s (%d bytes freed)",
                ", ".join(f"{r['name']}@{r['version']}" for r in report.removed),
                report.freed_bytes,
            )

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Stop every pipeline (sources first, all at once), finishing the frames in flight."""
        self._stopping.set()
        with self._lock:
            builds = [s.change.thread for s in self._slots.values() if s.change and s.change.thread]
            for slot in self._slots.values():
                if slot.change is not None:
                    slot.change.cancel.set()
            running = self.pipelines()
        # Builds end at their next step; a runtime still loading a model must not be torn down under
        # it at exit (its native threads abort the process). A build stuck in a download is left.
        build_deadline = time.monotonic() + _BUILD_JOIN_S
        for thread in builds:
            thread.join(max(0.0, build_deadline - time.monotonic()))
        for pipeline in running:  # the same for a backend being proven on a frame
            if pipeline.switcher is not None:
                pipeline.switcher.join(max(0.0, build_deadline - time.monotonic()))
        for pipeline in running:
            pipeline.request_stop()
        deadline = time.monotonic() + timeout
        for pipeline in running:
            pipeline.stop(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """Close every stage's session (after `stop`; the final status still shows them)."""
        for pipeline in self.pipelines():
            pipeline.stage.close()
            if pipeline.previous_stage is not None:
                pipeline.previous_stage.close()

    def _stop_pipeline(self, pipeline: Pipeline, close_stage: bool = True) -> None:
        pipeline.stop(_STOP_TIMEOUT_S)
        if close_stage:
            pipeline.stage.close()
            if pipeline.previous_stage is not None:
                pipeline.previous_stage.close()


class VersionMemory:
    """Per pipeline, the last version that was committed and the last one that failed on this box,
    kept in `<state_dir>/pipelines.json`: after a restart a version known to fail here is not tried
    again (its persisted desired state still names it) and the last good one runs instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            data = json.loads(path.read_text())
            self._records: dict[str, dict[str, Any]] = data if isinstance(data, dict) else {}
        except FileNotFoundError:
            self._records = {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            self._records = {}

    def good(self, name: str, desired: DesiredPipeline) -> None:
        # With its secrets (an MQTT source's password): a fallback must be able to log in. The file
        # is the daemon's own (owner-only, like the desired-state documents it comes from).
        config = desired.config.model_dump(mode="json", context={REVEAL_SECRETS: True})
        record = {"config": config, "layer": desired.layer, "generation": desired.generation}
        with self._lock:
            entry = self._records.setdefault(name, {})
            entry["good"] = record
            if entry.get("failed", {}).get("fingerprint") == _fingerprint(desired.config):
                entry.pop("failed")
            self._save()

    def failed(self, name: str, desired: DesiredPipeline, why: str) -> None:
        with self._lock:
            entry = self._records.setdefault(name, {})
            entry["failed"] = {"fingerprint": _fingerprint(desired.config), "reason": why[:500]}
            self._save()

    def fallback_for(self, desired: DesiredPipeline) -> tuple[DesiredPipeline | None, str]:
        """(the last good version, why `desired` failed) when `desired` is the version that failed here
        last; (None, "") otherwise."""
        with self._lock:
            entry = self._records.get(desired.config.name, {})
        failed, good = entry.get("failed"), entry.get("good")
        if not failed or not good or failed.get("fingerprint") != _fingerprint(desired.config):
            return None, ""
        try:
            config = PipelineConfig.model_validate(good["config"])
        except (ValidationError, KeyError, TypeError) as exc:
            log.warning(
                "%s: the last good version of %s is unreadable: %s", self.path, desired.config.name, exc
            )
            return None, ""
        return DesiredPipeline(config, good.get("layer", "yaml"), good.get("generation")), str(
            failed.get("reason")
        )

    def _save(self) -> None:
        try:
            atomic_write_bytes(self.path, json.dumps(self._records, indent=2).encode())
        except OSError as exc:  # the daemon serves on; only a restart's memory is lost
            log.warning("cannot write %s: %s", self.path, exc)


def _fingerprint(config: PipelineConfig) -> str:
    # Secrets included: a version whose only change is a corrected password is a new version.
    dump = config.model_dump(mode="json", context={REVEAL_SECRETS: True})
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()


def _unhealthy(
    stage: Stage, health: HealthWindowConfig, latency_before_ms: float | None, final: bool
) -> str | None:
    """Why the stage fails its health window so far (None: fine). Error rate and NaN are judged as
    frames come; too few frames and latency only at the window's end."""
    stats = stage.stats
    if (
        stats.frames
        and stats.errors / stats.frames > health.max_error_rate
        and stats.frames >= health.min_frames
    ):
        return (
            f"{stats.errors} of {stats.frames} frames failed (over max_error_rate {health.max_error_rate:g})"
            + (f"; last: {stats.last_error}" if stats.last_error else "")
        )
    if health.nan_is_failure and stats.nan_outputs:
        return f"{stats.nan_outputs} of {stats.inferences} inferences gave NaN or infinite outputs"
    if not final:
        return None
    if stats.frames < health.min_frames:
        return f"only {stats.frames} frame(s) in {health.window_s:g} s (min_frames {health.min_frames})"
    if stats.inferences < _MIN_INFERENCES_FOR_LATENCY:
        return None  # too few to tell a slower model from a busy moment
    median = stats.median_latency_ms()
    if median is not None and health.max_latency_ms is not None and median > health.max_latency_ms:
        return f"median inference {median:.1f} ms over max_latency_ms {health.max_latency_ms:g}"
    if median is not None and latency_before_ms and median > latency_before_ms * health.max_latency_ratio:
        return (
            f"median inference {median:.1f} ms, {median / latency_before_ms:.1f}x the previous version's "
            f"{latency_before_ms:.1f} ms (max_latency_ratio {health.max_latency_ratio:g})"
        )
    return None


def _ref(config: PipelineConfig) -> str:
    return f"{config.model.name}@{config.model.version}"
