"""The MQTT TLS and login tests' harness (tests/test_mqtt_tls_auth.py, test_mqtt_mtls.py,
test_supervisor_e2e.py): a TLS listener's lines for a throwaway PKI, started brokers, a recording
subscriber that can do TLS and credentials, the agent's connections on one outbox, and the checks that
one delivers or is refused. The fixtures (`brokers`, `watchers`, `outbox`, `connections`) are imported by
the modules that use them: other modules have fixtures of those names."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.mqtt import MqttConnection, Outbox, results_topic
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import DEVICE, OFFLINE, ONLINE, make_config
from tests.pki import Pki
from tests.waits import free_port, wait_until

STATUS_TOPIC = f"edge/{DEVICE}/status"
RESULTS_TOPIC = results_topic("edge", DEVICE, "people")
USER = "edge-box"
PASSWORD = "s3cret-pass"  # a throwaway test credential
# How many more attempts a connection that must fail is watched for (after the tests saw it refused
# at least once): each would have been the one that connects.
REFUSED_ATTEMPTS = 3


def tls_listener(pki: Pki, *, require_certificate: bool = False) -> str:
    lines = [f"cafile {pki.ca}", f"certfile {pki.server_cert}", f"keyfile {pki.server_key}"]
    if require_certificate:
        lines.append("require_certificate true")
    return "\n".join(lines)


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    """`start(**Mosquitto kwargs)` -> a started broker, closed after the test."""
    made: list[Mosquitto] = []

    def start(**kwargs: Any) -> Mosquitto:
        broker = Mosquitto(tmp_path / f"mosquitto-{len(made)}", **kwargs)
        made.append(broker)
        broker.start()
        return broker

    try:
        yield start
    finally:
        for broker in made:
            broker.close()


# -- a recording subscriber that can do TLS and credentials ---------------------------------------------


class Watcher:
    """A paho subscriber (MQTT 3.1.1, QoS 1) on `edge/<device>/#` that records (topic, payload)."""

    def __init__(
        self,
        broker: Mosquitto,
        *,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        username: str | None = None,
        password: str | None = None,
        insecure: bool = False,
        timeout_s: float = 30.0,
    ) -> None:
        self._cond = threading.Condition()
        self._messages: list[tuple[str, bytes]] = []
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"watcher-{free_port()}-{time.monotonic_ns()}"
        )
        if ca is not None:
            self.client.tls_set(
                ca_certs=str(ca),
                certfile=str(cert) if cert else None,
                keyfile=str(key) if key else None,
            )
            self.client.tls_insecure_set(insecure)  # a broker whose certificate is for another name
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()
        if not self._subscribed.wait(timeout_s):
            self.close()
            raise AssertionError(f"watcher got no SUBACK within {timeout_s} s:\n{broker.log_tail()}")

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if not reason.is_failure:
            client.subscribe(f"edge/{DEVICE}/#", 1)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._messages.append((message.topic, bytes(message.payload)))
            self._cond.notify_all()

    def statuses(self) -> list[bytes]:
        with self._cond:
            return [payload for topic, payload in self._messages if topic == STATUS_TOPIC]

    def result_ids(self) -> list[str]:
        with self._cond:
            return [json.loads(p)["id"] for topic, p in self._messages if topic == RESULTS_TOPIC]

    def wait_until(self, predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}: {self._messages}")
                self._cond.wait(remaining)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def watchers() -> Iterator[Callable[..., Watcher]]:
    made: list[Watcher] = []

    def make(broker: Mosquitto, **kwargs: Any) -> Watcher:
        watcher = Watcher(broker, **kwargs)
        made.append(watcher)
        return watcher

    try:
        yield make
    finally:
        for watcher in made:
            watcher.close()


# -- the agent's side -------------------------------------------------------------------------------


ConnectionFactory = Callable[..., MqttConnection]


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.db")
    try:
        yield box
    finally:
        box.close()


@pytest.fixture
def connections(outbox: Outbox) -> Iterator[ConnectionFactory]:
    """`connect(broker, protocol="5", **MqttConfig overrides)` -> a started MqttConnection on `outbox`."""
    made: list[MqttConnection] = []

    def connect(broker: Mosquitto, protocol: str = "5", **overrides: Any) -> MqttConnection:
        conn = MqttConnection(
            make_config(broker, protocol, **overrides), DEVICE, outbox, lambda: ONLINE, lambda: OFFLINE
        )
        made.append(conn)
        conn.start()
        return conn

    try:
        yield connect
    finally:
        for conn in made:
            conn.stop(publish_offline=False)


def put_results(conn: MqttConnection | None, outbox: Outbox, ids: list[str]) -> None:
    for result_id in ids:
        outbox.put(RESULTS_TOPIC, json.dumps({"id": result_id}).encode())
        if conn is not None:
            conn.notify_new_message()


def assert_delivers(
    conn: MqttConnection, outbox: Outbox, watcher: Watcher, queued: list[str], new: list[str]
) -> None:
    """`conn` connects, says online, and delivers the `queued` ids and `new` ones put once connected."""
    wait_until(lambda: conn.connected, "connected", state=conn.stats)
    watcher.wait_until(lambda: ONLINE in watcher.statuses(), "the birth message")
    put_results(conn, outbox, new)
    ids = queued + new
    watcher.wait_until(lambda: set(ids) <= set(watcher.result_ids()), f"results {ids}")
    assert conn.flush(30.0), f"outbox not empty: {outbox.pending()} left (stats: {conn.stats()})"
    stats = conn.stats()
    assert stats["connected"] and stats["connects"] == 1 and stats["last_error"] is None, stats
    assert stats["published"] == len(ids) and stats["rejected"] == 0, stats
    # Queued results go out oldest first, before the ones put after connecting (at-least-once: a
    # copy may come twice, so compare first arrivals).
    assert list(dict.fromkeys(i for i in watcher.result_ids() if i in ids)) == ids


def assert_never_connects(conn: MqttConnection, outbox: Outbox, queued: int) -> None:
    """`conn` keeps trying but never connects; the `queued` results stay put.

    Waits for REFUSED_ATTEMPTS more connection attempts rather than for a while: a connection that
    held would make no more (and one that connected at all would count in `connects`). The attempts
    are MqttConnection's own count, one per paho `on_pre_connect`: the only place they show."""
    start = conn._attempts
    wait_until(
        lambda: conn._attempts >= start + REFUSED_ATTEMPTS,
        f"{REFUSED_ATTEMPTS} more connection attempts",
        timeout=60.0,
        state=conn.stats,
    )
    stats = conn.stats()
    assert not stats["connected"] and stats["connects"] == 0 and stats["published"] == 0, stats
    assert stats["inflight"] == 0 and stats["rejected"] == 0, stats
    assert outbox.pending() == queued
    assert not conn.flush(0.2)


def assert_refused(conn: MqttConnection, outbox: Outbox, queued: int, error_words: tuple[str, ...]) -> str:
    """Like `assert_never_connects`, and `last_error` names one of `error_words` (lower case); returns
    that error. (A later attempt may read less: TLS 1.3 brokers can close before their alert is read.)"""
    named: list[str] = []

    def names_one() -> bool:
        error = str(conn.stats()["last_error"] or "")
        if any(w in error.lower() for w in error_words):
            named.append(error)
        return bool(named)

    wait_until(names_one, f"last_error naming one of {error_words}", timeout=30.0, state=conn.stats)
    assert_never_connects(conn, outbox, queued)
    return named[0]


def plain_client_connects(broker: Mosquitto, timeout_s: float = 30.0) -> bool:
    """Whether a client without TLS gets connected to `broker`: waits for the broker's answer (a
    CONNACK, or the connection closed), not for a fixed time that a busy machine could overrun."""
    answered = threading.Event()
    connacks: list[bool] = []

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        connacks.append(not reason.is_failure)
        answered.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"plain-{time.monotonic_ns()}")
    client.on_connect = on_connect
    client.on_disconnect = lambda *args: answered.set()
    try:
        client.connect(broker.host, broker.port, keepalive=5)
    except OSError:
        return False
    client.loop_start()
    try:
        answered.wait(timeout_s)
        return any(connacks)
    finally:
        client.disconnect()
        client.loop_stop()


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    crashed = [r for r in caplog.records if r.exc_info or "Caught exception" in r.getMessage()]
    assert not crashed, [r.getMessage() for r in crashed]
