"""The daemon: pipelines up, results out through the outbox, a clean stop.

Lifecycle: open the outbox and start MQTT (a broker that is down is retried in the
background while results queue up), hand the pipelines to the supervisor (agent/supervisor/:
each is pulled, proven on this box and warmed on a thread of its own), run until asked to stop,
then stop sources, finish the frames in flight, flush the outbox as far as the broker allows and
publish `offline`.

A pipeline that cannot be built (bad model file, unreachable registry, unknown input) is
reported in the status and retried with backoff; the others run on. SIGHUP reloads the config
(agent/reload.py): only what changed is applied, an invalid file is refused and the old one runs on.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import __version__
from agent.clock import iso_utc
from agent.config import AgentConfig
from agent.control import ControlServer, socket_path
from agent.daemon_ticks import Contained, Every, OutageSummary, StateChanges, Tickable, Watchdog
from agent.errors import ConfigError, EdgeAgentError
from agent.event_index import FILE_NAME as EVENT_INDEX_FILE
from agent.event_index import EventIndex
from agent.events import EventWriter, TrackJournal
from agent.fleet.commands import CommandServer, RecentLogs
from agent.fleet.device_commands import device_handlers
from agent.fleet.reconciler import Reconciler, generation_outcomes
from agent.fsutil import InstanceLock, atomic_write_bytes
from agent.home_automation import HomeAutomation
from agent.mqtt import MqttConnection, Outbox, telemetry_topic
from agent.mqtt.router import Router
from agent.processing.preprocess import keep_opencv_serial
from agent.reload import LastGoodConfig, LoadedConfig, plan_reload, sha256_text, with_hot_settings
from agent.results import ResultWriter, stamp_published_at
from agent.sd_notify import notify
from agent.self_update import RESTART_EXIT_CODE, Updater, releases_dir
from agent.session_pool import SessionPool
from agent.snapshots import SnapshotStore
from agent.sources import BrokerLink
from agent.status import PipelineStatus, statuses_json
from agent.store import store_for
from agent.supervisor import Supervisor
from agent.telemetry import TelemetrySampler
from agent.web.server import WebServer
from agent.web.site import Site, pages_of
from providers.select import SelectionPolicy

log = logging.getLogger(__name__)

_STATUS_FILE_EVERY_S = 5.0
_STOP_PIPELINES_S = 10.0


def hold_state_dir(state_dir: Path) -> InstanceLock:
    """One daemon per state dir: `state_dir/agent.lock`, held for the daemon's life. A second daemon
    on it would share the outbox and the broker session (they kick each other off the broker and
    send duplicates), so it stops at once, naming the running one's pid."""
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return InstanceLock(
            state_dir / "agent.lock",
            f"another edge-agent (pid {{pid}}) is already running on state_dir {state_dir} (it holds "
            "{lock})",
            hint="one daemon per state_dir: stop that one first (systemctl stop edge-agent, or kill "
            "{pid}), or give this one a state_dir of its own",
        )
    except OSError as exc:
        raise EdgeAgentError(
            f"cannot use state_dir {state_dir}: {exc}",
            hint="it must be a writable directory (under systemd: StateDirectory=edge-agent)",
        ) from exc


def keep_state_dir_private(state_dir: Path) -> None:
    """The state dir holds results, the broker session's outbox and desired-state documents (which
    may carry passwords): owner only. `edge-agent run` creates what it writes with umask 077; this
    takes group and other access away from the dir and anything already in it (an older agent's
    files, a dir made by hand or by StateDirectoryMode=0750), saying what it fixed. Symbolic links
    are left alone; what cannot be changed is named in a warning, and the daemon runs on."""
    fixed: list[str] = []
    failed: list[str] = []
    was = 0

    def fix(path: Path) -> None:
        nonlocal was
        try:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                return
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
        except FileNotFoundError:
            return  # removed meanwhile
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
            return
        if path == state_dir:
            was = stat.S_IMODE(st.st_mode)
        else:
            fixed.append(str(path.relative_to(state_dir)))

    fix(state_dir)
    for root, dirs, files in os.walk(state_dir, onerror=lambda exc: failed.append(str(exc))):
        for name in (*dirs, *files):
            fix(Path(root) / name)
    if was or fixed:
        shown = ", ".join(sorted(fixed)[:5]) + (", ..." if len(fixed) > 5 else "")
        log.warning(
            "state_dir %s: removed group and other access (the outbox, status and desired state are "
            "for this agent only): %s%s",
            state_dir,
            f"the dir was {was:04o}, now {was & ~0o077:04o}" if was else "the dir was already private",
            f"; and from {len(fixed)} file(s) and folder(s) in it: {shown}" if fixed else "",
        )
    if failed:
        log.warning("state_dir %s: could not make private: %s", state_dir, "; ".join(failed[:5]))


_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """At most `arenas` glibc malloc arenas (by default one per thread that allocates, up to 8 per
    core). Frames are allocated in a source's thread and freed in the pipeline's, and each arena keeps
    what it freed: a second camera on one model cost 142 MB of RSS that way, 53 MB with 2 arenas
    (PP-OCR det, 720p, scripts/bench_pipeline.py). MALLOC_ARENA_MAX in the environment wins. False
    where the C library is not glibc (nothing to do)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


# What reads reloadable settings takes each reloaded config (Agent.on_reload).
TakesConfig = Callable[[AgentConfig], None]


class Agent:
    def __init__(
        self, config: AgentConfig, loaded: LoadedConfig | None = None, log_level_from_cli: str | None = None
    ) -> None:
        """`loaded`: where `config` came from (the file a reload re-reads); None: not from a file.
        `log_level_from_cli`: `run --log-level`, which a reload does not override."""
        self.config = config
        self.loaded = loaded or LoadedConfig(config, None, None)
        self.started_at = time.time()
        self.reload_requested = threading.Event()  # set by SIGHUP; the main loop reloads
        self._reloads = threading.Condition()  # notified after each reload (reload_and_wait)
        self._reload_count = 0
        self.log_level_from_cli = log_level_from_cli
        self._log_level = config.log_level
        self.last_good = LastGoodConfig(config.state_dir)
        limit_malloc_arenas()
        keep_opencv_serial()
        self._config_report: dict[str, Any] = {
            "file": str(self.loaded.path) if self.loaded.path else None,
            "sha256": sha256_text(self.loaded.text) if self.loaded.text is not None else None,
            "loaded_at": iso_utc(self.started_at),
            "running": "last-good" if self.loaded.running_last_good else "file",
            "problems": list(self.loaded.problems),
            "restart_needed": [],
            "last_reload": None,
        }
        # Before anything in the state dir is touched; read-only CLI commands do not take it.
        self.instance_lock = hold_state_dir(config.state_dir)
        try:
            keep_state_dir_private(config.state_dir)
            self._setup(config)
        except BaseException:
            self.instance_lock.release()
            raise

    def _setup(self, config: AgentConfig) -> None:
        self.store = store_for(config)  # first: a trusted key that cannot be loaded stops the start here
        state_dir = config.state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            box = config.mqtt.outbox
            self.outbox = Outbox(
                state_dir / "outbox.sqlite",
                box.max_messages,
                max_bytes=box.max_bytes,
                when_full=box.when_full,
                durability=box.durability,
                commit_interval_s=box.commit_interval_ms / 1000,
            )
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
        # Tracking pipelines: their open tracks (ended at the next start after a kill) and snapshots.
        # The events page's index of recent events (agent/event_index.py): fed by the event writer.
        self.event_index = EventIndex(state_dir / EVENT_INDEX_FILE)
        events = EventWriter(
            config.device.id,
            config.mqtt.topic_prefix,
            self.outbox,
            TrackJournal(state_dir / "tracks"),
            self.event_index,
        )
        self.snapshots = SnapshotStore(state_dir / "snapshots", config.snapshots)
        # State topics and Home Assistant discovery (docs/integrations.md): fed by the result writer,
        # asking the supervisor (made next, to take the writer) what is wanted and what runs.
        self.home = HomeAutomation(
            config,
            self.mqtt,
            wanted=lambda: [slot.desired.config for slot in self.supervisor.slots()],
            running=lambda: self.supervisor.pipelines(),
            health=lambda: (self.supervisor.states(), self.outbox.pending()),
        )
        self.writer = ResultWriter(
            config.device.id,
            config.mqtt.topic_prefix,
            config.mqtt.max_payload_bytes,
            self.outbox,
            self.mqtt.notify_new_message,
            events=events,
            snapshots=self.snapshots,
            observer=self.home.observe,
            scene_observer=self.home.observe_scene,
            snapshot_observer=self.home.observe_snapshot,
        )
        self.supervisor = Supervisor(
            config,
            self.store,
            self.sessions,
            self.writer,
            broker=BrokerLink(config.mqtt, self.mqtt.client_id),
        )
        self.registry_link = self.supervisor.registry_link
        # Self-update (agent/self_update.py): the release desired state names, and this one's trial.
        self.exit_code = 0  # RESTART_EXIT_CODE: stopped to be restarted (by systemd) into a release
        self._stop: threading.Event | None = None
        self.updater = Updater(config.state_dir, self._pull_release, self._trial_health, self.request_restart)
        # Every subscription goes through the router; desired state through the reconciler.
        self.router = Router(self.mqtt)
        self.reconciler = Reconciler(
            config,
            self.supervisor,
            self.store.trust,
            publish_retained=lambda topic, payload: self.mqtt.publish_snapshot(
                topic, payload, qos=1, retain=True
            ),
            connects=lambda: int(self.mqtt.stats()["connects"]),
            updater=self.updater,
        )
        self.recent_logs = RecentLogs()
        self.commands = CommandServer(
            config.fleet.commands, device_handlers(self, self.recent_logs), config.mqtt.max_payload_bytes
        )
        self.control = ControlServer(
            socket_path(config.state_dir),
            {"status": self.status, "explain": lambda: {"pipelines": self.supervisor.serving_records()}},
        )
        self.final_states: dict[str, PipelineStatus] = {}
        # The optional web page (docs/web.md): its own thread, reading only `status`.
        self.web = (
            WebServer(config.web, self.status, config.device.id, pages=pages_of(self._site()))
            if config.web.enabled
            else None
        )
        self.watchdog = Watchdog(lambda: self.supervisor.stall() or self.mqtt.stall())
        # The main loop's work, ticked in this order every half second.
        self.ticks: tuple[Tickable, ...] = (
            self.supervisor,  # deadlines, retries, the registry probe
            self.updater,  # a release on trial confirmed or rolled back
            StateChanges(self.pipeline_states, self._summary, self.mqtt.publish_status_now),
            self.reconciler,  # reported state not sent yet
            Contained(self.home, "state topics / Home Assistant discovery"),
            OutageSummary(self.mqtt, self.outbox, lambda: self.config.mqtt.outbox.when_full),
            Every(lambda: _STATUS_FILE_EVERY_S, self.write_status_file, at_start=True),
            # The first after one interval: rates need one.
            Every(lambda: self.config.telemetry.interval_s, self.publish_telemetry),
            self.watchdog,  # last: it pings only when the rest made progress
        )
        # What reads reloadable settings, handed each reloaded config in this order (reload()).
        self.on_reload: tuple[TakesConfig, ...] = (
            self.reconciler.use_config,
            self.supervisor.use_config,
            lambda c: self.writer.configure(c.device.id, c.mqtt.topic_prefix, c.mqtt.max_payload_bytes),
            lambda c: self.snapshots.use(c.snapshots),
            self.home.use_config,
            self._use_log_level,
        )

    # --- lifecycle ---------------------------------------------------------------------

    def run(
        self, stop: threading.Event, duration_s: float | None = None, reload: threading.Event | None = None
    ) -> None:
        """Run until `stop` is set (SIGTERM/SIGINT) or `duration_s` passes; `reload` set (SIGHUP)
        reloads the config."""
        if reload is not None:
            self.reload_requested = reload
        self._stop = stop
        deadline = None if duration_s is None else time.monotonic() + duration_s
        # Pipelines are built off the main thread, each on its own: a slow model pull must not hold
        # back READY, the watchdog, the status or another pipeline.
        logging.getLogger().addHandler(self.recent_logs)
        self.reconciler.start(self.router)
        self.home.start(self.router)
        if self.config.fleet.enabled:
            prefix, device = self.config.mqtt.topic_prefix, self.config.device.id
            self.commands.start(self.router, f"{prefix}/{device}/cmd/+")
        # Connect only once every handler is routed: right after the CONNACK the broker delivers what
        # it queued in our session (commands sent while we were down), and a message that comes
        # before its handler is registered is dropped.
        self.mqtt.start()
        self.control.start()  # `edge-agent status`
        if self.web is not None:
            try:
                self.web.start()
            except EdgeAgentError as exc:  # the page is optional: the pipelines run without it
                log.error("the web page is off: %s", exc)
                self.web = None
        notify("READY=1", f"STATUS={self._summary()}")
        log.info("edge-agent %s running as %s", __version__, self.config.device.id)
        if self.loaded.text is not None and not self.loaded.running_last_good:
            self.last_good.save(self.loaded.text, self.loaded.path)  # it got this far: it runs
        wait = 0.5 if self.watchdog.interval_s is None else min(0.5, self.watchdog.interval_s)
        try:
            while not stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    log.info("run duration reached, stopping")
                    break
                if self.reload_requested.is_set():
                    self.reload_requested.clear()
                    self.reload()
                for part in self.ticks:
                    part.tick()
                stop.wait(wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic())))
        finally:
            stop.set()
            self.shutdown()

    def shutdown(self) -> None:
        notify("STOPPING=1", "STATUS=stopping")
        log.info("stopping: finishing in-flight frames")
        self.final_states = self.pipeline_states()  # what `run` reports on exit
        self.supervisor.stop(_STOP_PIPELINES_S)
        # After the pipelines: their stopped live views answer the page's waiting polls at once, so
        # the server's stop does not wait out a long poll.
        if self.web is not None:
            self.web.stop()
        timeout = self.config.mqtt.outbox.flush_timeout_s
        if self.outbox.pending():
            log.info("flushing %d queued results (up to %.0f s)", self.outbox.pending(), timeout)
        flushed = self.mqtt.flush(timeout)
        left = self.outbox.pending()
        if not flushed and left:
            log.warning("%d results stay queued in the outbox; they are sent on the next start", left)
        self.write_status_file()
        self.control.stop()
        self.mqtt.stop(publish_offline=True)
        self.supervisor.close()
        self.event_index.close()
        self.outbox.close()
        log.info("stopped")
        logging.getLogger().removeHandler(self.recent_logs)
        self.instance_lock.release()

    # --- self-update -------------------------------------------------------------------

    def request_restart(self, reason: str) -> None:
        """Stop gracefully (outbox flushed) and exit RESTART_EXIT_CODE: systemd starts the agent
        again, and `edge-agent run` boots the release current.json names."""
        log.warning("%s: stopping to be restarted (exit %d)", reason, RESTART_EXIT_CODE)
        self.exit_code = RESTART_EXIT_CODE
        if self._stop is not None:
            self._stop.set()

    def _pull_release(self, name: str, version: str) -> Path:
        """The release wheel name@version, pulled into the store (verified; signed when the trust
        policy says so) and copied out under its file name (pip goes by the name)."""
        from agent.registry import open_registry

        if self.config.registry is None:
            raise EdgeAgentError("no registry is configured (registry: in agent.yaml) to pull releases from")
        registry = open_registry(self.config.registry.url, self.config.registry)
        try:
            installed = self.store.pull(registry, name, version)
        finally:
            registry.close()
        if not installed.manifest.is_release():
            raise EdgeAgentError(f"{installed.ref} in the registry is a model, not an edge-agent release")
        artifact = installed.manifest.artifacts[0]
        wheel = releases_dir(self.config.state_dir) / version / artifact.file
        wheel.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed.artifact_path(artifact), wheel)
        return wheel

    def _trial_health(self) -> str | None:
        """None while this agent is healthy (what a release on trial must show): the broker
        connected, every pipeline that should run running, none stalled; else why not."""
        if not self.mqtt.stats()["connected"]:
            return "the broker is not connected"
        for name, state in self.supervisor.states().items():
            if state.state not in ("running", "finished"):  # finished: a file that was played through
                return f"pipeline {name} is {state.state}"
        return self.supervisor.stall()

    # --- reload (SIGHUP) -----------------------------------------------------------------

    def reload_and_wait(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ask the main loop for a reload, as SIGHUP does, and wait for its outcome (reload's); from
        another thread (the web page's editor). {"result": "pending"} when it took longer."""
        with self._reloads:
            before = self._reload_count
            self.reload_requested.set()
            if not self._reloads.wait_for(lambda: self._reload_count > before, timeout_s):
                return {"result": "pending", "problems": [f"the reload did not finish in {timeout_s:.0f} s"]}
            outcome: dict[str, Any] = self._config_report["last_reload"]
            return outcome

    def _site(self) -> Site:
        """What the web pages read of the daemon (agent/web/site.py)."""
        return Site(
            supervisor=self.supervisor,
            state_dir=self.config.state_dir,
            config_file=self.loaded.path,
            reload=self.reload_and_wait,
            explain=lambda: {"pipelines": self.supervisor.serving_records()},
            layer_of=self._document_layer_of,
            events=self.event_index,
        )

    def _document_layer_of(self, pipeline: str) -> str | None:
        for desired in self.reconciler.desired():
            if desired.config.name == pipeline:
                return None if desired.layer == "yaml" else desired.layer
        return None

    def reload(self) -> dict[str, Any]:
        """Re-read the config file and apply what changed (agent/reload.py); returns the outcome,
        also kept for the status. Never raises: a bad file leaves everything running as it was."""
        path = self.loaded.path
        at = iso_utc(time.time())
        if path is None:
            log.warning("reload asked for, but this daemon was not started from a config file")
            return {"at": at, "result": "refused", "problems": ["not started from a config file"]}
        notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            from agent.config_loader import read_config

            text, new = read_config(path)
            plan = plan_reload(self.config, new)
            effective = with_hot_settings(self.config, new)
        except ConfigError as exc:
            log.error(
                "reload refused: %s has %d problem(s); the running config stays:\n  %s%s",
                path,
                len(exc.problems),
                "\n  ".join(exc.problems),
                f"\n  ({exc.hint})" if exc.hint else "",
            )
            outcome: dict[str, Any] = {"at": at, "result": "refused", "problems": list(exc.problems)}
        else:
            self._use_config(effective)
            if plan.added or plan.removed or plan.changed:
                self.reconciler.apply()
            plan.retry(self.supervisor.retry_failed("the config was reloaded"))  # not at their slot
            self.loaded = LoadedConfig(effective, path, text)
            self.last_good.save(text, path)
            # Restart-only settings that differ stay listed (they still wait) but apply nothing.
            applies = plan.added or plan.removed or plan.changed or plan.settings or plan.retried
            result = "applied" if applies else "unchanged"
            log.info("reload of %s: %s (%s)", path, result, plan.summary())
            if plan.restart_needed:
                log.warning(
                    "reload: %s changed; these take effect after a restart (systemctl restart "
                    "edge-agent), the running values stay until then",
                    ", ".join(plan.restart_needed),
                )
            outcome = {"at": at, "result": result, "changes": plan.to_dict()}
            self._config_report.update(
                sha256=sha256_text(text), loaded_at=at, running="file", problems=[],
                restart_needed=plan.restart_needed,
            )  # fmt: skip
        self._config_report["last_reload"] = outcome
        with self._reloads:
            self._reload_count += 1
            self._reloads.notify_all()
        notify("READY=1", f"STATUS={self._summary()}")
        self.write_status_file()
        self.mqtt.publish_status_now()
        return outcome

    def _use_config(self, config: AgentConfig) -> None:
        """Hand the reloaded config (only its reloadable settings differ) to what reads it."""
        self.config = config
        for take in self.on_reload:
            take(config)

    def _use_log_level(self, config: AgentConfig) -> None:
        """A reloaded log_level applies, unless `run --log-level` set it."""
        if config.log_level != self._log_level and self.log_level_from_cli is None:
            logging.getLogger().setLevel(config.log_level.upper())
        self._log_level = config.log_level

    def none_ran(self) -> list[str] | None:
        """After the run: when there were pipelines and every one failed without ever running a
        frame, why each did (`run` then exits 1); None when one ran, one was still being built
        (a stop during a long pull is no failure), or there were none."""
        states = self.final_states
        if not states or any(s.inferences or s.state == "finished" for s in states.values()):
            return None
        if not all(s.phase == "failed" or s.error for s in states.values()):
            return None

        def why(s: PipelineStatus) -> str:
            last = s.last_error
            return s.error or (None if last is None else last.text) or s.change.reason or s.phase

        return [f"{name}: {why(s)}" for name, s in states.items()]

    # --- status ------------------------------------------------------------------------

    def pipeline_states(self) -> dict[str, PipelineStatus]:
        """Each pipeline's status with the results the outbox's when_full dropped of it."""
        dropped = self.outbox.dropped_by_stream()
        return {
            name: state.with_dropped(dropped.get(f"results/{name}", 0))
            for name, state in self.supervisor.states().items()
        }

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
            payload["config"] = self._config_summary()
            payload["registry"] = self.registry_link.to_dict()
            payload["pipelines"] = {name: s.brief_json() for name, s in self.pipeline_states().items()}
        return json.dumps(payload, separators=(",", ":")).encode()

    def _config_summary(self) -> dict[str, Any]:
        """The config part of the MQTT status: small (problems clipped), enough to act on."""
        report = self._config_report
        last = report["last_reload"]

        def first(problems: list[str]) -> list[str]:
            return [p[:300] for p in problems[:5]]

        return {
            "running": report["running"],
            "sha256": report["sha256"],
            "problems": first(report["problems"]),
            "restart_needed": report["restart_needed"][:20],
            "last_reload": None
            if last is None
            else {"at": last["at"], "result": last["result"], "problems": first(last.get("problems", []))},
        }

    def _summary(self) -> str:
        states = self.pipeline_states()
        running = sum(1 for s in states.values() if s.state == "running")
        return f"{running}/{len(states)} pipelines running, {self.outbox.pending()} results queued"

    def status(self) -> dict[str, Any]:
        pipelines = self.pipeline_states()
        # Per document, whether its generation serves here or failed (not only that it was accepted).
        documents = generation_outcomes(self.reconciler.documents(), pipelines)
        return {
            "device": self.config.device.id,
            "agent_version": __version__,
            "pid": os.getpid(),
            "started_at": iso_utc(self.started_at),
            "uptime_s": round(time.time() - self.started_at, 1),
            "stall": self.watchdog.stall,
            "updated_at": iso_utc(time.time()),
            "mqtt": self.mqtt.stats(),
            "router": self.router.stats(),
            "commands": self.commands.stats(),
            "outbox": self.outbox.stats(),
            "sessions": self.sessions.stats(),
            "telemetry": {
                "interval_s": self.config.telemetry.interval_s,
                "skipped_while_offline": self.telemetry_skipped,
            },
            "registry": self.registry_link.to_dict(),
            "config": self._config_report,
            "fleet": {"enabled": self.config.fleet.enabled, "documents": documents},
            "home_automation": self.home.stats(),
            "store": {"installed": [m.ref for m in self.store.list()]},
            "pipelines": statuses_json(pipelines),
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
