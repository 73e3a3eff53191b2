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
(the old version serves) until the desired state changes. A config reload retries every failed
pipeline at once, and so does the registry answering again for those that could not reach it
(`retry_failed`).

The package: `state` (ApplyReport, PipelineSlot, the Change in flight, RegistryLink), `building` (the
`StageBuilder` the supervisor holds: a stage pulled, proven, loaded and warmed), `health` (the health
window's verdict), `memory` (versions known good or failed here); the `Supervisor` here brings
changes in, rolls back, retries, ticks, reports and stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from agent.config import AgentConfig, HealthWindowConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import EdgeAgentError, RegistryError
from agent.pipeline import Pipeline, ResultSink
from agent.registry import open_registry
from agent.retry import backoff_delay
from agent.session_pool import SessionPool
from agent.sources import BrokerLink, Slot, Source, is_live, open_source
from agent.stage import Stage, changes_only_attributes, changes_only_reporting
from agent.status import PipelineStatus
from agent.store import ModelStore
from agent.supervisor.building import StageBuilder, peek_for
from agent.supervisor.health import watch, window_length_s
from agent.supervisor.memory import VersionMemory
from agent.supervisor.state import (
    ApplyReport,
    Cancelled,
    Change,
    PipelineSlot,
    RegistryLink,
    model_ref,
    unreachable,
)
from providers import BackendError

log = logging.getLogger(__name__)

REBUILD_MIN_S = 10.0
REBUILD_MAX_S = 600.0
_SWAP_TIMEOUT_S = 10.0  # the worker swaps between two frames: a frame that takes longer is stuck
_STOP_TIMEOUT_S = 10.0
_BUILD_JOIN_S = 5.0  # a build stuck in a download must not eat the stop budget
# A build step this long (a TensorRT engine build can take many minutes) is logged again meanwhile.
_PHASE_LOG_EVERY_S = 30.0


__all__ = [
    "REBUILD_MAX_S",
    "REBUILD_MIN_S",
    "ApplyReport",
    "Cancelled",
    "PipelineSlot",
    "RegistryLink",
    "Supervisor",
    "VersionMemory",
]


class Supervisor:
    def __init__(
        self,
        config: AgentConfig,
        store: ModelStore,
        sessions: SessionPool,
        sink: ResultSink,
        broker: BrokerLink | None = None,
    ) -> None:
        """`sink`: where every pipeline's results go; `broker`: the daemon's MQTT link, for sources
        that read sensors from it."""
        self.config = config
        self.store = store
        self.sink = sink
        self.broker = broker
        self.registry_link = RegistryLink(
            config.registry.url if config.registry else None,
            back=lambda: self.retry_failed("the registry answers again", waiting_on_registry=True),
        )
        self.builder = StageBuilder(store, sessions, self.registry_link, lambda: self.config)
        self._lock = threading.RLock()
        self._slots: dict[str, PipelineSlot] = {}
        self._stopping = threading.Event()
        self.phase_timeout_s = config.fleet.phase_timeout_s
        self.memory = VersionMemory(config.state_dir / "pipelines.json")

    def use_config(self, config: AgentConfig) -> None:
        """A reloaded config (only its reloadable settings differ): builds and the health window read it."""
        self.config = config

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
        return report

    def _start_new(self, slot: PipelineSlot, want: DesiredPipeline) -> None:
        """A version that failed here before a restart is not tried again: the last good one runs."""
        good, why = self.memory.fallback_for(want)
        if good is None:
            self._begin(slot, want)
            return
        failed, last_good = model_ref(want.config), model_ref(good.config)
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
        change = Change(slot, desired, self._lock, self._stopping, self.phase_timeout_s, note=note)
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

    def _bring_in(self, slot: PipelineSlot, change: Change) -> None:
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
            if (
                keeps_source
                and running is not None
                and changes_only_reporting(running.stage.config, desired.config)
            ):
                # New zones, lines, tracking or report rules on the same model: no pull, no proof, no
                # reload (a TensorRT engine build takes minutes); the stage takes the new config.
                stage = running.stage.with_config(desired.config)
                change.phase("building", "the same model with new reporting settings")
            elif (
                keeps_source
                and running is not None
                and changes_only_attributes(running.stage.config, desired.config)
            ):
                # Only second models changed: they are pulled and proven; the primary model serves on,
                # its session shared (a rollback of a second model never touches it).
                peek = peek_for(running, None)
                attributes = self.builder.attributes_for(
                    desired.config, change, peek, verify=slot.attempts > 1
                )
                stage = running.stage.with_attributes(desired.config, attributes)
                change.phase("building", "the same model with new second models")
            else:
                peek = peek_for(running if keeps_source else None, source)
                stage = self.builder.build(
                    desired.config, change, peek, first=running is None, verify=slot.attempts > 1
                )
            change.phase("building", "starting the new version")
            if keeps_source and running is not None:
                if not running.stages.swap_in(stage, _SWAP_TIMEOUT_S):
                    raise EdgeAgentError(
                        f"the running pipeline did not take the new stage in {_SWAP_TIMEOUT_S:.0f} s"
                    )
                pipeline = running
                change.swapped_in, stage = stage, None  # the pipeline owns it now
            else:
                pipeline = Pipeline(desired.config, stage, self.sink, source=source)
                stage, source = None, None  # the pipeline owns them now
                with self._lock:
                    change.check()
                    previous, slot.pipeline = slot.pipeline, pipeline
                    change.new_pipeline = True
                if previous is not None:  # a changed source: the old pipeline stops as the new one starts
                    self._stop_pipeline(previous, close_stage=False)
                    pipeline.stages.previous = previous.stage  # warm, for a rollback
                pipeline.start()
            if desired.health is not None and not self._health_check(slot, change, pipeline, desired.health):
                return  # rolled back (or stopped, when there was nothing to go back to)
            self._commit(slot, change, pipeline)
        except Cancelled:
            log.info("pipeline %s: change to %s abandoned", slot.name, model_ref(desired.config))
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
                live.stages.roll_back(_SWAP_TIMEOUT_S)
        except Exception as exc:  # whatever a model or source does wrong, the daemon runs on
            self._failed(slot, change, exc)
        finally:
            if stage is not None:
                stage.close()
            if source is not None:
                source[0].stop(timeout=5)

    def _health_check(
        self, slot: PipelineSlot, change: Change, pipeline: Pipeline, health: HealthWindowConfig
    ) -> bool:
        """Watch the new stage on live frames for the window (agent/supervisor/health.py); False
        (rolled back) when it fails."""
        watching = f"watching {pipeline.stage.chain} for {health.window_s:.0f} s"
        change.phase("health-check", watching, extra_s=window_length_s(health))
        problem = watch(pipeline, health, change.cancel)
        if problem is None:
            return True
        with self._lock:
            if change.cancel.is_set():
                raise Cancelled()
        self._roll_back(slot, change, pipeline, f"{pipeline.stage.chain} failed its health window: {problem}")
        return False

    def _roll_back(self, slot: PipelineSlot, change: Change, pipeline: Pipeline, why: str) -> None:
        """Back to the version that ran before (`rolled-back`), or stopped when there was none (`failed`)."""
        log.error("pipeline %s: %s; rolling back", slot.name, why)
        self.memory.failed(slot.name, change.desired, why)
        if not change.new_pipeline and pipeline.stages.roll_back(_SWAP_TIMEOUT_S):
            with self._lock:
                slot.change = None
                slot.set_phase("rolled-back", why)
            return
        # A new pipeline (changed source, or the first version): stop it; restart the old one if any.
        old_stage, running = pipeline.stages.previous, slot.running
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

    def _commit(self, slot: PipelineSlot, change: Change, pipeline: Pipeline) -> None:
        with self._lock:
            if change.cancel.is_set():
                raise Cancelled()
            pipeline.stages.commit()
            first = slot.running is None
            slot.running = change.desired
            slot.change = None
            if change.note:
                slot.set_phase("rolled-back", change.note)
            else:
                slot.set_phase("running")
        self.memory.good(slot.name, change.desired)
        backend, ref = pipeline.stage.running_on()[0], pipeline.stage.chain
        if first:
            log.info("pipeline %s started: %s on %s", slot.name, ref, backend)
        else:
            log.info("pipeline %s: now running %s on %s", slot.name, ref, backend)
        self._prune_store()

    def _failed(self, slot: PipelineSlot, change: Change, exc: Exception) -> None:
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
                    model_ref(change.desired.config),
                    exc,
                    running,
                    exc_info=not expected,
                )

    def tick(self) -> None:
        """Called every half second: deadlines, retries, "still ..." log lines for long steps, and a
        probe of a registry that pipelines wait on (probe_registry)."""
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
                elif change is None and slot.retry_at is not None and now >= slot.retry_at:
                    self._begin(slot, slot.desired)
                elif change is not None and slot.step and now - slot.step_logged >= _PHASE_LOG_EVERY_S:
                    slot.step_logged = now
                    log.info("pipeline %s: still %s (%.0f s)", slot.name, slot.step, now - slot.step_started)
        self.probe_registry()

    # --- retries -------------------------------------------------------------------------------

    def retry_failed(self, why: str, waiting_on_registry: bool = False) -> list[str]:
        """Start again at once every pipeline whose last change failed (one that never ran, waiting
        for its backoff slot, or an upgrade that did not come in), rather than at its next slot;
        `waiting_on_registry`: only those that failed because the registry could not be reached.
        A rollback (the version failed its health window) is not retried. Returns their names."""
        retried = []
        with self._lock:
            if self._stopping.is_set():
                return []
            for slot in self._slots.values():
                if slot.change is not None or slot.phase != "failed":
                    continue
                if waiting_on_registry and not unreachable(slot.reason):
                    continue
                log.info("pipeline %s: %s; retrying it now", slot.name, why)
                self._begin(slot, slot.desired)
                retried.append(slot.name)
        return retried

    def probe_registry(self) -> None:
        """While the registry is unreachable and a pipeline failed waiting on it, ask it now and then
        (REGISTRY_PROBE_S) for that pipeline's manifest: its return then retries them at once
        (RegistryLink.reached), without a pull or a reload to notice it first."""
        registry_config = self.config.registry
        if registry_config is None or not self.registry_link.probe_due():
            return
        with self._lock:
            waiting = [
                slot.desired.config.model
                for slot in self._slots.values()
                if slot.change is None and slot.phase == "failed" and unreachable(slot.reason)
            ]
        model = next((m for m in waiting if m.path is None), None)
        if model is None:
            return

        def ask() -> None:
            registry = open_registry(registry_config.url, registry_config)
            try:
                registry.fetch_manifest(model.name, model.version)
            except RegistryError as exc:
                self.registry_link.failed(registry.url, exc, self.store)
            else:
                self.registry_link.reached(registry.url)
            finally:
                registry.close()

        self.registry_link.probe(ask)

    # --- status and health ---------------------------------------------------------------------

    def states(self) -> dict[str, PipelineStatus]:
        with self._lock:
            slots = list(self._slots.values())
        return {slot.name: slot.status(self.config.fleet.health) for slot in slots}

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
                    "serving": stage.serving().to_json(),
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
        refs = {(m.name, m.version) for p in self.config.pipelines for m in p.models}
        with self._lock:
            for slot in self._slots.values():
                for d in (slot.desired, slot.running):
                    if d is not None:
                        refs |= {(m.name, m.version) for m in d.config.models}
                if slot.pipeline is not None:
                    for stage in (slot.pipeline.stage, slot.pipeline.stages.previous):
                        if stage is not None:
                            refs.add((stage.model.name, stage.model.version))
                            refs |= {(m.name, m.version) for m in stage.config.models[1:]}
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
            if pipeline.stage.switcher is not None:
                pipeline.stage.switcher.join(max(0.0, build_deadline - time.monotonic()))
        for pipeline in running:
            pipeline.request_stop()
        deadline = time.monotonic() + timeout
        for pipeline in running:
            pipeline.stop(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """Close every stage's session (after `stop`; the final status still shows them)."""
        for pipeline in self.pipelines():
            pipeline.stage.close()
            if pipeline.stages.previous is not None:
                pipeline.stages.previous.close()

    def _stop_pipeline(self, pipeline: Pipeline, close_stage: bool = True) -> None:
        pipeline.stop(_STOP_TIMEOUT_S)
        if close_stage:
            pipeline.stage.close()
            if pipeline.stages.previous is not None:
                pipeline.stages.previous.close()
