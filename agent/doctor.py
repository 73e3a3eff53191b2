"""`edge-agent doctor`: why does this box not work? One command that tries what the agent needs,
each check OK, WARN or FAIL with a one-line fix.

The checks are plain functions returning `Check`s; `run_doctor` runs them one after another, each
in a thread of its own with a time limit, so a broker or camera that hangs makes its row FAIL
instead of hanging the command. They try things the way the agent does (its config loader, MQTT
credentials, registry client, store verification, sources and backend choice), never its state:
doctor logs in to the broker with its own client id, reads cameras only when the agent is not
running them, and writes nothing into a state dir that belongs to another user.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import socket
import ssl
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from agent.config import (
    CLIENT_ID_MAX,
    LOCAL_VERSION,
    AgentConfig,
    AudioSourceConfig,
    MqttSourceConfig,
    PipelineConfig,
    ReplaySourceConfig,
    SerialSourceConfig,
    SourceConfig,
    TlsConfig,
    VideoSourceConfig,
)
from agent.errors import ConfigError, EdgeAgentError, RegistryError
from agent.fsutil import group_name, user_name

log = logging.getLogger(__name__)

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
EXIT_CODES: dict[Status, int] = {OK: 0, WARN: 1, FAIL: 2}

# The year this version was made: a clock before it is wrong for certain (certificates and
# signatures are "not yet valid"), and one far after it is most likely wrong too.
BUILD_YEAR = 2026
FUTURE_YEARS = 10

# Free space on the state dir's filesystem: the outbox, model pulls and the decision cache live there.
DISK_WARN_BYTES = 500 * 1024**2
DISK_WARN_SHARE = 0.10
DISK_FAIL_BYTES = 50 * 1024**2

# Camera and accelerator device nodes the agent's user must be able to open.
DEVICE_PATTERNS = ("/dev/video*", "/dev/nvidia*", "/dev/accel/*", "/dev/apex_*", "/dev/dri/renderD*")

# Re-hashing every installed model: seconds per GB on an SD card, so much longer than a network wait.
STORE_LIMIT_S = 600.0
# What a check may take beyond its own waits (starting a thread, stopping a source's reader).
GRACE_S = 10.0
# A status.json rewritten this recently, by a process that is alive, is a running agent's.
RUNNING_STATUS_AGE_S = 30.0

SKIPPED = "not checked: config invalid"
SKIPPED_FIX = "fix the config first (see the config row)"


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, how it went, and what to do about it."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    seconds: float | None = None  # how long the check took


def exit_code(checks: list[Check]) -> int:
    """0 when every check is OK, 1 when some WARN (none FAIL), 2 when any FAIL."""
    return max((EXIT_CODES[c.status] for c in checks), default=0)


def summary(checks: list[Check]) -> dict[str, int]:
    return {status.lower(): sum(1 for c in checks if c.status == status) for status in EXIT_CODES}


def report(checks: list[Check]) -> dict[str, Any]:
    """The --json document."""
    return {
        "checks": [asdict(c) for c in checks],
        "summary": summary(checks),
        "exit_code": exit_code(checks),
    }


# --- running them ---------------------------------------------------------------------------


def run_doctor(config_path: Path, timeout_s: float = 10.0) -> list[Check]:
    """Every check, in order; those that need a valid config are rows saying they were not checked
    when it is not."""
    from agent.config_loader import load_config

    started = time.monotonic()
    config: AgentConfig | None = None
    try:
        loaded = load_config(config_path)
    except ConfigError as exc:
        if not config_path.is_file():
            fix = "give the agent's config with -c FILE (or EDGE_AGENT_CONFIG)"
        elif not os.access(config_path, os.R_OK):
            fix = "run doctor as the agent's user (sudo -u edge-agent edge-agent doctor) or as root"
        else:
            fix = f"edge-agent config validate {config_path}"
        checks = [Check("config", FAIL, "\n".join(exc.problems), fix)]
    else:
        config = loaded
        enabled = [p for p in loaded.pipelines if p.enabled]
        checks = [
            Check(
                "config",
                OK,
                f"{config_path}: device {loaded.device.id}, {len(enabled)} enabled pipeline(s) "
                f"of {len(loaded.pipelines)}",
            )
        ]
    checks[0] = replace(checks[0], seconds=round(time.monotonic() - started, 2))
    for name, check, limit_s in _plan(config, config_path, timeout_s):
        checks += bounded(name, check, limit_s)
    return checks


Plan = list[tuple[str, Callable[[], Check | list[Check]], float]]


def _plan(config: AgentConfig | None, config_path: Path, timeout_s: float) -> Plan:
    network = 3 * timeout_s + GRACE_S
    local = timeout_s + GRACE_S
    if config is None:
        skipped = ("broker", "registry", "store", "pipelines", "disk", "state dir", "secret files")
        plan: Plan = [(name, _skipped(name), local) for name in skipped]
        return [
            *plan,
            ("devices", lambda: check_devices(None), local),
            ("clock", lambda: check_clock(synchronized=ntp_synchronized(timeout_s)), local),
        ]
    cfg = config
    enabled = [p for p in cfg.pipelines if p.enabled]
    plan = [
        ("broker", lambda: check_broker(cfg, timeout_s), network),
        ("registry", lambda: check_registry(cfg, timeout_s), network + len(enabled) * timeout_s),
        ("store", lambda: check_store(cfg), STORE_LIMIT_S),
    ]
    if not enabled:
        plan.append(("pipelines", lambda: Check("pipelines", OK, "none enabled in the config"), local))
    running = running_agent(cfg.state_dir)
    for pipeline in enabled:
        plan.append(
            (
                f"source:{pipeline.name}",
                _bind(check_source_of, pipeline, timeout_s, running),
                local + timeout_s,
            )
        )
    for pipeline in enabled:
        limit = cfg.backends.timeout_s + timeout_s + GRACE_S  # the agent's own limit on loading one
        plan.append((f"backend:{pipeline.name}", _bind(check_backend_of, cfg, pipeline), limit))
    return [
        *plan,
        ("disk", lambda: check_disk(cfg.state_dir), local),
        ("state dir", lambda: check_state_dir(cfg.state_dir), local),
        ("devices", lambda: check_devices(cfg), local),
        ("secret files", lambda: check_secret_files(config_path, cfg), local),
        ("clock", lambda: check_clock(synchronized=ntp_synchronized(timeout_s)), local),
    ]


def _skipped(name: str) -> Callable[[], Check]:
    return lambda: Check(name, WARN, SKIPPED, SKIPPED_FIX)


def _bind(function: Callable[..., Check], *args: Any) -> Callable[[], Check]:
    return lambda: function(*args)


def bounded(name: str, check: Callable[[], Check | list[Check]], limit_s: float) -> list[Check]:
    """Run one check in a thread of its own for at most `limit_s`: one that hangs (a driver, a
    broker that never answers) is a FAIL row, and the thread is left behind (a daemon thread)."""
    outcome: list[list[Check]] = []

    def work() -> None:
        try:
            result = check()
            outcome.append(result if isinstance(result, list) else [result])
        except EdgeAgentError as exc:  # what the agent itself would say, with its hint
            outcome.append([Check(name, FAIL, exc.message, exc.hint or "")])
        except Exception as exc:  # a check's own failure is a row, never a traceback
            log.debug("doctor check %s failed", name, exc_info=True)
            outcome.append(
                [Check(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "report this")]
            )

    started = time.monotonic()
    thread = threading.Thread(target=work, name=f"doctor-{name}", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive() or not outcome:
        return [
            Check(
                name,
                FAIL,
                f"did not finish within {limit_s:g} s",
                "something this check waits for hangs; the agent would hang there too",
                round(time.monotonic() - started, 2),
            )
        ]
    seconds = round(time.monotonic() - started, 2)
    return [replace(c, seconds=seconds) for c in outcome[0]]


# --- broker ---------------------------------------------------------------------------------

# CONNACK reason codes (MQTT 5; paho maps MQTT 3.1.1's return codes onto them) -> what to do.
CONNACK_FIXES = {
    0x84: 'the broker does not speak this MQTT version: set mqtt.protocol to "3.1.1" (or "5")',
    0x85: "the broker refuses the client id: check mqtt.client_id",
    0x86: "check mqtt.username and the password (mqtt.password or the first line of mqtt.password_file) "
    "against the broker's password file",
    0x88: "the broker is unavailable: see its log (starting, overloaded, or a bridge down)",
    0x89: "the broker is busy: see its log, try again in a moment",
    0x8A: "the broker banned this client: ask whoever runs it",
    0x8C: "the broker wants another authentication method: check its auth plugin settings",
    0x9F: "the broker limits how fast clients connect: try again in a moment",
}


def _refusal_fix(code: int, username: str | None) -> str:
    if code != 0x87:  # "not authorized"
        return CONNACK_FIXES.get(code, "see the broker's log for why it refused")
    if username is None:
        return "the broker wants a login: set mqtt.username and mqtt.password_file (or allow_anonymous)"
    # mosquitto answers a wrong password with "not authorized" too, not "bad user name or password".
    return (
        "check mqtt.username and its password (mqtt.password or the first line of mqtt.password_file) "
        "against the broker's password file, and the broker's ACL for this user"
    )


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_NAME_MISMATCH = (62, 64)


def doctor_client_id(agent_client_id: str) -> str:
    """The agent's client id plus "-doctor": a broker drops the older of two clients with one id,
    and doctor must not kick the running agent off."""
    suffix = "-doctor"
    return agent_client_id[: CLIENT_ID_MAX - len(suffix)] + suffix


def check_broker(config: AgentConfig, timeout_s: float) -> Check:
    """TCP connect, TLS handshake (with mqtt.tls), then an MQTT CONNECT with the agent's login."""
    cfg = config.mqtt
    problem = tcp_problem(cfg.host, cfg.port, timeout_s, "mqtt.host / mqtt.port", "the broker")
    if problem is None and cfg.tls is not None:
        problem = _tls_problem(cfg.host, cfg.port, cfg.tls, timeout_s)
    if problem is not None:
        return Check("broker", FAIL, *problem)
    return _mqtt_login(config, timeout_s)


def tcp_problem(host: str, port: int, timeout_s: float, keys: str, what: str) -> tuple[str, str] | None:
    """(detail, fix) when nothing answers at host:port; None when a TCP connection is made."""
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}", f"check {keys.split(' / ')[0]} (DNS, /etc/hosts)"
    except ConnectionRefusedError:
        return (
            f"{where} refused the connection: nothing listens there",
            f"start {what} (e.g. systemctl status mosquitto) or fix {keys}",
        )
    except TimeoutError:
        return (
            f"no answer from {where} within {timeout_s:g} s",
            f"check that {host} is up and that a firewall lets port {port} through",
        )
    except OSError as exc:
        return f"cannot reach {where}: {exc.strerror or exc}", f"check the network route to {host}"


def _tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The checks paho makes with mqtt.tls (agent/mqtt/client.py use_credentials)."""
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    context.check_hostname = not tls.insecure
    return context


def _tls_problem(host: str, port: int, tls: TlsConfig, timeout_s: float) -> tuple[str, str] | None:
    where = f"{host}:{port}"
    try:
        context = _tls_context(tls)
    except (OSError, ssl.SSLError) as exc:
        return (
            f"cannot load the TLS files: {getattr(exc, 'strerror', None) or exc}",
            "check that mqtt.tls.ca_file, cert_file and key_file exist and are readable PEM files",
        )
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in _NAME_MISMATCH:
            return (
                f"the broker's certificate is not for {host!r}: {exc.verify_message}",
                "set mqtt.host to a name or address the certificate holds, or give the broker a "
                "certificate for this one",
            )
        return (
            f"the broker's certificate is not trusted: {exc.verify_message}",
            "mqtt.tls.ca_file must be the CA that signed the broker's certificate",
        )
    except ssl.SSLError as exc:
        return (
            f"TLS handshake with {where} failed: {exc.reason or exc}",
            f"check that {where} is the broker's TLS listener, and mqtt.tls.cert_file / key_file if it "
            "wants a client certificate",
        )
    except TimeoutError:
        return (
            f"no TLS handshake from {where} within {timeout_s:g} s",
            "check that this port is the broker's TLS listener (usually 8883)",
        )
    except OSError as exc:
        return (
            f"{where} closed the connection during the TLS handshake: {exc.strerror or exc}",
            "check that this port is the broker's TLS listener (usually 8883)",
        )


def _mqtt_login(config: AgentConfig, timeout_s: float) -> Check:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

    from agent.mqtt.client import use_credentials

    cfg = config.mqtt
    where = f"{cfg.host}:{cfg.port}"
    client_id = doctor_client_id(cfg.client_id or f"edge-agent-{config.device.id}")
    v5 = cfg.protocol == "5"
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else True,
    )
    try:
        use_credentials(client, cfg)
    except ConfigError as exc:
        return Check("broker", FAIL, exc.message, exc.hint or "check mqtt.password_file and mqtt.tls")
    client.connect_timeout = timeout_s
    answers: list[Any] = []
    client.on_connect = lambda _c, _u, _flags, reason, _props: answers.append(reason)
    try:
        client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
    except (OSError, ValueError) as exc:
        return Check("broker", FAIL, f"cannot connect to {where}: {exc}", "see the broker's log")
    closed = False
    try:
        deadline = time.monotonic() + timeout_s
        while not answers and time.monotonic() < deadline:
            if client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS and not answers:
                closed = True
                break
        if answers and not answers[0].is_failure:
            client.disconnect()
            client.loop(timeout=0.1)  # sends the DISCONNECT
    finally:
        sock = client.socket()
        if sock is not None:  # refused, or no answer: paho leaves its socket open
            with contextlib.suppress(OSError):
                sock.close()
    login = f"{cfg.username!r}" if cfg.username else "an anonymous client"
    if not answers:
        if closed:
            return Check(
                "broker",
                FAIL,
                f"{where} closed the connection before answering the MQTT CONNECT",
                "if the port is TLS, give mqtt.tls; if the broker wants a client certificate, give "
                "mqtt.tls.cert_file / key_file; its log says why",
            )
        return Check(
            "broker",
            FAIL,
            f"no CONNACK from {where} within {timeout_s:g} s: it takes TCP connections but does not "
            "answer MQTT",
            "check that this is the broker's MQTT port (a TLS port needs mqtt.tls), and the broker's "
            "log and load",
        )
    reason = answers[0]
    tls = ", TLS" if cfg.tls is not None else ""
    if reason.is_failure:
        code = reason.value
        return Check(
            "broker",
            FAIL,
            f"{where} refused the login of {login}: {reason} ({code:#x})",
            _refusal_fix(code, cfg.username),
        )
    return Check(
        "broker", OK, f"logged in to {where} as {login} (MQTT {cfg.protocol}{tls}, client id {client_id})"
    )


# --- registry -------------------------------------------------------------------------------


def check_registry(config: AgentConfig, timeout_s: float) -> Check:
    """One listing (index or tags) proves the registry answers and takes the credentials; then
    every registry model the pipelines name must be there, or in the store."""
    from agent.registry import FileRegistry, HttpRegistry, open_registry
    from agent.store import store_for

    settings = config.registry
    if settings is None:
        return Check("registry", OK, "none configured: every pipeline's model is a file on the box")
    quick = settings.model_copy(
        update={"connect_timeout_s": timeout_s, "read_timeout_s": timeout_s, "retries": 0}
    )
    wanted = sorted(
        {(p.model.name, p.model.version) for p in config.pipelines if p.enabled and p.model.path is None}
    )
    try:
        registry = open_registry(settings.url, quick)
    except EdgeAgentError as exc:
        return Check("registry", FAIL, exc.message, exc.hint or "check registry.url and its credentials")
    missing: list[str] = []
    with contextlib.closing(registry):
        try:
            if isinstance(registry, (HttpRegistry, FileRegistry)):
                listed = registry.list_models()
                what = f"{len(listed)} model(s) listed"
            else:  # OCI has no listing of every model: the tags of each named one
                listed = sorted({name for name, _ in wanted})
                what = (
                    f"tags of {len(listed)} model(s) listed"
                    if listed
                    else "not asked: no pipeline names a model in it (an OCI registry lists no models)"
                )
            versions = {name: registry.list_versions(name) for name, _ in wanted if name in listed}
        except RegistryError as exc:
            return Check("registry", FAIL, exc.message, _registry_fix(exc, settings.url))
    store = store_for(config)
    for name, version in wanted:
        if version not in versions.get(name, []):
            installed = store.is_installed(name, version)
            missing.append(f"{name}@{version}" + (" (installed in the store)" if installed else ""))
    where = registry.url
    if any("installed" not in m for m in missing):
        return Check(
            "registry",
            FAIL,
            f"{where}: {what}, but {', '.join(missing)} is not in it",
            "publish it (edge-agent registry publish) or fix the pipeline's model name/version",
        )
    if missing:
        return Check(
            "registry",
            WARN,
            f"{where}: {what}, but {', '.join(missing)} is not in it",
            "the box runs it from its store; a reinstall could not pull it again",
        )
    return Check("registry", OK, f"{where}: {what}" + (", every pipeline's model in it" if wanted else ""))


def _registry_fix(exc: RegistryError, url: str) -> str:
    if url.startswith("file:"):
        return "check registry.url: a folder on this box (mounted, readable by the agent's user)"
    if "cannot reach" in exc.message:
        return "check registry.url and that the registry server is up and reachable from this box"
    if exc.hint and "keeps running" not in exc.hint:
        return exc.hint
    return "check registry.url and registry.username / password_file / token_file"


# --- store ----------------------------------------------------------------------------------


def check_store(config: AgentConfig) -> Check:
    """Re-hash every installed version's files and check its signatures against the trust policy
    (what `edge-agent models verify` does)."""
    from agent.store import store_for

    try:
        store = store_for(config)
        installed = store.list()
        damaged = [(m, store.verify(m.name, m.version)) for m in installed]
    except EdgeAgentError as exc:
        return Check("store", FAIL, exc.message, exc.hint or f"check {config.state_dir}/store")
    damaged = [(m, problems) for m, problems in damaged if problems]
    if not installed:
        return Check("store", OK, "empty: nothing installed yet (the agent pulls what pipelines name)")
    if damaged:
        in_use = {(p.model.name, p.model.version) for p in config.pipelines}
        detail = "; ".join(f"{m.ref}: {'; '.join(problems)}" for m, problems in damaged)
        fixes = [
            "edge-agent models pull (copies model.path files in again)"
            if m.version == LOCAL_VERSION
            else f"edge-agent models rm {m.ref}{' --force' if (m.name, m.version) in in_use else ''} "
            f"&& edge-agent models pull {m.ref}"
            for m, _ in damaged
        ]
        return Check("store", FAIL, detail, "; ".join(dict.fromkeys(fixes)))
    signed = ", signatures checked against registry.trusted_keys" if store.trust.required else ""
    return Check("store", OK, f"{len(installed)} version(s), every file's sha256 matches{signed}")


# --- pipelines: sources ---------------------------------------------------------------------


def running_agent(state_dir: Path) -> dict[str, Any] | None:
    """The running agent's status (state_dir/status.json, rewritten every few seconds), or None
    when no agent runs on this state dir."""
    path = state_dir / "status.json"
    try:
        if time.time() - path.stat().st_mtime > RUNNING_STATUS_AGE_S:
            return None
        status = json.loads(path.read_text())
        os.kill(int(status["pid"]), 0)
    except PermissionError:  # alive, as another user
        pass
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if isinstance(status, dict) else None


def _exclusive(source: SourceConfig) -> bool:
    """A V4L2 camera or serial port: one reader at a time, so a running agent's is not disturbed."""
    from agent.sources.video import source_kind

    if isinstance(source, SerialSourceConfig):
        return True
    return isinstance(source, VideoSourceConfig) and source_kind(source.uri) == "device"


def _local_path(source: SourceConfig) -> tuple[str, Path] | None:
    """(what it is, path) of a source that is a file or device node on this box."""
    from agent.sources.video import source_kind

    if isinstance(source, VideoSourceConfig):
        kind = source_kind(source.uri)
        if kind == "device":
            return "camera", Path(f"/dev/video{source.uri}" if source.uri.isdigit() else source.uri)
        if kind in ("file", "folder"):
            return f"video {kind}", Path(source.uri)
    if isinstance(source, AudioSourceConfig) and not source.uri.startswith("alsa:"):
        return "audio file", Path(source.uri)
    if isinstance(source, ReplaySourceConfig):
        return "replay file", Path(source.uri)
    if isinstance(source, SerialSourceConfig):
        return "serial port", Path(source.uri)
    return None


def check_source_of(pipeline: PipelineConfig, timeout_s: float, running: dict[str, Any] | None) -> Check:
    """Does the pipeline's source give a frame within the timeout?"""
    from agent.sources.check import check_source

    name = f"source:{pipeline.name}"
    source = pipeline.source
    if isinstance(source, MqttSourceConfig):
        # Its readings come when the sensors publish, and it logs in with the agent's client id.
        broker = f"{source.host}:{source.port}" if source.host else "the agent's broker (see broker)"
        if source.host:
            problem = tcp_problem(source.host, source.port, timeout_s, "source.host / source.port", "it")
            if problem:
                return Check(name, FAIL, *problem)
        return Check(name, OK, f"MQTT sensor topic {source.topic} on {broker}: reachable, not read")
    local = _local_path(source)
    if local is not None and not local[1].exists():
        what, path = local
        fix = (
            "plug the camera in, or fix source.uri (ls /dev/video* lists the cameras)"
            if what == "camera"
            else f"fix pipelines[{pipeline.name}].source.uri, or put the {what} there"
        )
        return Check(name, FAIL, f"{what} {path} does not exist", fix)
    seen = running.get("pipelines", {}).get(pipeline.name) if running and _exclusive(source) else None
    if isinstance(seen, dict) and running is not None:  # doctor would take it from the agent
        stats = seen.get("source") or {}
        state, error = stats.get("state") or seen.get("state"), stats.get("error") or seen.get("error")
        detail = f"read by the running agent (pid {running.get('pid')}): {state}"
        if state == "streaming":
            return Check(name, OK, detail)
        return Check(name, FAIL, detail + (f": {error}" if error else ""), _source_fix(source))
    outcome = check_source(source, timeout_s, until_first=True)
    uri = outcome["uri"]
    if outcome["ok"]:
        shape = "x".join(str(n) for n in outcome["shape"] or [])
        return Check(
            name, OK, f"{uri}: a frame after {outcome['first_after_s']} s ({shape} {outcome['dtype']})"
        )
    error = outcome["stats"]["error"]
    ended = outcome["stats"]["state"] == "finished"
    why = "it ended without one" if ended else f"none within {timeout_s:g} s"
    return Check(name, FAIL, f"{uri}: no frame, {why}" + (f": {error}" if error else ""), _source_fix(source))


def _source_fix(source: SourceConfig) -> str:
    from agent.sources.video import source_kind

    kind = source_kind(source.uri) if isinstance(source, VideoSourceConfig) else source.type
    return {
        "device": "check the camera (v4l2-ctl --list-devices) and that no other program holds it",
        "url": "check the URL, the camera's login and that it is reachable (edge-agent source URI)",
        "gstreamer": "try the pipeline with gst-launch-1.0; see edge-agent source URI",
        "serial": "check the port, its baud rate and that the sensor sends lines",
    }.get(kind, "try it with edge-agent source PIPELINE -c CONFIG, which says what comes")


# --- pipelines: backends --------------------------------------------------------------------


def check_backend_of(config: AgentConfig, pipeline: PipelineConfig) -> Check:
    """Does the backend the agent would serve the pipeline's model on (`current_choice`: its cached
    decision for this box, model and policy, else what a first start serves) load here? Nothing is
    run on the model, no decision is recorded."""
    from agent.backend_choice import current_choice, load_choice
    from agent.store import store_for
    from providers import BackendError
    from providers.select import NoBackendError

    name = f"backend:{pipeline.name}"
    ref = f"{pipeline.model.name}@{pipeline.model.version}"
    try:
        store = store_for(config)
        if not store.is_installed(pipeline.model.name, pipeline.model.version):
            return Check(
                name,
                WARN,
                f"not checked: {ref} is not in the store yet",
                "edge-agent models pull (the agent pulls it at start, too)",
            )
        installed = store.get(pipeline.model.name, pipeline.model.version)
    except EdgeAgentError as exc:
        return Check(name, FAIL, exc.message, exc.hint or "see the store row")
    # As another user (root), nothing is written where the agent keeps its files (Box.here and the
    # upgraded twins see to that; compiled engines go to a scratch dir).
    with _writable_state(config.state_dir) as scratch:
        try:
            choice = current_choice(
                config, pipeline, installed.model_artifacts(), ref, installed.testdata_artifacts()
            )
        except NoBackendError as exc:
            return Check(
                name,
                FAIL,
                f"no backend can run {ref}: {exc}",
                f"edge-agent models check {ref} says why; edge-agent providers lists this box's",
            )
        if scratch is not None:
            choice = replace(
                choice, policy=replace(choice.policy, options=_caches_in(choice.policy.options, scratch))
            )
        try:
            session, choice = load_choice(choice, f"doctor {ref}")
        except BackendError as exc:
            return Check(
                name,
                FAIL,
                f"{ref}: {exc}",
                f"edge-agent providers says what this box has; edge-agent models check {ref}",
            )
        serving = session.backend
        session.close()
    how = (
        "the agent's cached decision"
        if choice.cached
        else "not proven yet: what a first start serves until a frame proves the candidates"
    )
    artifact = choice.decision.artifact_on(serving) or choice.artifact
    detail = f"{ref}: {serving} loads {artifact} ({how})"
    if choice.load_failures:
        return Check(
            name,
            WARN,
            f"{detail}; the chosen one did not: {'; '.join(choice.load_failures)}",
            "edge-agent providers says what is missing for it; edge-agent explain PIPELINE",
        )
    return Check(name, OK, detail)


@contextlib.contextmanager
def _writable_state(state_dir: Path) -> Iterator[Path | None]:
    """None when doctor runs as the state dir's owner (compiled engines and upgraded models go
    where the agent keeps them); else a scratch dir for them, removed afterwards: files doctor
    made there as another user (root) would be in the agent's way."""
    try:
        own = state_dir.stat().st_uid == os.geteuid()
    except OSError:
        own = False
    if own:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="edge-agent-doctor-") as scratch:
        yield Path(scratch)


def _caches_in(options: Any, scratch: Path) -> dict[str, dict[str, Any]]:
    moved = {backend: dict(values) for backend, values in options.items()}
    for values in moved.values():
        for key in ("cache_dir", "engine_cache_dir"):
            if key in values:
                values[key] = str(scratch / "cache" / Path(values[key]).name)
    return moved


# --- the box ---------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_disk(state_dir: Path) -> Check:
    """Free space where the outbox, the model store and the decision cache are written."""
    usage = shutil.disk_usage(_existing(state_dir))
    share = usage.free / usage.total if usage.total else 0.0
    detail = f"{_size(usage.free)} free of {_size(usage.total)} ({share:.0%}) where {state_dir} is"
    fix = "free space: edge-agent models gc, journalctl --vacuum-size=100M, or a bigger disk"
    if usage.free < DISK_FAIL_BYTES:
        return Check("disk", FAIL, detail, fix)
    if usage.free < DISK_WARN_BYTES or share < DISK_WARN_SHARE:
        return Check("disk", WARN, detail, fix)
    return Check("disk", OK, detail)


def check_state_dir(state_dir: Path) -> Check:
    """The state dir holds the outbox (results), models and decisions: the agent's user must own
    and write it, and nobody else should read it."""
    me = user_name(os.geteuid())
    if not state_dir.exists():
        parent = _existing(state_dir)
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("state dir", OK, f"{state_dir} does not exist yet: the agent makes it (owner only)")
        return Check(
            "state dir",
            FAIL,
            f"{state_dir} does not exist and {me} cannot make it in {parent}",
            f"install -d -m 0700 -o {me} {state_dir}",
        )
    info = state_dir.stat()
    owner = user_name(info.st_uid)
    if not stat.S_ISDIR(info.st_mode):
        return Check("state dir", FAIL, f"{state_dir} is not a directory", "fix state_dir in the config")
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return Check(
            "state dir",
            FAIL,
            f"{state_dir} (owner {owner}) is not writable by {me}",
            f"chown -R {me} {state_dir}, if {me} is the user the agent runs as",
        )
    mode = stat.S_IMODE(info.st_mode)
    detail = f"{state_dir}: owner {owner}, mode {mode:04o}"
    if mode & 0o077:
        return Check(
            "state dir",
            WARN,
            f"{detail}: others can read the results, models and decisions in it",
            f"chmod 700 {state_dir}",
        )
    if info.st_uid != os.geteuid():
        return Check(
            "state dir",
            WARN,
            f"{detail}; doctor runs as {me}, so what it found is {me}'s access, not {owner}'s",
            f"run doctor as the agent's user: sudo -u {owner} edge-agent doctor",
        )
    return Check("state dir", OK, detail + ", writable")


def _configured_devices(config: AgentConfig | None) -> list[Path]:
    found = []
    for pipeline in config.pipelines if config is not None else []:
        local = _local_path(pipeline.source)
        if local is not None and local[0] in ("camera", "serial port"):
            found.append(local[1])
    return found


def check_devices(config: AgentConfig | None) -> Check:
    """Camera and accelerator device nodes (those present, and the cameras and serial ports the
    config names) must open for reading and writing as this user. One the config names that is
    not there is its source row's FAIL."""
    present = [Path(p) for pattern in DEVICE_PATTERNS for p in glob.glob(pattern)]
    nodes = sorted(p for p in {*present, *_configured_devices(config)} if _is_device(p))
    refused: dict[str, list[str]] = {}
    for node in nodes:
        if not os.access(node, os.R_OK | os.W_OK):
            refused.setdefault(group_name(node.stat().st_gid), []).append(str(node))
    me = user_name(os.geteuid())
    if refused:
        problems = [
            f"{me} cannot open {', '.join(paths)} (group {group})" for group, paths in refused.items()
        ]
        fix = f"usermod -aG {','.join(sorted(refused))} {me}, then restart the agent"
        return Check("devices", FAIL, "; ".join(problems), fix)
    if not nodes:
        return Check("devices", OK, "no camera or accelerator device nodes here")
    as_root = " (as root, who opens anything: run doctor as the agent's user)" if os.geteuid() == 0 else ""
    return Check("devices", OK, f"{', '.join(str(n) for n in nodes)}: read and write{as_root}")


def _is_device(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def check_secret_files(config_path: Path, config: AgentConfig) -> Check:
    """Passwords, tokens and private keys must not be readable by everyone on the box: the config
    file when it holds a password, and the files the config names for them."""
    inline = config.mqtt.password is not None or any(
        isinstance(p.source, MqttSourceConfig) and p.source.password is not None for p in config.pipelines
    )
    files: list[tuple[str, Path | None]] = [
        ("mqtt.password_file", config.mqtt.password_file),
        ("mqtt.tls.key_file", config.mqtt.tls.key_file if config.mqtt.tls else None),
        ("registry.password_file", config.registry.password_file if config.registry else None),
        ("registry.token_file", config.registry.token_file if config.registry else None),
    ]
    files += [
        (f"pipelines[{p.name}].source.password_file", p.source.password_file)
        for p in config.pipelines
        if isinstance(p.source, MqttSourceConfig)
    ]
    if inline:
        files.insert(0, ("the config, which holds a password,", config_path))
    exposed = []
    for key, path in files:
        with contextlib.suppress(OSError):
            if path is not None and path.stat().st_mode & stat.S_IROTH:
                exposed.append((key, path))
    if exposed:
        shown = ", ".join(f"{key} {path}" for key, path in exposed)
        paths = " ".join(str(path) for _, path in exposed)
        return Check(
            "secret files",
            WARN,
            f"readable by every user: {shown}",
            f"chmod o-rwx {paths} (0640 root:edge-agent, or 0600 owned by the agent's user)",
        )
    checked = [str(path) for _, path in files if path is not None]
    if not checked:
        return Check("secret files", OK, "no passwords, tokens or keys in files")
    return Check("secret files", OK, f"not readable by every user: {', '.join(checked)}")


def ntp_synchronized(timeout_s: float) -> bool | None:
    """Whether systemd says the clock is NTP-synchronised; None when it cannot tell."""
    timedatectl = shutil.which("timedatectl")
    if timedatectl is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [timedatectl, "show", "-p", "NTPSynchronized", "--value"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            answer = done.stdout.strip()
            if done.returncode == 0 and answer in ("yes", "no"):
                return answer == "yes"
    timesyncd = Path("/run/systemd/timesync")
    if timesyncd.is_dir():  # systemd-timesyncd runs: it creates this file once synchronised
        return (timesyncd / "synchronized").exists()
    return None


def check_clock(now: datetime | None = None, synchronized: bool | None = None) -> Check:
    """TLS certificates and model signatures have validity periods: a box whose clock is off (no
    real-time clock and no NTP) refuses good ones."""
    now = now or datetime.now(timezone.utc)
    shown = now.strftime("%Y-%m-%d %H:%M UTC")
    set_time = "timedatectl set-ntp true (a box without a real-time clock needs NTP at every boot)"
    if now.year < BUILD_YEAR:
        return Check(
            "clock", FAIL, f"the clock says {shown}: before this version was made ({BUILD_YEAR})", set_time
        )
    if now.year > BUILD_YEAR + FUTURE_YEARS:
        return Check("clock", WARN, f"the clock says {shown}: far in the future", set_time)
    if synchronized is False:
        return Check(
            "clock",
            WARN,
            f"{shown}, not synchronised with NTP",
            "timedatectl set-ntp true, and let the box reach an NTP server (UDP 123)",
        )
    ntp = "synchronised with NTP" if synchronized else "NTP sync status unknown (no systemd-timesyncd)"
    return Check("clock", OK, f"{shown}, {ntp}")
