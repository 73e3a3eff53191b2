"""A full outbox after a long outage (issue 33, item 5): the agent reconnects as soon as the broker's
port is open again, whatever its when_full policy, and drops nothing once reconnected.

Two causes, each with a quick test here, and the whole scenario (real mosquitto stopped for three
keepalive periods under ~400 results a second per connection, one connection per policy, all through
the same outage: the issue measured 75 s against the default keepalive of 30 s; here keepalive_s is its
least, 5 s, and the outage 15 s, the same story in a fifth of the time):
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


class _Rig:
    """One drop policy's connection, outbox and producer of RATE results a second, and when its
    connection said it was connected (on its paho thread, in on_connect) with what the outbox had
    dropped by then."""

    def __init__(self, tmp_path: Path, device: str, broker: Mosquitto, limits: dict[str, Any]) -> None:
        self.outbox = Outbox(tmp_path / f"{device}.db", **limits)
        config = MqttConfig(host=broker.host, port=broker.port, keepalive_s=KEEPALIVE_S)  # reconnect 1-60 s
        self.conn = MqttConnection(config, device, self.outbox, lambda: b"online", lambda: b"offline")
        self.topic = results_topic("edge", device, "people")
        self.seen: list[tuple[float, int, float]] = []  # (monotonic, dropped, fill)
        self.stop = threading.Event()
        self.made = 0
        self.producer = threading.Thread(target=self._produce, name=f"producer-{device}", daemon=True)
        self.handler = _Connected(self)

    def _produce(self) -> None:
        """RATE results a second, paced (a producer that fell behind does not burst to catch up)."""
        began, n = time.monotonic(), 0
        while not self.stop.is_set() and n < RATE * 300:  # bounded: 5 minutes of results
            with contextlib.suppress(OutboxFull):  # drop-newest refuses it: counted by the outbox
                self.outbox.put(self.topic, _payload(n))
            self.conn.notify_new_message()
            n += 1
            self.made = n
            ahead = began + n / RATE - time.monotonic()
            if ahead > 0:
                self.stop.wait(ahead)
            elif ahead < -0.1:
                began -= ahead


class _Connected(logging.Handler):
    """The rig's connection saying it is connected: said on its own paho thread."""

    def __init__(self, rig: _Rig) -> None:
        super().__init__(logging.INFO)
        self._rig = rig
        self._thread = f"paho-mqtt-client-{rig.conn.client_id}"

    def emit(self, record: logging.LogRecord) -> None:
        if record.threadName == self._thread and record.getMessage().startswith("connected to MQTT broker"):
            self._rig.seen.append((time.monotonic(), self._rig.outbox.dropped, self._rig.outbox.fill()))


@pytest.mark.slow
def test_after_an_outage_of_three_keepalives_a_full_outbox_reconnects_at_once_and_drops_nothing_once_back(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """Each drop policy and bound (OUTAGE_LIMITS) on a connection of its own, all through one outage
    (one after the other, the same checks took three outages)."""
    caplog.set_level(logging.INFO, logger="agent.mqtt.connection")
    logger = logging.getLogger("agent.mqtt.connection")
    rigs = {
        name: _Rig(tmp_path, f"dev{i}", mosquitto, limits)
        for i, (name, limits) in enumerate(OUTAGE_LIMITS.items())
    }
    each = rigs.values()
    try:
        for rig in each:
            rig.conn.start()
        wait_until(lambda: all(r.conn.connected for r in each), "the first connections", timeout=30)
        for rig in each:
            logger.addHandler(rig.handler)  # the connects from now on
            rig.producer.start()
        mosquitto.stop()
        stopped = time.monotonic()
        wait_until(lambda: not any(r.conn.connected for r in each), "the broker gone", timeout=30)
        wait_until(
            lambda: all(r.outbox.dropped > 0 for r in each),
            "the outboxes to overflow",
            timeout=OUTAGE_S,
            state=lambda: {n: (r.outbox.pending(), r.made) for n, r in rigs.items()},
        )
        # The outage itself (a scenario's length, not a wait for a condition): results keep coming.
        threading.Event().wait(max(0.0, stopped + OUTAGE_S - time.monotonic()))
        assert not any(r.conn.connected for r in each) and all(r.producer.is_alive() for r in each)
        mosquitto.start()
        opened = time.monotonic()  # seen from outside: the broker's port accepts connections
        wait_until(lambda: all(r.seen for r in each), "reconnected", timeout=30, interval=0.005,
                   state=lambda: {n: r.conn.stats() for n, r in rigs.items()})  # fmt: skip
        # The backlogs drain while results keep coming; then a second more of live results.
        wait_until(
            lambda: all(r.outbox.fill() < 0.1 for r in each),
            "the backlogs to drain",
            timeout=60,
            state=lambda: {n: (r.outbox.pending(), r.outbox.dropped) for n, r in rigs.items()},
        )
        drained_at = {name: rig.made for name, rig in rigs.items()}
        wait_until(
            lambda: all(r.made >= drained_at[n] + RATE for n, r in rigs.items()),
            "a second of live results",
            timeout=30,
        )
        for rig in each:
            rig.stop.set()
            rig.producer.join(10)
            assert not rig.producer.is_alive()
        wait_until(lambda: all(r.outbox.pending() == 0 for r in each), "everything delivered", timeout=60,
                   state=lambda: {n: r.outbox.stats() for n, r in rigs.items()})  # fmt: skip
    finally:
        for rig in each:
            rig.stop.set()
            logger.removeHandler(rig.handler)
            rig.conn.stop(publish_offline=False)
            rig.outbox.close()
    for name, rig in rigs.items():
        reconnected_at, dropped_once_back, fill_once_back = rig.seen[0]
        delay, dropped = reconnected_at - opened, rig.outbox.dropped
        print(f"{name}: reconnected {delay:.3f} s after the port opened; {dropped_once_back} dropped in the "
              f"outage (fill {fill_once_back:.2f} at the reconnect), {dropped - dropped_once_back} after; "
              f"{rig.made} results made")  # fmt: skip
        assert fill_once_back > 0.9, name  # it was full when the broker came back
        assert delay <= RECONNECT_S, (name, delay)
        assert len(rig.seen) == 1, name  # one connect, never lost again
        assert dropped == dropped_once_back, f"{name}: results made after the reconnect were dropped"
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "before CONNACK" in m or "Keep alive" in m], said
