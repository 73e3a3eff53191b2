"""A full outbox does not wait to reconnect: every moment offline costs results (the when_full policy),
so once the broker's port is open again the agent connects at once, with no random spread, and the
drops stop within one connect time (plus the pressed probe's period: the agent cannot know sooner).
Real mosquitto, stopped and started again under a producer that keeps the outbox full."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import MqttConfig, OutboxConfig
from agent.mqtt import MqttConnection, Outbox, results_topic
from agent.mqtt.connection import _PROBE_PRESSED_S
from agent.mqtt.outbox import OutboxFull
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DEVICE = "dev1"
CAPACITY = 200
EVERY_S = 0.02  # the producer: 50 results a second


def _one_connect_s(broker: Mosquitto) -> float:
    """What a connect to the restarted broker takes: a fresh client's CONNECT/CONNACK and one QoS 1
    publish acknowledged."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"probe-{time.monotonic_ns()}")
    began = time.monotonic()
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        sent = client.publish("probe/connect", b"x", qos=1)
        sent.wait_for_publish(timeout=10)
        assert sent.is_published()
        return time.monotonic() - began
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("when_full", ["drop-oldest", "drop-newest"])
@pytest.mark.slow
def test_a_full_outbox_reconnects_at_once_and_drops_nothing_after_the_broker_is_back(
    tmp_path: Path, mosquitto: Mosquitto, when_full: str
) -> None:
    outbox = Outbox(tmp_path / "outbox.db", max_messages=CAPACITY, when_full=when_full)
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, reconnect_min_s=1.0, reconnect_max_s=60.0,
                        outbox=OutboxConfig(max_inflight=10))  # fmt: skip
    conn = MqttConnection(config, DEVICE, outbox, lambda: b"online", lambda: b"offline")
    samples: list[tuple[float, int]] = []  # after each put: when, and the drops so far
    stop = threading.Event()

    def produce() -> None:
        topic = results_topic("edge", DEVICE, "people")
        for n in range(6000):  # bounded: 2 minutes at 50 a second
            if stop.wait(EVERY_S):
                return
            with contextlib.suppress(OutboxFull):  # drop-newest refuses it: counted by the outbox
                outbox.put(topic, json.dumps({"id": f"r{n}"}).encode())
            conn.notify_new_message()
            samples.append((time.monotonic(), outbox.dropped))

    producer = threading.Thread(target=produce, name="producer", daemon=True)
    try:
        conn.start()
        wait_until(lambda: conn.connected, "the first connection", timeout=30)
        mosquitto.stop()
        wait_until(lambda: not conn.connected, "the broker gone", timeout=30)
        producer.start()
        # Full and dropping (the connection meanwhile in its reconnect attempts).
        wait_until(lambda: outbox.dropped > 20, "the outbox to overflow", timeout=60,
                   state=lambda: (outbox.pending(), outbox.dropped, conn._attempts))  # fmt: skip
        mosquitto.start()
        opened = time.monotonic()
        connect_s = _one_connect_s(mosquitto)
        wait_until(lambda: conn.connected, "reconnected", timeout=30)
        reconnected = time.monotonic() - opened
        wait_until(lambda: outbox.pending() < CAPACITY // 2, "the backlog to drain", timeout=60)
        stop.set()
        producer.join(10)
        assert not producer.is_alive()
    finally:
        stop.set()
        conn.stop(publish_offline=False)
        outbox.close()
    allowed = opened + connect_s + _PROBE_PRESSED_S
    at_allowed = max((dropped for when, dropped in samples if when <= allowed), default=0)
    later = [
        (round(when - opened, 3), dropped)
        for when, dropped in samples
        if when > allowed and dropped > at_allowed
    ]
    print(f"{when_full}: reconnected {reconnected:.3f} s after the port opened (one connect: "
          f"{connect_s:.3f} s); {at_allowed} dropped before, {len(later)} puts dropped after")  # fmt: skip
    assert at_allowed > 20  # the outage did overflow it
    assert later == []
