"""A full outbox after a long outage (issue 33, item 5): the agent reconnects as soon as the broker's
port is open again, whatever its when_full policy, and drops nothing once reconnected.

Two causes, each with a quick test here, and the whole scenario (real mosquitto stopped for three
keepalive periods under ~400 results a second, per policy: the issue measured 75 s against the default
keepalive of 30 s; here keepalive_s is its least, 5 s, and the outage 15 s, the same story in a fifth of
the time):
- paho stamps its keepalive clock before it calls on_pre_connect, where the connection waits for the
  broker; a wait longer than keepalive_s made paho's keepalive check close the new socket before its
  CONNACK, and the next attempt came a reconnect delay (1 s) later.
- however fast the drain, the first room it frees comes a publish/PUBACK round trip after the
  reconnect: the drop policies keep a reserve free while the link is down (outbox.RESERVE_SHARE)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho_client
import pytest

from agent.config import MqttConfig
from agent.mqtt import MqttConnection, Outbox, results_topic
from agent.mqtt.outbox import RESERVE_SHARE, OutboxFull
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DEVICE = "dev1"
TOPIC = results_topic("edge", DEVICE, "people")


def _payload(n: int) -> bytes:
    """A result of PAYLOAD_BYTES (ids up to 7 digits)."""
    return json.dumps({"id": f"r{n:07d}", "pad": "x" * 170}).encode()


PAYLOAD_BYTES = len(_payload(0))


# -- the reserve --------------------------------------------------------------------------------------


def _limits(capacity: int) -> dict[str, dict[str, Any]]:
    """Outboxes full at `capacity` results: the three drop policies and bounds."""
    return {
        "drop-oldest, by rows": {"max_messages": capacity, "when_full": "drop-oldest"},
        "drop-oldest, by bytes": {
            "max_messages": 100_000,
            "max_bytes": capacity * PAYLOAD_BYTES,
            "when_full": "drop-oldest",
        },
        "drop-newest, by rows": {"max_messages": capacity, "when_full": "drop-newest"},
    }


LIMITS = _limits(100)


@pytest.mark.parametrize("limits", LIMITS.values(), ids=LIMITS.keys())
def test_while_the_link_is_down_the_drop_policies_keep_room_for_the_results_made_after_it(
    tmp_path: Path, limits: dict[str, Any]
) -> None:
    outbox = Outbox(tmp_path / "outbox.db", **limits)
    try:
        outbox.keep_reserve(True)
        for n in range(150):
            with contextlib.suppress(OutboxFull):
                outbox.put(TOPIC, _payload(n))
        kept = 100 - int(100 * RESERVE_SHARE)
        assert outbox.pending() == kept and outbox.dropped == 150 - kept
        assert not outbox.has_room(PAYLOAD_BYTES)
        outbox.keep_reserve(False)  # the CONNACK: the reserve is for the results made from now on
        assert outbox.has_room(PAYLOAD_BYTES)
        assert not outbox.has_room(PAYLOAD_BYTES, spare_reserve=True)  # not for resending old ones
        for n in range(150, 150 + 100 - kept):
            outbox.put(TOPIC, _payload(n))
        assert outbox.pending() == 100 and outbox.dropped == 150 - kept
        with contextlib.suppress(OutboxFull):
            outbox.put(TOPIC, _payload(999))  # full now: the policy applies again
        assert outbox.pending() == 100 and outbox.dropped == 150 - kept + 1
    finally:
        outbox.close()


def test_wait_keeps_no_reserve(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.db", max_messages=100, when_full="wait")
    try:
        outbox.keep_reserve(True)
        for n in range(100):
            outbox.put(TOPIC, _payload(n))
        assert outbox.pending() == 100 and not outbox.has_room(0)
    finally:
        outbox.close()


# -- paho's keepalive clock --------------------------------------------------------------------------


def test_a_wait_for_the_broker_longer_than_keepalive_does_not_cost_the_connect_after_it(
    tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait for the broker (here it jumps paho's clock 100 s, past keepalive_s) is not silence on
    a link: the connect after it is not closed by paho's keepalive check before its CONNACK."""
    caplog.set_level(logging.INFO, logger="agent.mqtt.connection")
    offset = [0.0]
    monkeypatch.setattr(paho_client, "time_func", lambda: time.monotonic() + offset[0])
    outbox = Outbox(tmp_path / "outbox.db", max_messages=1000)
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, keepalive_s=30, reconnect_min_s=0.1)
    conn = MqttConnection(config, DEVICE, outbox, lambda: b"online", lambda: b"offline")
    waited: list[bool] = []  # per wait: did it end with the broker back?
    wait_for_broker = conn._wait_for_broker

    def long_wait(attempt: int) -> None:
        wait_for_broker(attempt)
        back = conn._broker_listens()
        if back and True not in waited:
            offset[0] += 100.0  # as if the broker had been away 100 s
        waited.append(back)

    monkeypatch.setattr(conn, "_wait_for_broker", long_wait)
    try:
        conn.start()
        wait_until(lambda: conn.connected, "the first connection", timeout=30)
        mosquitto.stop()
        # The connection's first attempt found no broker: the next ones wait for it (long_wait).
        wait_until(lambda: conn._attempts >= 2, "a wait for the broker", timeout=30)
        mosquitto.start()
        wait_until(lambda: conn.connected, "reconnected", timeout=30, state=conn.stats)
        assert waited.count(True) == 1, "one connect after the wait for the broker was enough"
    finally:
        conn.stop(publish_offline=False)
        outbox.close()
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "before CONNACK" in m or "Keep alive" in m], said


# -- the whole scenario -------------------------------------------------------------------------------

KEEPALIVE_S = 5  # MqttConfig's least: an outage of a few keepalive periods takes seconds, not minutes
OUTAGE_S = 3.0 * KEEPALIVE_S  # longer than keepalive_s, as the 75 s were against 30 s
RATE = 400  # results a second
CAPACITY = 1000  # results: 2.5 s of them
RECONNECT_S = 0.25  # the most the reconnect may take after the broker's port opens

OUTAGE_LIMITS = _limits(CAPACITY)


class _Connected(logging.Handler):
    """When the connection says it is connected (on paho's thread, in on_connect), and what the
    outbox had dropped by then."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(logging.INFO)
        self._outbox = outbox
        self.seen: list[tuple[float, int, float]] = []  # (monotonic, dropped, fill)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("connected to MQTT broker"):
            self.seen.append((time.monotonic(), self._outbox.dropped, self._outbox.fill()))


@pytest.mark.parametrize("limits", OUTAGE_LIMITS.values(), ids=OUTAGE_LIMITS.keys())
@pytest.mark.slow
def test_after_an_outage_of_three_keepalives_a_full_outbox_reconnects_at_once_and_drops_nothing_once_back(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture, limits: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, logger="agent.mqtt.connection")
    outbox = Outbox(tmp_path / "outbox.db", **limits)
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, keepalive_s=KEEPALIVE_S)  # reconnect 1-60 s
    conn = MqttConnection(config, DEVICE, outbox, lambda: b"online", lambda: b"offline")
    connected = _Connected(outbox)
    stop = threading.Event()
    made = [0]

    def produce() -> None:
        """RATE results a second, paced (a producer that fell behind does not burst to catch up)."""
        began, n = time.monotonic(), 0
        while not stop.is_set() and n < RATE * 300:  # bounded: 5 minutes of results
            with contextlib.suppress(OutboxFull):  # drop-newest refuses it: counted by the outbox
                outbox.put(TOPIC, _payload(n))
            conn.notify_new_message()
            n += 1
            made[0] = n
            ahead = began + n / RATE - time.monotonic()
            if ahead > 0:
                stop.wait(ahead)
            elif ahead < -0.1:
                began -= ahead

    producer = threading.Thread(target=produce, name="producer", daemon=True)
    try:
        conn.start()
        wait_until(lambda: conn.connected, "the first connection", timeout=30)
        logging.getLogger("agent.mqtt.connection").addHandler(connected)  # the connects from now on
        producer.start()
        mosquitto.stop()
        stopped = time.monotonic()
        wait_until(lambda: not conn.connected, "the broker gone", timeout=30)
        wait_until(lambda: outbox.dropped > 0, "the outbox to overflow", timeout=OUTAGE_S,
                   state=lambda: (outbox.pending(), made[0]))  # fmt: skip
        # The outage itself (a scenario's length, not a wait for a condition): results keep coming.
        stop.wait(max(0.0, stopped + OUTAGE_S - time.monotonic()))
        assert not conn.connected and producer.is_alive()
        mosquitto.start()
        opened = time.monotonic()  # seen from outside: the broker's port accepts connections
        wait_until(lambda: connected.seen, "reconnected", timeout=30, interval=0.005, state=conn.stats)
        reconnected_at, dropped_once_back, fill_once_back = connected.seen[0]
        # The backlog drains while results keep coming; then a second more of live results.
        wait_until(lambda: outbox.fill() < 0.1, "the backlog to drain", timeout=60,
                   state=lambda: (outbox.pending(), outbox.dropped, conn.stats()))  # fmt: skip
        drained_at = made[0]
        wait_until(lambda: made[0] >= drained_at + RATE, "a second of live results", timeout=30)
        stop.set()
        producer.join(10)
        assert not producer.is_alive()
        wait_until(lambda: outbox.pending() == 0, "everything delivered", timeout=60, state=outbox.stats)
        dropped = outbox.dropped
    finally:
        stop.set()
        logging.getLogger("agent.mqtt.connection").removeHandler(connected)
        conn.stop(publish_offline=False)
        outbox.close()
    delay = reconnected_at - opened
    print(f"{limits}: reconnected {delay:.3f} s after the port opened; {dropped_once_back} dropped in the "
          f"outage (fill {fill_once_back:.2f} at the reconnect), {dropped - dropped_once_back} after; "
          f"{made[0]} results made")  # fmt: skip
    assert fill_once_back > 0.9  # it was full when the broker came back
    assert delay <= RECONNECT_S
    assert len(connected.seen) == 1  # one connect, never lost again
    assert dropped == dropped_once_back, "results made after the reconnect were dropped"
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "before CONNACK" in m or "Keep alive" in m], said
