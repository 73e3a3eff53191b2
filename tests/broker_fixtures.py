"""The checked-in broker configs (configs/mosquitto/) on real mosquittos, for the tests that run them
(tests/test_broker_configs.py, whose docstring says what is exercised, test_fleet_bridge.py,
test_fleet_commands.py): rendering the configs with a test's ports and paths, a password file made by
`mosquitto_passwd`, and factories of started brokers and of logged-in MQTT clients that record what they
get. The fixtures (`passwd`, `brokers`, `clients`) are imported by the modules that use them: other
modules have fixtures of those names."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tests.mosquitto import Mosquitto
from tests.pki import Pki, run_tool, tool
from tests.waits import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs" / "mosquitto"
ACL = CONFIGS / "acl"
USERS = ("cam-01", "cam-02", "cam-03", "controller", "site-north", "homeassistant")
PASSWORDS = {user: f"test-password-{user}" for user in USERS}  # throwaway test credentials
TIMEOUT_S = 30.0


# -- rendering the checked-in configs for a test -------------------------------------------------------


def render_config(text: str, edits: Mapping[str, str | None]) -> str:
    """`text` with the line of each directive in `edits` replaced by its new line (None: uncommented
    as it is). A key names the directive as the line starts: `listener`, or `#listener` for the
    commented-out one. Each must be on exactly one line, so a changed config fails here, loudly."""
    lines = text.splitlines()
    for key, new in edits.items():
        found = [i for i, line in enumerate(lines) if line.split(" ", 1)[0] == key]
        assert len(found) == 1, f"{key!r} is on {len(found)} lines of the config, expected exactly one"
        lines[found[0]] = new if new is not None else lines[found[0]].removeprefix("#")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Tls:
    pki: Pki
    port: int


def broker_config(broker: Mosquitto, passwd: Path, conf_d: Path, tls: Tls | None = None) -> str:
    """configs/mosquitto/mosquitto.conf for `broker`: its port and tmp paths (module docstring)."""
    edits: dict[str, str | None] = {
        "listener": f"listener {broker.port} {broker.host}",
        "password_file": f"password_file {passwd}",
        "acl_file": f"acl_file {ACL}",
        "persistence_location": f"persistence_location {broker.workdir}/",
        "pid_file": f"pid_file {broker.workdir / 'mosquitto.pid'}",
        "log_dest": "log_dest stderr",  # unbuffered, into the log Mosquitto keeps
        "include_dir": f"include_dir {conf_d}",
    }
    if tls is not None:
        edits |= {
            "#listener": f"listener {tls.port} 127.0.0.1",
            "#cafile": f"cafile {tls.pki.ca}",
            "#certfile": f"certfile {tls.pki.server_cert}",
            "#keyfile": f"keyfile {tls.pki.server_key}",
            "#tls_version": None,
        }
    return render_config((CONFIGS / "mosquitto.conf").read_text(), edits)


def bridge_config(central: Tls, **edits: str) -> str:
    """configs/mosquitto/bridge-site.conf bridging to `central`'s TLS listener on loopback."""
    base: dict[str, str | None] = {
        "address": f"address 127.0.0.1:{central.port}",
        "#bridge_cafile": f"bridge_cafile {central.pki.ca}",
        "remote_password": f"remote_password {PASSWORDS['site-north']}",
    }
    return render_config((CONFIGS / "bridge-site.conf").read_text(), base | edits)


def config_value(name: str, path: Path = CONFIGS / "mosquitto.conf") -> str:
    values = [line.split(" ", 1)[1] for line in path.read_text().splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name} is set {len(values)} times in {path}"
    return values[0]


@pytest.fixture(scope="module")
def passwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A password file for USERS made by mosquitto_passwd (fails, not skips, when it is missing)."""
    mosquitto_passwd = tool("mosquitto_passwd", "mosquitto")
    workdir = tmp_path_factory.mktemp("passwd")
    path = workdir / "passwd"
    for i, user in enumerate(USERS):
        create = ["-c"] if i == 0 else []
        run_tool([mosquitto_passwd, "-b", *create, str(path), user, PASSWORDS[user]], workdir)
    os.chmod(path, 0o600)
    return path


BrokerFactory = Callable[..., Mosquitto]


@pytest.fixture
def brokers(tmp_path: Path, passwd: Path) -> Iterator[BrokerFactory]:
    """`start(name, tls=None, bridge=None)` -> a started broker running the checked-in config (with
    `bridge` text as conf.d/bridge-site.conf); closed after the test."""
    made: list[Mosquitto] = []

    def start(name: str, tls: Tls | None = None, bridge: str | None = None) -> Mosquitto:
        workdir = tmp_path / name
        conf_d = workdir / "conf.d"
        conf_d.mkdir(parents=True)
        if bridge is not None:
            (conf_d / "bridge-site.conf").write_text(bridge)
            os.chmod(conf_d / "bridge-site.conf", 0o600)
        broker = Mosquitto(workdir, config=lambda b: broker_config(b, passwd, conf_d, tls))
        made.append(broker)
        broker.start()
        if tls is not None:
            wait_until(lambda: _listening(tls.port), f"the TLS listener on {tls.port}", timeout=TIMEOUT_S)
        return broker

    try:
        yield start
    finally:
        for broker in made:
            broker.close()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# -- a logged-in MQTT client that records what it gets and how its publishes were answered --------------


@dataclass(frozen=True)
class Got:
    topic: str
    payload: bytes
    retain: bool
    properties: Properties | None


class Client:
    """paho, logged in as `user` (MQTT 5 or 3.1.1). Records every message (with its MQTT 5 properties),
    every PUBACK reason code and every disconnect; every wait is bounded."""

    def __init__(
        self,
        broker: Mosquitto,
        user: str,
        protocol: str = "5",
        client_id: str | None = None,
        session_expiry_s: int | None = None,
    ) -> None:
        self.broker = broker
        self.user = user
        self.v5 = protocol == "5"
        self._cond = threading.Condition()
        self.received: list[Got] = []
        self._acks: dict[int, ReasonCode] = {}
        self._subacks: dict[int, list[ReasonCode]] = {}
        self.connacks: list[tuple[ReasonCode, Properties | None]] = []
        self.disconnects: list[ReasonCode] = []
        cid = client_id or f"test-{user}-{free_port()}-{time.monotonic_ns()}"
        if self.v5:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
        else:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311, clean_session=True
            )
        self.client.username_pw_set(user, PASSWORDS[user])
        # A client kicked off (session taken over) must not kick the other one straight back.
        self.client.reconnect_delay_set(5, 5)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        connect_props = None
        if session_expiry_s is not None:
            connect_props = Properties(PacketTypes.CONNECT)
            connect_props.SessionExpiryInterval = session_expiry_s
        self.client.connect(
            broker.host,
            broker.port,
            keepalive=10,
            clean_start=session_expiry_s is None if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=connect_props,
        )
        self.client.loop_start()
        self._wait(lambda: bool(self.connacks), "CONNACK")
        assert not self.connacks[0][0].is_failure, f"{user} refused: {self.connacks[0][0]}"

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self.connacks.append((reason, props))
            self._cond.notify_all()

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self.disconnects.append(reason)
            self._cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        props = getattr(message, "properties", None)
        with self._cond:
            self.received.append(Got(message.topic, bytes(message.payload), bool(message.retain), props))
            self._cond.notify_all()

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        with self._cond:
            self._acks[mid] = reason
            self._cond.notify_all()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._cond:
            self._subacks[mid] = list(reasons)
            self._cond.notify_all()

    def _wait(self, condition: Callable[[], object], what: str, timeout: float = TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    got = [(g.topic, g.payload[:60]) for g in self.received[-10:]]
                    raise AssertionError(
                        f"{self.user}: timed out after {timeout} s waiting for {what}; last received "
                        f"{got}\n{self.broker.log_tail()}"
                    )
                self._cond.wait(remaining)

    def subscribe(self, *filters: str) -> list[ReasonCode]:
        result, mid = self.client.subscribe([(f, 1) for f in filters])
        assert result == mqtt.MQTT_ERR_SUCCESS and mid is not None
        self._wait(lambda: mid in self._subacks, f"SUBACK for {filters}")
        return self._subacks[mid]

    def publish(
        self, topic: str, payload: bytes, retain: bool = False, properties: Properties | None = None
    ) -> ReasonCode:
        """QoS 1; returns the broker's answer (MQTT 3.1.1 PUBACKs carry none: always Success)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"paho could not send to {topic}: {info.rc}"
        self._wait(lambda: info.mid in self._acks, f"PUBACK for {topic}")
        return self._acks[info.mid]

    def wait_for(self, topic: str, payload: bytes | None = None, timeout: float = TIMEOUT_S) -> Got:
        def match() -> Got | None:
            return next((g for g in self.received if g.topic == topic and payload in (None, g.payload)), None)

        self._wait(lambda: match() is not None, f"{topic} {payload!r}", timeout)
        found = match()
        assert found is not None
        return found

    def topics(self) -> set[str]:
        with self._cond:
            return {g.topic for g in self.received}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


ClientFactory = Callable[..., Client]


@pytest.fixture
def clients() -> Iterator[ClientFactory]:
    made: list[Client] = []

    def make(broker: Mosquitto, user: str, **kwargs: Any) -> Client:
        client = Client(broker, user, **kwargs)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            client.close()


def prop(properties: Properties | None, name: str) -> Any:
    """An MQTT 5 property of a received message, None when it is absent."""
    return getattr(properties, name, None)


def request_properties(response_topic: str, correlation: bytes) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = response_topic
    props.CorrelationData = correlation
    props.UserProperty = [("sent-by", "test")]
    props.MessageExpiryInterval = 120
    return props
