"""pytest fixtures: a real mosquitto per test, a factory of recording subscribers, and a factory of
`MqttConnection`s (device DEVICE, each with its own outbox, stopped after the test); publishing one
message with a plain client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import MqttConfig, OutboxConfig
from agent.mqtt import MqttConnection, Outbox
from tests.mosquitto import Mosquitto, Subscriber

SubscriberFactory = Callable[..., Subscriber]


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A started broker on 127.0.0.1:<free port>, stopped after the test."""
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def mqtt_subscriber_factory() -> Iterator[SubscriberFactory]:
    """`factory(broker, topic_filter, **kwargs)` -> a connected, subscribed `Subscriber`; closed after."""
    made: list[Subscriber] = []

    def factory(broker: Mosquitto, topic_filter: str, **kwargs: Any) -> Subscriber:
        sub = Subscriber(broker.host, broker.port, topic_filter, **kwargs)
        made.append(sub)
        return sub

    yield factory
    for sub in made:
        sub.close()


# --- the agent's own MQTT connection ----------------------------------------------------------------

DEVICE = "dev1"
ONLINE = b'{"state": "online"}'
OFFLINE = b'{"state": "offline"}'

ConnectionFactory = Callable[..., tuple[MqttConnection, Outbox]]


def make_config(broker: Mosquitto, protocol: str, **overrides: Any) -> MqttConfig:
    values: dict[str, Any] = {
        "host": broker.host,
        "port": broker.port,
        "protocol": protocol,
        "keepalive_s": 5,
        "reconnect_min_s": 0.1,
        "reconnect_max_s": 0.5,
        "outbox": OutboxConfig(max_inflight=10),
    }
    values.update(overrides)
    return MqttConfig(**values)


@pytest.fixture
def connection_factory(tmp_path: Path) -> Iterator[ConnectionFactory]:
    made: list[tuple[MqttConnection, Outbox]] = []

    def factory(broker: Mosquitto, protocol: str, **overrides: Any) -> tuple[MqttConnection, Outbox]:
        outbox = Outbox(tmp_path / f"outbox-{len(made)}.db")
        conn = MqttConnection(
            make_config(broker, protocol, **overrides), DEVICE, outbox, lambda: ONLINE, lambda: OFFLINE
        )
        made.append((conn, outbox))
        return conn, outbox

    yield factory
    for conn, outbox in made:
        conn.stop(publish_offline=False)
        outbox.close()


def publish_one(broker: Mosquitto, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-pub-{time.monotonic_ns()}")
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        sent = client.publish(topic, payload, qos=1)
        sent.wait_for_publish(timeout=30)
        assert sent.is_published(), f"the broker did not acknowledge the test message on {topic}"
    finally:
        client.disconnect()
        client.loop_stop()
