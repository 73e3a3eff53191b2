"""Building one version's stage on its own thread: pulled (or imported), proven on this box, loaded
and warmed; and the phases (with deadlines) a build goes through."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.backend_choice import DecisionSwitcher, check_on_testdata, choose_and_load, make_prover
from agent.config import AgentConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import RegistryError
from agent.model_hints import embedded_hints, with_model_hints
from agent.pipeline import Pipeline
from agent.registry import open_registry
from agent.session_pool import SessionPool
from agent.sources import Frame, Slot, Source
from agent.stage import LoadedModel, Stage
from agent.store import ModelStore, Progress
from agent.supervisor.state import Cancelled, PipelineSlot, RegistryLink, _Change, unreachable

log = logging.getLogger(__package__)  # the package's logger, as before it was split


class StageBuilder:
    """The build of a stage and its phases: the part of `Supervisor` a build thread runs."""

    config: AgentConfig
    store: ModelStore
    sessions: SessionPool
    registry_link: RegistryLink
    phase_timeout_s: float
    _lock: threading.RLock
    _stopping: threading.Event
    _on_change: Callable[[], None]
    _slots: dict[str, PipelineSlot]
    _begin: Callable[[PipelineSlot, DesiredPipeline], None]

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

    # --- phases, deadlines, retries -----------------------------------------------------------

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
        if retried:
            self._on_change()
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
