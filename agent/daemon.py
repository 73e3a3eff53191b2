"""The daemon: pipelines up, results out through the outbox, a clean stop.

Lifecycle: open the outbox and start MQTT (a broker that is down is retried in the
background while results queue up), build every pipeline (pull the model, pick a backend,
warm it up), run until asked to stop, then stop sources, finish the frames in flight,
flush the outbox as far as the broker allows and publish `offline`.

A pipeline that cannot be built (bad model file, unreachable registry, unknown input) is
reported in the status and retried with backoff; the others run on.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent import __version__
from agent.backend_choice import DecisionSwitcher, choose_and_load, make_prover, policy_for
from agent.clock import iso_utc
from agent.config import AgentConfig, PipelineConfig
from agent.errors import EdgeAgentError, ModelError, RegistryError
from agent.fsutil import atomic_write_bytes
from agent.model_hints import embedded_hints, with_model_hints
from agent.mqtt import MqttConnection, Outbox, OutboxMessage, results_topic, telemetry_topic
from agent.pipeline import LoadedModel, Pipeline
from agent.registry import open_registry, public_url
from agent.retry import backoff_delay
from agent.sd_notify import notify, watchdog_interval_s
from agent.session_pool import SessionPool
from agent.store import ModelStore, Progress, store_for
from agent.telemetry import TelemetrySampler
from providers import BackendError
from providers.select import SelectionPolicy

log = logging.getLogger(__name__)

_STATUS_FILE_EVERY_S = 5.0
_REBUILD_MIN_S = 10.0
_REBUILD_MAX_S = 600.0
_BUILDER_JOIN_S = 5.0  # a build stuck in a download must not eat the stop budget
_STOP_PIPELINES_S = 10.0
# A pipeline stuck this long in one frame (a hung driver, a blocked read) stops the watchdog pings.
_STALL_S = 120.0
# A build step this long (a TensorRT engine build can take many minutes) is logged again meanwhile.
_PHASE_LOG_EVERY_S = 30.0


# Results are serialised with this placeholder; the publisher swaps in the real send time.
# JSON escapes quotes inside strings, so these exact bytes can only be our key.
_PUBLISHED_AT_PLACEHOLDER = b'"published_at":null'


def stamp_published_at(message: OutboxMessage) -> bytes:
    """The payload as sent: `published_at` set to now (results only; other messages unchanged)."""
    stamp = b'"published_at":"' + iso_utc(time.time()).encode() + b'"'
    return message.payload.replace(_PUBLISHED_AT_PLACEHOLDER, stamp, 1)


class ResultWriter:
    """The pipelines' sink: completes each result and writes it to the outbox."""

    def __init__(self, config: AgentConfig, outbox: Outbox, on_written: Callable[[], None]) -> None:
        self.config = config
        self.outbox = outbox
        self.on_written = on_written

    def submit(self, pipeline: str, result: dict[str, Any]) -> None:
        produced = time.time()
        message = {
            "id": str(uuid.uuid4()),
            "device": self.config.device.id,
            "pipeline": pipeline,
            "seq": self.outbox.next_sequence(f"results/{pipeline}"),
            "captured_at": iso_utc(result.pop("captured_at")),
            "produced_at": iso_utc(produced),
            "published_at": None,  # set when sent: see stamp_published_at
            **result,
        }
        topic = results_topic(self.config.mqtt.topic_prefix, self.config.device.id, pipeline)
        # allow_nan=False: NaN is not JSON; a model emitting it fails the frame (counted), not the reader.
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        limit = self.config.mqtt.max_payload_bytes
        if len(payload) > limit:
            raise ModelError(
                f"result of {len(payload)} bytes is over mqtt.max_payload_bytes ({limit}); "
                "lower postprocess.max_values or raise the limit"
            )
        self.outbox.put(topic, payload, qos=1)
        self.on_written()


@dataclass
class PipelineSlot:
    """A configured pipeline: running, or failed to build and waiting to be retried."""

    config: PipelineConfig
    pipeline: Pipeline | None = None
    error: str | None = None
    attempts: int = 0
    retry_at: float = 0.0
    # While it is being built: what it is doing (pulling, a backend trial, compiling an engine).
    phase: str = ""
    phase_started: float = 0.0  # monotonic
    phase_logged: float = 0.0  # monotonic: when "still ..." was last logged
    # While a model file downloads: {"artifact", "bytes", "total", "rate_bps"} (status.json only).
    download: dict[str, Any] | None = None


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


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.started_at = time.time()
        self.store = store_for(config)  # first: a trusted key that cannot be loaded stops the start here
        self.registry_link = RegistryLink(config.registry.url if config.registry else None)
        state_dir = config.state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            self.outbox = Outbox(state_dir / "outbox.sqlite", config.mqtt.outbox.max_messages)
        except (OSError, sqlite3.Error) as exc:
            raise EdgeAgentError(
                f"cannot use state_dir {state_dir}: {exc}",
                hint="it must be a writable directory (under systemd: StateDirectory=edge-agent)",
            ) from exc
        # Pipelines on the same model and backend share one session (and batch, when that is faster).
        selection = config.backends
        self.telemetry = TelemetrySampler(config.device.id, state_dir)
        self.telemetry_skipped = 0  # reports not sent since the last one that was (broker away)
        self.sessions = SessionPool(
            selection.batching,
            selection.max_batch,
            SelectionPolicy(rtol=selection.rtol, atol=selection.atol, max_mismatch=selection.max_mismatch),
        )
        self.mqtt = MqttConnection(
            config.mqtt,
            config.device.id,
            self.outbox,
            birth_payload=lambda: self._status_payload("online"),
            offline_payload=lambda: self._status_payload("offline"),
            prepare_payload=stamp_published_at,
        )
        self.writer = ResultWriter(config, self.outbox, self.mqtt.notify_new_message)
        self.slots = [PipelineSlot(p) for p in config.pipelines if p.enabled]
        self._last_states: dict[str, tuple[str, str]] = {}

    # --- lifecycle ---------------------------------------------------------------------

    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        """Run until `stop` is set (SIGTERM/SIGINT) or `duration_s` passes."""
        deadline = None if duration_s is None else time.monotonic() + duration_s
        self.mqtt.start()
        # Pipelines are built off the main thread: a slow model pull must not hold back
        # READY, the watchdog or the status of the pipelines that already run.
        builder = threading.Thread(
            target=self._builder_main, args=(stop,), name="pipeline-builder", daemon=True
        )
        builder.start()
        notify("READY=1", f"STATUS={self._summary()}")
        log.info("edge-agent %s running as %s", __version__, self.config.device.id)
        watchdog = watchdog_interval_s()
        next_status_file = 0.0
        telemetry_every = self.config.telemetry.interval_s
        next_telemetry = time.monotonic() + telemetry_every  # the first after one interval: rates need one
        try:
            while not stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    log.info("run duration reached, stopping")
                    break
                self._report_state_changes()
                self._log_long_phases(now)
                if now >= next_status_file:
                    self.write_status_file()
                    next_status_file = now + _STATUS_FILE_EVERY_S
                if telemetry_every and now >= next_telemetry:
                    self.publish_telemetry()
                    next_telemetry = now + telemetry_every
                if watchdog is not None and self._healthy():
                    notify("WATCHDOG=1")
                wait = 0.5 if watchdog is None else min(0.5, watchdog)
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                stop.wait(wait)
        finally:
            stop.set()
            builder.join(_BUILDER_JOIN_S)
            self.shutdown()

    def _builder_main(self, stop: threading.Event) -> None:
        """Build every pipeline, then retry the failed ones with backoff until stopped."""
        while not stop.is_set():
            now = time.monotonic()
            for slot in self.slots:
                if stop.is_set():
                    return
                if slot.pipeline is None and now >= slot.retry_at:
                    try:
                        self._try_build(slot, stop)
                    except Exception:  # the builder must outlive any one pipeline's trouble
                        log.exception("pipeline %s: unexpected error while building", slot.config.name)
                        slot.retry_at = time.monotonic() + _REBUILD_MAX_S
            stop.wait(0.5)

    def shutdown(self) -> None:
        notify("STOPPING=1", "STATUS=stopping")
        log.info("stopping: finishing in-flight frames")
        running = [slot.pipeline for slot in self.slots if slot.pipeline is not None]
        for pipeline in running:  # all sources at once, then wait for all against one deadline
            pipeline.request_stop()
        deadline = time.monotonic() + _STOP_PIPELINES_S
        for pipeline in running:
            pipeline.stop(max(0.1, deadline - time.monotonic()))
        timeout = self.config.mqtt.outbox.flush_timeout_s
        if self.outbox.pending():
            log.info("flushing %d queued results (up to %.0f s)", self.outbox.pending(), timeout)
        flushed = self.mqtt.flush(timeout)
        left = self.outbox.pending()
        if not flushed and left:
            log.warning("%d results stay queued in the outbox; they are sent on the next start", left)
        self.write_status_file()
        self.mqtt.stop(publish_offline=True)
        for slot in self.slots:
            if slot.pipeline is not None:
                slot.pipeline.model.session.close()
        self.outbox.close()
        log.info("stopped")

    # --- pipelines ---------------------------------------------------------------------

    def _set_phase(self, slot: PipelineSlot, text: str) -> None:
        """What a pipeline being built does now: logged, and shown in the status until it runs."""
        now = time.monotonic()
        slot.phase, slot.phase_started, slot.phase_logged = text, now, now
        slot.download = None
        if text:
            log.info("pipeline %s: %s", slot.config.name, text)

    def _set_download(self, slot: PipelineSlot, what: str, done: int, total: int, rate: float) -> None:
        slot.download = {"artifact": what, "bytes": done, "total": total, "rate_bps": round(rate)}

    def _log_long_phases(self, now: float) -> None:
        for slot in self.slots:
            if slot.phase and now - slot.phase_logged >= _PHASE_LOG_EVERY_S:
                slot.phase_logged = now
                log.info(
                    "pipeline %s: still %s (%.0f s)", slot.config.name, slot.phase, now - slot.phase_started
                )

    def _try_build(self, slot: PipelineSlot, stop: threading.Event) -> None:
        config = slot.config
        slot.attempts += 1
        try:
            pipeline = self._build(
                config,
                verify=slot.attempts > 1,
                progress=lambda t: self._set_phase(slot, t),
                download=lambda what, done, total, rate: self._set_download(slot, what, done, total, rate),
            )
        except Exception as exc:  # whatever a model or source does wrong, the daemon runs on
            self._set_phase(slot, "")
            delay = backoff_delay(slot.attempts, _REBUILD_MIN_S, _REBUILD_MAX_S)
            slot.error, slot.retry_at = str(exc), time.monotonic() + delay
            expected = isinstance(exc, (EdgeAgentError, BackendError, OSError))
            log.error(
                "pipeline %s not started: %s (retry in %.0f s)",
                config.name,
                exc,
                delay,
                exc_info=not expected,
            )
            return
        self._set_phase(slot, "")
        if stop.is_set():  # built while the daemon was asked to stop: do not start it
            pipeline.model.session.close()
            return
        slot.error = None
        pipeline.start()
        slot.pipeline = pipeline
        log.info("pipeline %s started", config.name)
        self._prune_store()

    def _prune_store(self) -> None:
        """Keep what `store:` says (the newest versions of each model, size and age limits), never a
        version a configured pipeline names. A failure is logged: serving comes first."""
        limits = self.config.store
        in_use = {(p.model.name, p.model.version) for p in self.config.pipelines}
        try:
            max_age_s = limits.max_age_days * 86400 if limits.max_age_days is not None else None
            # A pull by `edge-agent models pull` may hold the store: try again after the next start.
            report = self.store.gc(in_use, limits.keep_versions, limits.max_bytes, max_age_s, wait_s=5.0)
        except EdgeAgentError as exc:
            log.warning("model store clean-up failed: %s", exc)
            return
        if report.removed:
            log.info(
                "model store: removed %s (%d bytes freed)",
                ", ".join(f"{r['name']}@{r['version']}" for r in report.removed),
                report.freed_bytes,
            )

    def _build(
        self,
        config: PipelineConfig,
        verify: bool = False,
        progress: Callable[[str], None] | None = None,
        download: Progress | None = None,
    ) -> Pipeline:
        say = progress or (lambda _text: None)
        model = config.model
        if model.path is not None:
            say(f"importing {model.path}")
            installed = self.store.import_file(model.path, model.name, model.version)
        else:
            assert self.config.registry is not None  # the config model requires it for registry models
            say(f"pulling {model.name}@{model.version}")
            asks_registry = not self.store.is_installed(model.name, model.version)
            registry = open_registry(self.config.registry.url, self.config.registry)
            try:
                # After a failure, re-hash the installed blobs: a bit-rotted file of the right size
                # would otherwise fail to load for ever. The first attempt trusts sizes (fast start).
                installed = self.store.pull(
                    registry, model.name, model.version, verify=verify, progress=download, digest=model.digest
                )
            except RegistryError as exc:
                self.registry_link.failed(registry.url, exc, self.store)
                raise
            finally:
                registry.close()
            if asks_registry:
                self.registry_link.reached(registry.url)
        # Preprocessing, state and labels the version ships (manifest), then the file's own metadata.
        config = with_model_hints(config, installed.manifest, embedded_hints(installed.model_artifacts()))
        session, decision, candidates = choose_and_load(
            self.config,
            config,
            installed.model_artifacts(),
            installed.ref,
            installed.testdata_artifacts(),
            progress=progress,
            load=self.sessions.load,
        )
        log.info("pipeline %s: %s", config.name, decision.explain())
        loaded = LoadedModel(installed.name, installed.version, decision.artifact_sha256, session, decision)
        try:
            pipeline = Pipeline(config, loaded, self.writer)
            say(f"warming up on {session.backend}")
            pipeline.warm_up()
            policy = policy_for(self.config, config)
            prove = None
            if policy.benchmark and not decision.checked:  # no sample at build time: a frame will do
                prove = make_prover(
                    self.config, config, candidates, installed.ref, installed.testdata_artifacts()
                )
            pipeline.switcher = DecisionSwitcher(
                decision, candidates, policy, warm_up=pipeline.feeder.warm_up_feeds(), prove=prove
            )
        except Exception:
            session.close()
            raise
        return pipeline

    # --- status ------------------------------------------------------------------------

    def pipeline_states(self) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {}
        for slot in self.slots:
            if slot.pipeline is not None:
                states[slot.config.name] = slot.pipeline.status()
            else:
                state = "error" if slot.error else "starting"
                states[slot.config.name] = {"state": state, "error": slot.error, "attempts": slot.attempts}
                if slot.phase:
                    states[slot.config.name]["phase"] = slot.phase
                    states[slot.config.name]["phase_s"] = round(time.monotonic() - slot.phase_started, 1)
                if slot.download is not None:
                    states[slot.config.name]["download"] = dict(slot.download)
        return states

    def _status_payload(self, state: str) -> bytes:
        payload: dict[str, Any] = {
            "status": state,
            "device": self.config.device.id,
            "agent_version": __version__,
            "hostname": socket.gethostname(),
            "timestamp": iso_utc(time.time()),
        }
        if state == "online":
            payload["started_at"] = iso_utc(self.started_at)
            payload["registry"] = self.registry_link.to_dict()
            payload["pipelines"] = {
                name: {
                    "state": s["state"],
                    "error": s.get("error"),
                    **({"phase": s["phase"]} if "phase" in s else {}),
                }
                for name, s in self.pipeline_states().items()
            }
        return json.dumps(payload, separators=(",", ":")).encode()

    def _report_state_changes(self) -> None:
        """A pipeline's new state, or a new step while it is built, goes out in the MQTT status."""
        states = {name: (s["state"], s.get("phase", "")) for name, s in self.pipeline_states().items()}
        if states != self._last_states:
            self._last_states = states
            notify(f"STATUS={self._summary()}")
            self.mqtt.publish_status_now()

    def _summary(self) -> str:
        states = self.pipeline_states()
        running = sum(1 for s in states.values() if s["state"] == "running")
        return f"{running}/{len(states)} pipelines running, {self.outbox.pending()} results queued"

    def _healthy(self) -> bool:
        """Watchdog pings stop when a pipeline's worker died or is stuck in one frame."""
        for slot in self.slots:
            p = slot.pipeline
            if p is None:
                continue
            if p.finished and p.source.state != "finished":
                log.error("pipeline %s: worker thread ended unexpectedly", p.name)
                return False
            stuck_s = p.busy_for_s()
            if stuck_s > _STALL_S:
                log.error("pipeline %s: stuck in one frame for %.0f s", p.name, stuck_s)
                return False
        return True

    def status(self) -> dict[str, Any]:
        return {
            "device": self.config.device.id,
            "agent_version": __version__,
            "pid": os.getpid(),
            "started_at": iso_utc(self.started_at),
            "updated_at": iso_utc(time.time()),
            "mqtt": self.mqtt.stats(),
            "outbox": self.outbox.stats(),
            "sessions": self.sessions.stats(),
            "telemetry": {
                "interval_s": self.config.telemetry.interval_s,
                "skipped_while_offline": self.telemetry_skipped,
            },
            "registry": self.registry_link.to_dict(),
            "store": {"installed": [m.ref for m in self.store.list()]},
            "pipelines": self.pipeline_states(),
        }

    def publish_telemetry(self) -> None:
        """One telemetry report; skipped (and counted) while the broker is away."""
        try:
            report = self.telemetry.sample(self.pipeline_states(), self.outbox.stats(), self.mqtt.stats())
            report["skipped_while_offline"] = self.telemetry_skipped
            payload = json.dumps(report, separators=(",", ":"), default=str).encode()
        except Exception:  # health reporting must never take the daemon down
            log.exception("could not build the telemetry report")
            return
        topic = telemetry_topic(self.config.mqtt.topic_prefix, self.config.device.id)
        if self.mqtt.publish_snapshot(topic, payload):
            self.telemetry_skipped = 0
        else:
            self.telemetry_skipped += 1

    def write_status_file(self) -> None:
        """state_dir/status.json, for people and scripts on the box."""
        path = self.config.state_dir / "status.json"
        try:
            # Rewritten every few seconds: skip fsync, which would wear out flash storage.
            data = json.dumps(self.status(), indent=2, default=str).encode()
            atomic_write_bytes(path, data, durable=False)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)
