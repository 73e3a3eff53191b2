"""MqttConnection against a real mosquitto (paho not patched): presence, outbox delivery, subscriptions."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.config import OutboxConfig
from agent.mqtt import MqttConnection, Outbox, results_topic
from tests.mosquitto import Mosquitto, Subscriber, cast_delay, refusing_acl
from tests.mqtt_fixtures import (
    DEVICE,
    OFFLINE,
    ONLINE,
    ConnectionFactory,
    SubscriberFactory,
    make_config,
    publish_one,
)
from tests.tcp_proxy import CuttableProxy
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ["5", "3.1.1"]


def put_results(conn: MqttConnection, outbox: Outbox, ids: list[str], pause_s: float = 0.0) -> None:
    topic = results_topic("edge", DEVICE, "people")
    for result_id in ids:
        outbox.put(topic, json.dumps({"id": result_id}).encode())
        conn.notify_new_message()
        if pause_s:
            time.sleep(pause_s)


def received_ids(sub: Subscriber) -> list[str]:
    return [json.loads(m.payload)["id"] for m in sub.messages if "/results/" in m.topic]


def first_occurrences(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


# -- presence ---------------------------------------------------------------------------------------

_CHILD = """
import sys, time
from pathlib import Path
from agent.config import MqttConfig
from agent.mqtt import MqttConnection, Outbox
config = MqttConfig.model_validate_json(sys.argv[1])
outbox = Outbox(Path(sys.argv[2]))
conn = MqttConnection(config, "dev1", outbox, lambda: b'{"state": "online"}', lambda: b'{"state": "offline"}')
conn.start()
time.sleep(60)
"""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_birth_is_retained_and_the_will_says_offline_when_killed(
    protocol: str, mosquitto: Mosquitto, mqtt_subscriber_factory: SubscriberFactory, tmp_path: Path
) -> None:
    status = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    config = make_config(mosquitto, protocol)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, config.model_dump_json(), str(tmp_path / "child-outbox.db")], cwd=ROOT
    )
    try:
        status.wait_until(lambda msgs: any(m.payload == ONLINE for m in msgs), timeout=15)
        # A watcher that comes later still sees the box online: the birth is retained.
        late = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
        assert late.wait_for(1)[0].payload == ONLINE and late.messages[0].retain

        # SIGKILL: the socket closes without DISCONNECT, so the broker publishes the last will.
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        status.wait_until(lambda msgs: msgs[-1].payload == OFFLINE, timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=5)
    later = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    msg = later.wait_for(1)[0]
    assert (msg.payload, msg.retain) == (OFFLINE, True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_lost_socket_reconnects_with_birth_and_resubscribes(
    protocol: str,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    connection_factory: ConnectionFactory,
) -> None:
    status = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    conn, _ = connection_factory(mosquitto, protocol)
    got: list[bytes] = []
    commands = f"edge/{DEVICE}/cmd/+"
    conn.subscribe(commands, lambda topic, payload: got.append(payload))  # before start
    assert conn.stats()["subscriptions"] == {commands: "pending"}
    conn.start()
    status.wait_until(lambda msgs: [m.payload for m in msgs] == [ONLINE])
    wait_until(lambda: conn.connected, what="connected")
    wait_until(lambda: conn.stats()["subscriptions"] == {commands: "active"}, what="SUBACK",
               state=conn.stats)  # fmt: skip

    # The broker saw the protocol the config asked for (mosquitto logs p5 / p2 for 3.1.1) and the
    # default client id.
    assert f"as edge-agent-{DEVICE} (p{5 if protocol == '5' else 2}" in mosquitto.log_tail(200)

    sock = conn._client.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)  # the link dies without DISCONNECT

    # Will, then a fresh birth after paho's reconnect.
    status.wait_until(lambda msgs: [m.payload for m in msgs] == [ONLINE, OFFLINE, ONLINE])
    wait_until(lambda: conn.stats()["connects"] == 2 and conn.connected, what="reconnect")
    assert conn.stats()["disconnects"] == 1

    # The subscription registered before the first connect was renewed on the new connection:
    # once the broker has acknowledged it there (before that a command could pass it by).
    wait_until(lambda: conn.stats()["subscriptions"] == {commands: "active"}, what="SUBACK after reconnect",
               timeout=30, state=conn.stats)  # fmt: skip
    publish_one(mosquitto, f"edge/{DEVICE}/cmd/ping", b"after-reconnect")
    wait_until(lambda: got == [b"after-reconnect"], what="command after reconnect")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_subscription_the_broker_refuses_is_named_and_the_others_work(
    protocol: str, tmp_path: Path, connection_factory: ConnectionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Anonymous clients may subscribe to this device's commands and publish under its prefix.
    extra = refusing_acl(tmp_path / "acl", subscribe=[f"edge/{DEVICE}/cmd/#"], publish=[f"edge/{DEVICE}/#"])
    with Mosquitto(tmp_path / "dynsec-broker", extra_config=extra) as broker:
        conn, _ = connection_factory(broker, protocol)
        got: list[bytes] = []
        allowed, forbidden = f"edge/{DEVICE}/cmd/+", "edge/other-device/cmd/+"
        with caplog.at_level(logging.ERROR, logger="agent.mqtt.connection"):
            conn.subscribe(allowed, lambda topic, payload: got.append(payload))
            conn.subscribe(forbidden, lambda topic, payload: got.append(b"stranger: " + payload))
            conn.start()
            wait_until(lambda: "pending" not in conn.stats()["subscriptions"].values(), what="SUBACKs",
                       timeout=30, state=conn.stats)  # fmt: skip
        states = conn.stats()["subscriptions"]
        assert states[allowed] == "active"
        # MQTT 5 says why (0x87); MQTT 3.1.1 has one failure code (0x80) for every reason.
        assert states[forbidden].startswith("refused: "), states
        assert ("Not authorized" in states[forbidden]) == (protocol == "5"), states
        refusals = [r.getMessage() for r in caplog.records if "refused the subscription" in r.getMessage()]
        assert len(refusals) == 1 and forbidden in refusals[0], refusals
        assert forbidden in str(conn.stats()["last_error"])
        publish_one(broker, f"edge/{DEVICE}/cmd/ping", b"mine")
        wait_until(lambda: got == [b"mine"], what="the allowed subscription's message")


def test_clean_stop_publishes_offline_retained(
    mosquitto: Mosquitto, mqtt_subscriber_factory: SubscriberFactory, connection_factory: ConnectionFactory
) -> None:
    status = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    conn, _ = connection_factory(mosquitto, "5")
    conn.start()
    status.wait_for(1)
    assert conn.publish_status_now() is True
    status.wait_until(lambda msgs: [m.payload for m in msgs] == [ONLINE, ONLINE])
    conn.stop()
    conn.stop()  # idempotent
    assert not conn.connected
    assert conn.publish_status_now() is False
    status.wait_until(lambda msgs: msgs[-1].payload == OFFLINE)
    later = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    assert later.wait_for(1)[0].retain is True and later.messages[0].payload == OFFLINE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_refused_connack_is_not_treated_as_connected(
    protocol: str, tmp_path: Path, connection_factory: ConnectionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with Mosquitto(tmp_path / "strict", allow_anonymous=False) as broker:
        conn, outbox = connection_factory(broker, protocol, reconnect_min_s=0.1, reconnect_max_s=0.2)
        outbox.put("edge/dev1/results/p", b"{}")
        with caplog.at_level(logging.ERROR, logger="agent.mqtt.connection"):
            conn.start()
            # Three refused CONNACKs (one ERROR each; retried at the 0.2 s auth backoff): had one been
            # taken for a connection, it would show below, and the client would not have tried again.
            wait_until(
                lambda: sum("refused the connection" in r.getMessage() for r in list(caplog.records)) >= 3,
                what="three refusals",
                timeout=30,
                state=conn.stats,
            )
        stats = conn.stats()
        assert not conn.connected and stats["connects"] == 0
        assert "not authorized" in stats["last_error"].lower()
        assert any(
            "refused the connection" in r.getMessage() and "username" in r.getMessage()
            for r in caplog.records
        )
        assert len(outbox) == 1  # nothing was "sent" to a broker that said no


# -- outbox delivery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_results_queued_while_broker_is_down_are_all_delivered(
    protocol: str,
    tmp_path: Path,
    mqtt_subscriber_factory: SubscriberFactory,
    connection_factory: ConnectionFactory,
) -> None:
    broker = Mosquitto(tmp_path / "broker", persistence=True)
    broker.start()
    try:
        # A persistent session, so the broker keeps results for the watcher even if it reconnects late.
        sub = mqtt_subscriber_factory(
            broker, f"edge/{DEVICE}/results/#", persistent=True, client_id="watcher"
        )
        broker.stop()
        assert broker.persistence_file.exists()  # the watcher's session survives the outage

        # backlog_share 1: strictly oldest first (the default sends some of the newest beside the backlog).
        conn, outbox = connection_factory(
            broker, protocol, outbox=OutboxConfig(max_inflight=10, backlog_share=1.0)
        )
        conn.start()  # the broker is down: start() must not fail or block
        ids = [f"r{i}" for i in range(300)]
        put_results(conn, outbox, ids)
        assert conn.flush(0.3) is False
        assert not conn.connected and len(outbox) == 300
        assert "cannot reach" in (conn.stats()["last_error"] or "")

        broker.start()
        sub.wait_until(lambda msgs: set(received_ids(sub)) >= set(ids), timeout=20)
        assert conn.flush(10) is True
        assert len(outbox) == 0
        got = received_ids(sub)
        assert first_occurrences(got) == ids  # oldest first
        assert conn.stats()["published"] == 300
        assert outbox.stats()["acked_total"] == 300
    finally:
        broker.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_broker_restart_mid_stream_loses_nothing(
    protocol: str,
    tmp_path: Path,
    mqtt_subscriber_factory: SubscriberFactory,
    connection_factory: ConnectionFactory,
) -> None:
    broker = Mosquitto(tmp_path / "broker", persistence=True)
    broker.start()
    try:
        sub = mqtt_subscriber_factory(
            broker, f"edge/{DEVICE}/results/#", persistent=True, client_id="watcher"
        )
        conn, outbox = connection_factory(broker, protocol)
        conn.start()
        wait_until(lambda: conn.connected, what="connected")

        ids = [f"m{i}" for i in range(400)]
        producer = threading.Thread(target=put_results, args=(conn, outbox, ids, 0.003))
        producer.start()
        wait_until(lambda: len(received_ids(sub)) >= 100, what="first results")
        assert producer.is_alive()  # the restart really lands mid-stream
        broker.restart()
        assert broker.persistence_file.exists()  # sessions and queued messages survived the restart
        producer.join(timeout=20)
        assert not producer.is_alive()

        sub.wait_until(lambda msgs: set(received_ids(sub)) >= set(ids), timeout=20)
        assert conn.flush(10) is True and len(outbox) == 0
        stats = conn.stats()
        assert stats["disconnects"] >= 1 and stats["connects"] >= 2
        got = received_ids(sub)
        assert set(got) == set(ids)  # every one at least once (duplicates are allowed)
    finally:
        broker.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_poison_messages_are_dropped_and_do_not_block_the_queue(
    protocol: str,
    tmp_path: Path,
    mqtt_subscriber_factory: SubscriberFactory,
    connection_factory: ConnectionFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite edge/#\n")
    with Mosquitto(tmp_path / "acl-broker", extra_config=f"acl_file {acl}") as broker:
        sub = mqtt_subscriber_factory(broker, "#")
        conn, outbox = connection_factory(broker, protocol)
        outbox.put("edge/dev1/results/+", b"wildcards can never be published")
        outbox.put("forbidden/topic", b"the ACL denies this")
        put_results(conn, outbox, ["after-1", "after-2"])
        with caplog.at_level(logging.ERROR, logger="agent.mqtt.connection"):
            conn.start()
            sub.wait_until(lambda msgs: received_ids(sub) == ["after-1", "after-2"])
            assert conn.flush(5) is True
        assert all(m.topic != "forbidden/topic" for m in sub.messages)
        stats = conn.stats()
        assert stats["published"] >= 2
        assert any("wildcards" in r.getMessage() or "paho refused" in r.getMessage() for r in caplog.records)
        if protocol == "5":
            # MQTT 5 says "not authorized" in the PUBACK: dropped with an error, not retried for ever.
            assert stats["rejected"] == 2
            assert any("0x87" in r.getMessage() for r in caplog.records)
        else:
            # MQTT 3.1.1 has no way to refuse a PUBLISH: the broker acknowledges and discards it.
            assert stats["rejected"] == 1


# -- subscriptions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handlers_run_off_the_network_thread_and_failures_are_contained(
    protocol: str,
    mosquitto: Mosquitto,
    connection_factory: ConnectionFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn, _ = connection_factory(mosquitto, protocol)
    conn.start()
    wait_until(lambda: conn.connected, what="connected")

    bad_calls: list[str] = []
    good: list[tuple[str, bytes, str]] = []
    barrier: list[bytes] = []

    def bad(topic: str, payload: bytes) -> None:
        bad_calls.append(topic)
        raise RuntimeError("handler bug")

    conn.subscribe(f"edge/{DEVICE}/cmd/+", bad)
    unsubscribe_good = conn.subscribe(
        f"edge/{DEVICE}/cmd/#", lambda t, p: good.append((t, p, threading.current_thread().name))
    )
    conn.subscribe(f"edge/{DEVICE}/barrier", lambda t, p: barrier.append(p))
    with pytest.raises(ValueError):
        conn.subscribe("edge/#/bad", bad)

    filters = {f"edge/{DEVICE}/cmd/+", f"edge/{DEVICE}/cmd/#", f"edge/{DEVICE}/barrier"}
    wait_until(lambda: conn.stats()["subscriptions"] == dict.fromkeys(filters, "active"),
               what="SUBACKs", timeout=30, state=conn.stats)  # fmt: skip

    with caplog.at_level(logging.ERROR, logger="agent.mqtt.connection"):
        publish_one(mosquitto, f"edge/{DEVICE}/cmd/one", b"1")
        publish_one(mosquitto, f"edge/{DEVICE}/cmd/two", b"2")
        publish_one(mosquitto, f"edge/{DEVICE}/barrier", b"first")
        wait_until(lambda: barrier[-1:] == [b"first"], what="first barrier")
    expected = [(f"edge/{DEVICE}/cmd/one", b"1"), (f"edge/{DEVICE}/cmd/two", b"2")]
    if protocol == "5":
        # Subscription identifiers: one call per handler per message, despite overlapping filters.
        assert [(t, p) for t, p, _ in good] == expected
        assert bad_calls == [t for t, _ in expected]
    else:
        # MQTT 3.1.1: mosquitto sends one copy per matching filter, so handlers may see a message twice.
        assert first_occurrences([f"{t}|{p!r}" for t, p, _ in good]) == [f"{t}|{p!r}" for t, p in expected]
        assert first_occurrences(bad_calls) == [t for t, _ in expected]
    assert {name for _, _, name in good} == {"mqtt-handlers"}
    failures = [r for r in caplog.records if "failed on a message" in r.getMessage()]
    assert len(failures) == len(bad_calls) and all("handler bug" in (r.exc_text or "") for r in failures)

    unsubscribe_good()
    unsubscribe_good()  # idempotent
    calls_before = len(good)
    publish_one(mosquitto, f"edge/{DEVICE}/cmd/three", b"3")
    publish_one(mosquitto, f"edge/{DEVICE}/barrier", b"done")
    wait_until(lambda: barrier[-1:] == [b"done"], what="second barrier")
    # Messages are handled in order, so by the barrier "three" went to the still-subscribed handler only.
    assert bad_calls[-1] == f"edge/{DEVICE}/cmd/three"
    assert len(good) == calls_before


def _puback(conn: MqttConnection, mid: int, reason: ReasonCode) -> None:
    """A PUBACK as paho's network thread hands it over; the publisher thread's handling of it."""
    conn.publisher._events.put(("ack", mid, reason))
    conn.publisher._drain_events()


def test_puback_refusals_retry_transient_and_drop_permanent(tmp_path: Path) -> None:
    # No broker makes "quota exceeded" on demand, so feed the PUBACK handling real paho reason codes.
    outbox = Outbox(tmp_path / "outbox.db")
    conn = MqttConnection(
        make_config(Mosquitto(tmp_path / "unused"), "5"), DEVICE, outbox, lambda: ONLINE, lambda: OFFLINE
    )
    row = outbox.put("edge/dev1/results/p", b"{}")

    conn.publisher._inflight[7] = (row, 1)
    conn.publisher._inflight_rows.add(row)
    _puback(conn, 7, ReasonCode(PacketTypes.PUBACK, identifier=0x97))  # quota exceeded: transient
    assert len(outbox) == 1 and row not in conn.publisher._inflight_rows
    not_before, delay = conn.publisher._retry[row]
    assert delay == 1.0 and not_before > time.monotonic()

    conn.publisher._inflight[8] = (row, 1)
    _puback(conn, 8, ReasonCode(PacketTypes.PUBACK, identifier=0x97))
    assert conn.publisher._retry[row][1] == 2.0  # backoff doubles

    conn.publisher._inflight[9] = (row, 1)
    _puback(conn, 9, ReasonCode(PacketTypes.PUBACK, identifier=0x90))  # topic name invalid: never works
    assert len(outbox) == 0 and row not in conn.publisher._retry
    assert conn.stats()["rejected"] == 1 and "0x90" in conn.stats()["last_error"]

    _puback(conn, 10, ReasonCode(PacketTypes.PUBACK, identifier=0))  # unknown mid: ignored
    conn.stop()  # never started: a no-op
    outbox.close()


def test_cast_delay_keeps_float() -> None:
    # The helper only exists to satisfy paho's int annotation; the value must pass through untouched.
    assert cast_delay(0.25) == 0.25


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_oversized_message_is_refused_and_does_not_block_the_queue(
    protocol: str,
    tmp_path: Path,
    mqtt_subscriber_factory: SubscriberFactory,
    connection_factory: ConnectionFactory,
) -> None:
    # The broker's limit (announced in the MQTT 5 CONNACK) is smaller than the agent's default; over
    # 3.1.1 nothing is announced, so the agent's own max_payload_bytes has to catch it.
    with Mosquitto(tmp_path / "broker", extra_config="max_packet_size 3000") as broker:
        broker.start()
        sub = mqtt_subscriber_factory(broker, f"edge/{DEVICE}/results/#")
        limit = {"max_payload_bytes": 262_144} if protocol == "5" else {"max_payload_bytes": 2048}
        conn, outbox = connection_factory(broker, protocol, **limit)
        topic = results_topic("edge", DEVICE, "raw")
        outbox.put(topic, b"x" * 10_000)  # first in line, and too big
        outbox.put(topic, b"small-1")
        outbox.put(topic, b"small-2")
        conn.start()
        got = sub.wait_until(lambda msgs: len(msgs) >= 2, timeout=10)
        assert [m.payload for m in got] == [b"small-1", b"small-2"]
        wait_until(lambda: len(outbox) == 0, what="the outbox to empty")
        stats = conn.stats()
        assert stats["rejected"] == 1 and stats["disconnects"] == 0, stats
        assert "10000 bytes is over the limit" in str(stats["last_error"])


@pytest.mark.slow
def test_a_broker_back_after_a_long_outage_is_reconnected_within_seconds_not_a_backoff(
    mosquitto: Mosquitto, connection_factory: ConnectionFactory
) -> None:
    """With the default 60 s backoff cap, an agent whose backoff has grown during a long outage still
    reconnects within a few seconds of the broker's return: its port is probed during the wait."""
    conn, _ = connection_factory(mosquitto, "5", reconnect_min_s=1.0, reconnect_max_s=60.0)
    conn.start()
    wait_until(lambda: conn.connected, "the first connection", timeout=30)
    mosquitto.stop()
    wait_until(lambda: not conn.connected, "the broker gone", timeout=30)
    # Long enough for the backoff to grow to 16 s: attempt 6 waits 8-16 s before it connects.
    wait_until(lambda: conn._attempts >= 6, "the backoff to grow", timeout=90)
    mosquitto.start()
    back = time.monotonic()
    wait_until(lambda: conn.connected, "reconnected", timeout=60)
    took = time.monotonic() - back
    print(f"reconnected {took:.1f} s after the broker came back (attempt {conn._attempts or 'done'})")
    # Probe every 1 s + a spread of at most 3 s + paho's 1 s delay (the backoff alone: 8-16 s).
    assert took < 7, took


def test_after_an_outage_fresh_results_go_out_beside_the_backlog(
    tmp_path: Path, mqtt_subscriber_factory: SubscriberFactory, connection_factory: ConnectionFactory
) -> None:
    """The default backlog_share (0.5): with 300 results queued, the newest are among the first sent
    when the broker is back, not after the whole backlog; every one arrives."""
    broker = Mosquitto(tmp_path / "broker", persistence=True)
    broker.start()
    try:
        sub = mqtt_subscriber_factory(
            broker, f"edge/{DEVICE}/results/#", persistent=True, client_id="watcher"
        )
        broker.stop()
        conn, outbox = connection_factory(broker, "5")
        outbox.backlog_age_s = 0.5  # the outage here is short; in the field it is 10 s
        conn.start()
        ids = [f"r{i}" for i in range(300)]
        put_results(conn, outbox, ids)
        time.sleep(0.6)  # the queued results become a backlog (older than backlog_age_s)
        broker.start()
        sub.wait_until(lambda msgs: set(received_ids(sub)) >= set(ids), timeout=30)
        order = first_occurrences(received_ids(sub))
        assert sorted(order, key=ids.index) == ids  # all of them
        assert order.index("r299") < 50, order[:60]  # the newest went out within the first windows
    finally:
        broker.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_broker_back_without_its_state_gets_the_recent_results_again(
    tmp_path: Path, connection_factory: ConnectionFactory, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    """A broker that restarts without saving (killed, or no persistence) loses what it acknowledged
    and had not yet forwarded: here, results queued for a subscriber that is away. It comes back
    without the agent's session, and the agent sends the results of the last resend_window_s
    again. An uplink cut (the broker kept the session) sends nothing again."""
    caplog.set_level(logging.INFO, logger="agent.mqtt.connection")
    topic_filter = f"edge/{DEVICE}/results/#"
    with Mosquitto(tmp_path / "broker") as broker, CuttableProxy(broker.port) as proxy:
        conn, outbox = connection_factory(broker, protocol, port=proxy.port)
        # A subscriber with a persistent session that then goes away: the broker queues for it.
        Subscriber(broker.host, broker.port, topic_filter, persistent=True, client_id="away").close()
        conn.start()
        wait_until(lambda: conn.connected, "connected")
        ids = [f"r{i}" for i in range(20)]
        put_results(conn, outbox, ids)
        wait_until(lambda: conn.stats()["published"] == 20 and outbox.pending() == 0, "all acknowledged")

        proxy.cut()  # the uplink alone: the broker keeps the session and what it queued
        wait_until(lambda: not conn.connected, "the cut seen")
        proxy.restore()
        wait_until(lambda: conn.connected and conn.stats()["connects"] == 2, "back after the cut")
        assert "has no session" not in caplog.text and outbox.pending() == 0

        proxy.cut()
        wait_until(lambda: not conn.connected, "the second cut seen")
        broker.stop()  # no persistence: what it queued for "away" is gone, and the agent's session
        broker.start()
        watcher = Subscriber(broker.host, broker.port, topic_filter, persistent=True, client_id="away")
        try:
            proxy.restore()
            watcher.wait_until(lambda got: set(ids) <= {json.loads(m.payload)["id"] for m in got})
        finally:
            watcher.close()
        assert "has no session for this agent" in caplog.text
        assert "sending the 20 result(s) it acknowledged in the last 30 s again" in caplog.text
        wait_until(lambda: outbox.pending() == 0, "the results sent again acknowledged")


def test_results_sent_again_never_wait_for_room_in_a_full_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sending again runs on the thread that takes the PUBACKs which make room: with `when_full:
    wait` and a full outbox it must skip, not wait (which would stop delivery for good)."""
    outbox = Outbox(tmp_path / "outbox.db", max_messages=100, when_full="wait")
    conn = MqttConnection(
        make_config(Mosquitto(tmp_path / "unused"), "5"), DEVICE, outbox, lambda: ONLINE, lambda: OFFLINE
    )
    try:
        topic = results_topic("edge", DEVICE, "p")
        for i in range(100):
            outbox.put(topic, json.dumps({"id": f"q{i}"}).encode())
        for message in outbox.peek(3):
            conn.publisher._remember_delivered(message)
        resend = threading.Thread(target=conn.publisher._resend_recent)
        resend.start()
        resend.join(10)
        assert not resend.is_alive(), "sending again waited for room"
        assert "3 of those result(s) are not sent again" in caplog.text and outbox.pending() == 100
    finally:
        conn.stop(publish_offline=False)
        outbox.close()
