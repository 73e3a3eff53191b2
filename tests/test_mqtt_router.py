"""The MQTT router on a real mosquitto: handlers get the MQTT 5 properties, run off paho's network
thread, a failing handler is contained, and `reply()` answers where the requester waits (MQTT 5
response topic + correlation data; `<topic>/reply` under MQTT 3.1.1)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.mqtt.message import Message
from agent.mqtt.router import Router
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import DEVICE, ConnectionFactory
from tests.waits import wait_until


class Requester:
    """A controller's side: sends requests and collects the answers on its own topic."""

    def __init__(self, broker: Mosquitto, protocol: str) -> None:
        version = mqtt.MQTTv5 if protocol == "5" else mqtt.MQTTv311
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"requester-{time.monotonic_ns()}", protocol=version
        )
        self.answers: list[mqtt.MQTTMessage] = []
        self.subscribed = threading.Event()
        self.client.on_message = lambda _c, _u, message: self.answers.append(message)
        self.client.on_subscribe = lambda *_args: self.subscribed.set()
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def listen(self, topic: str) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic, qos=1)
        assert self.subscribed.wait(30), f"no SUBACK for {topic}"

    def send(self, topic: str, payload: bytes, properties: Properties | None = None) -> None:
        sent = self.client.publish(topic, payload, qos=1, properties=properties)
        sent.wait_for_publish(timeout=30)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def requesters() -> Iterator[list[Requester]]:
    made: list[Requester] = []
    yield made
    for requester in made:
        requester.close()


def test_requests_get_their_properties_and_answers_with_the_correlation_data(
    mosquitto: Mosquitto, connection_factory: ConnectionFactory, requesters: list[Requester]
) -> None:
    conn, _ = connection_factory(mosquitto, "5")
    router = Router(conn)
    seen: list[tuple[Message, str]] = []

    def ping(message: Message) -> None:
        seen.append((message, threading.current_thread().name))
        router.reply(message, {"pong": json.loads(message.payload)["n"]})

    def broken(message: Message) -> None:
        raise RuntimeError("handler bug")

    router.route(f"edge/{DEVICE}/cmd/ping", ping)
    router.route(f"edge/{DEVICE}/cmd/+", broken)
    conn.start()
    wait_until(lambda: set(conn.stats()["subscriptions"].values()) == {"active"}, "SUBACKs", state=conn.stats)

    requester = Requester(mosquitto, "5")
    requesters.append(requester)
    requester.listen("controller/answers")
    for n in range(3):
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = "controller/answers"
        properties.CorrelationData = f"req-{n}".encode()
        properties.UserProperty = [("idempotency-key", f"k{n}")]
        properties.MessageExpiryInterval = 60
        requester.send(f"edge/{DEVICE}/cmd/ping", json.dumps({"n": n}).encode(), properties)
    wait_until(lambda: len(requester.answers) == 3, "three answers")

    answers = {bytes(a.properties.CorrelationData): json.loads(a.payload) for a in requester.answers}
    assert answers == {b"req-0": {"pong": 0}, b"req-1": {"pong": 1}, b"req-2": {"pong": 2}}
    assert {a.properties.ContentType for a in requester.answers} == {"application/json"}
    message, thread = seen[0]
    assert message.response_topic == "controller/answers" and message.correlation_data == b"req-0"
    assert message.user_properties == (("idempotency-key", "k0"),)
    assert message.expiry_s is not None and 0 < message.expiry_s <= 60
    assert message.retain is False
    assert thread == "mqtt-handlers"  # the connection's dispatcher, not paho's network thread
    # The broken handler failed on every request, was contained and counted; ping still answered.
    # (The answer to the third request can arrive before the broken handler has run on it.)
    wait_until(lambda: router.stats()[f"edge/{DEVICE}/cmd/+"]["messages"] == 3, "the third failure counted")
    assert router.stats() == {
        f"edge/{DEVICE}/cmd/ping": {"messages": 3, "failures": 0},
        f"edge/{DEVICE}/cmd/+": {"messages": 3, "failures": 3},
    }


def test_mqtt_3_1_1_answers_go_to_the_request_topic_plus_reply(
    mosquitto: Mosquitto, connection_factory: ConnectionFactory, requesters: list[Requester]
) -> None:
    conn, _ = connection_factory(mosquitto, "3.1.1")
    router = Router(conn)
    router.route(f"edge/{DEVICE}/cmd/status", lambda message: router.reply(message, b"fine"))
    conn.start()
    wait_until(lambda: set(conn.stats()["subscriptions"].values()) == {"active"}, "SUBACK", state=conn.stats)
    requester = Requester(mosquitto, "3.1.1")
    requesters.append(requester)
    requester.listen(f"edge/{DEVICE}/cmd/status/reply")
    requester.send(f"edge/{DEVICE}/cmd/status", b"{}")
    wait_until(lambda: len(requester.answers) == 1, "the answer")
    assert requester.answers[0].topic == f"edge/{DEVICE}/cmd/status/reply"
    assert requester.answers[0].payload == b"fine"


def test_a_reply_without_a_link_says_so(connection_factory: ConnectionFactory, mosquitto: Mosquitto) -> None:
    conn, _ = connection_factory(mosquitto, "5")  # never started: no link
    router = Router(conn)
    assert router.reply(Message("edge/dev1/cmd/ping", b"{}", response_topic="x"), {"pong": 1}) is False
    with pytest.raises(ValueError, match="invalid MQTT topic filter"):
        router.route("edge/#/bad", lambda message: None)
