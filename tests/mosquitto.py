"""A real mosquitto broker on a free loopback port, and a paho subscriber that records what it gets.

Used by the MQTT tests (and by anything else that needs a broker): nothing here patches paho.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.waits import free_port

# Generous: a loaded machine can take seconds to start a process; a healthy start costs nothing extra.
START_TIMEOUT_S = 30.0


def find_mosquitto() -> str:
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
    return found


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class Mosquitto:
    """mosquitto listening on 127.0.0.1:<free port>; `restart()` keeps the port.

    `persistence=True` keeps sessions and queued QoS 1 messages across `restart()` (written on
    the clean shutdown that `stop()` does), which tests need to prove nothing is lost.
    `extra_config` lines are appended to the generated config (e.g. `allow_anonymous false`).
    `config` replaces the generated config: it gets this broker (host, port, workdir) and returns the
    whole file, which must listen on `port` (tests of checked-in broker configs render them with it).
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        persistence: bool = False,
        allow_anonymous: bool = True,
        extra_config: str = "",
        config: Callable[[Mosquitto], str] | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mosquitto-")
            workdir = Path(self._tmp.name)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.binary = find_mosquitto()
        self.config_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        lines = [
            f"listener {self.port} {self.host}",
            f"allow_anonymous {'true' if allow_anonymous else 'false'}",
            f"persistence {'true' if persistence else 'false'}",
            f"persistence_location {self.workdir}/",
            # Offline persistent sessions may queue more than the default 1000 in long tests.
            "max_queued_messages 100000",
            "log_type all",
            extra_config,
        ]
        if config is not None:
            lines = [config(self)]
        if os.geteuid() == 0:
            # As root, mosquitto drops to the "mosquitto" user, which cannot read our 0700 tmp dirs
            # (ACL files, persistence): stay the user we are.
            lines.append(f"user {pwd.getpwuid(os.geteuid()).pw_name}")
        self.persistence_file = self.workdir / "mosquitto.db"
        self.config_path.write_text("\n".join(lines) + "\n")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if self.running:
            return
        log_file = self.log_path.open("ab")
        try:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(self.config_path)], stdout=log_file, stderr=subprocess.STDOUT
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self._proc.returncode}:\n{self.log_tail()}")
            if _port_open(self.host, self.port):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(
            f"mosquitto did not listen on {self.port} within {timeout_s} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Clean shutdown (SIGTERM): with persistence on, sessions and queues are saved."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def refusing_acl(workdir: Path, *, subscribe: list[str], publish: list[str]) -> str:
    """Config lines for a broker whose anonymous clients may subscribe only to `subscribe` and
    publish only to `publish` (filters), and are refused anything else at SUBSCRIBE time.

    mosquitto's acl_file grants every SUBSCRIBE and filters at delivery; its dynamic-security
    plugin (in Debian's mosquitto package) answers a forbidden SUBSCRIBE with a failure SUBACK.
    """
    acls = [{"acltype": "subscribePattern", "topic": t, "allow": True} for t in subscribe]
    acls += [{"acltype": "publishClientSend", "topic": t, "allow": True} for t in publish]
    rules = {
        "defaultACLAccess": {
            "publishClientSend": False, "publishClientReceive": True, "subscribe": False, "unsubscribe": True,
        },
        "clients": [],
        "anonymousGroup": "anonymous",
        "groups": [{"groupname": "anonymous", "roles": [{"rolename": "anonymous"}], "clients": []}],
        "roles": [{"rolename": "anonymous", "acls": acls}],
    }  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "dynamic-security.json"
    path.write_text(json.dumps(rules))
    plugins = sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))
    if not plugins:
        raise RuntimeError("mosquitto_dynamic_security.so not found (it comes with Debian's mosquitto)")
    return f"plugin {plugins[0]}\nplugin_opt_config_file {path}"


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool


class Subscriber:
    """A paho client that subscribes to `topic_filter` and records every message.

    `persistent=True` uses a persistent session (MQTT 3.1.1, clean_session false, QoS 1): with a
    broker started with persistence, messages published while this subscriber is away (even
    across a broker restart) are queued and delivered when it is back. `username`/`password`: a
    login, for brokers that refuse anonymous clients.
    """

    def __init__(
        self,
        host: str,
        port: int,
        topic_filter: str,
        *,
        qos: int = 1,
        persistent: bool = False,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.topic_filter = topic_filter
        self._cond = threading.Condition()
        self._messages: list[Received] = []
        self._subscribed = threading.Event()
        self._qos = qos
        cid = client_id or f"test-sub-{free_port()}-{time.monotonic_ns()}"
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311, clean_session=not persistent
        )
        self.client.reconnect_delay_set(cast_delay(0.1), cast_delay(0.5))
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.connect(host, port, keepalive=10)
        self.client.loop_start()
        if not self._subscribed.wait(timeout_s):
            self.close()
            raise TimeoutError(f"no SUBACK for {topic_filter} within {timeout_s} s")

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if not reason.is_failure:
            client.subscribe(self.topic_filter, self._qos)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._messages.append(Received(message.topic, bytes(message.payload), bool(message.retain)))
            self._cond.notify_all()

    @property
    def messages(self) -> list[Received]:
        with self._cond:
            return list(self._messages)

    def wait_until(
        self, predicate: Callable[[list[Received]], bool], timeout: float = 30.0
    ) -> list[Received]:
        """Wait until `predicate(messages)` holds; AssertionError (with what arrived) on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._messages):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    got = [(m.topic, m.payload[:80], m.retain) for m in self._messages[-20:]]
                    raise AssertionError(
                        f"timed out after {timeout} s; {len(self._messages)} messages, last: {got}"
                    )
                self._cond.wait(remaining)
            return list(self._messages)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Wait until at least `count` messages arrived; returns them all."""
        return self.wait_until(lambda msgs: len(msgs) >= count, timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def cast_delay(seconds: float) -> int:
    # paho annotates reconnect delays as int but accepts floats; tests want sub-second retries.
    return seconds  # type: ignore[return-value]
