"""The outbox publisher: results leave the SQLite `Outbox` for the broker, and a row leaves the outbox
only on the PUBACK for its message.

- Oldest first (after an outage part of each window goes to the newest: `outbox.backlog_share`), at
  most `max_inflight` unacknowledged on the wire and a few windows more in paho's queue.
- On a disconnect the in-flight map is forgotten (the connection drops paho's copies at the next
  CONNACK), so the outbox is the single source of truth: rows are published again after reconnecting
  (at-least-once; payloads carry unique ids so consumers de-duplicate).
- A broker that comes back without this agent's session may have lost what it acknowledged shortly
  before (mosquitto keeps queued messages in memory): what it acknowledged in the last
  `outbox.resend_window_s` (bounded by `resend_max_bytes`) is queued again (logged as a WARNING).
- Refused PUBACKs (MQTT 5, reason code >= 0x80): "not authorized", "topic name invalid" and
  "payload format invalid" can never succeed, so the message is dropped with an error log (one poison
  message must not block the queue for ever). Other refusals may pass later: the row stays and is
  retried after a per-row backoff (1 s doubling to 60 s) while the rest of the queue keeps flowing. A
  message paho refuses to even send (a topic with wildcards, a payload over 256 MiB) is dropped too.

The connection (agent/mqtt/connection.py) owns the link; it tells the publisher when the link comes
and goes (`link_down`, `session_lost`) and hands it paho's PUBACKs (`acked`).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from agent.config import MqttConfig
from agent.mqtt.outbox import Outbox, OutboxFull, OutboxMessage

log = logging.getLogger(__name__)

# Bytes of an MQTT PUBLISH besides topic and payload: fixed header, packet id, properties.
PACKET_OVERHEAD = 64

# PUBACK reason codes that no retry can fix (MQTT 5 spec 3.4.2.1).
_PERMANENT_PUBACK_REFUSALS = {
    0x87: "not authorized",
    0x90: "topic name invalid",
    0x99: "payload format invalid",
}
_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 60.0
_HANDOFF_WINDOWS = 4  # see OutboxPublisher._handoff
IDLE_POLL_S = 0.5  # the publisher re-checks the outbox at least this often


def payload_room(max_packet: int, topic: str) -> int:
    """The most payload bytes a PUBLISH to `topic` may carry where a packet may have `max_packet`
    bytes (mqtt.max_payload_bytes, or the broker's maximum packet size)."""
    return max_packet - len(topic.encode()) - PACKET_OVERHEAD


def reason_value(reason: ReasonCode | int) -> int:
    return reason.value if isinstance(reason, ReasonCode) else int(reason)


class OutboxPublisher:
    """Sends the outbox on the connection's paho client, on a thread of its own (module docstring).

    `link()` says whether the connection is up: its generation (+1 per CONNACK) or None when down.
    `on_error(why)` records a dropped message as the connection's last error."""

    def __init__(
        self,
        config: MqttConfig,
        outbox: Outbox,
        client: mqtt.Client,
        link: Callable[[], int | None],
        stopping: threading.Event,
        on_error: Callable[[str], None],
        broker: str,
        prepare_payload: Callable[[OutboxMessage], bytes] | None = None,
    ) -> None:
        self._config = config
        self._outbox = outbox
        self._client = client
        self._link = link
        self._stopping = stopping
        self._on_error = on_error
        self._broker = broker
        # Last touch before a message leaves (e.g. stamping its send time); the outbox row is unchanged.
        self._prepare_payload = prepare_payload
        self.max_payload = config.max_payload_bytes  # lowered by an MQTT 5 broker's CONNACK
        self._max_inflight = config.outbox.max_inflight
        self._backlog_share = config.outbox.backlog_share
        # Rows handed to paho at once: its own window (max_inflight) is on the wire, the rest waits in
        # paho's queue, so a PUBACK frees a slot that paho fills at once, without waiting for the
        # publisher thread (on a busy box that round trip halved the rate). paho's queue is dropped
        # at each CONNACK, like its in-flight copies: the outbox is the source of truth.
        self._handoff = self._max_inflight * _HANDOFF_WINDOWS
        self._acks_waiting = 0  # PUBACKs queued for the publisher since it last drained (a hint)
        self._counts_lock = threading.Lock()
        self._published = 0
        self._rejected = 0

        # Network thread -> delivery: ("ack", mid, reason), ("down", generation), ("session lost", ..),
        # in order. Delivery (handling them, deleting acked rows, handing paho more) runs under
        # _deliver_lock: on the publisher thread, or on paho's network thread in `acked`, which
        # only ever *tries* the lock (paho holds its own lock around on_publish, and the publisher
        # holds ours across publish(): waiting there could deadlock; busy, it wakes the publisher).
        self._deliver_lock = threading.Lock()
        self._events: queue.SimpleQueue[tuple[str, int, ReasonCode | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        # Owned by whoever holds _deliver_lock.
        self._inflight: dict[int, tuple[int, int]] = {}  # mid -> (outbox row id, generation)
        self._inflight_rows: set[int] = set()
        self._sent: dict[int, OutboxMessage] = {}  # row id -> the message, while in flight
        # Delivered recently (PUBACK time, message), kept for resending when the broker comes back
        # without our session (_resend_recent); bounded by resend_window_s and resend_max_bytes.
        self._recent: collections.deque[tuple[float, OutboxMessage]] = collections.deque()
        self._recent_bytes = 0
        self._retry: dict[int, tuple[float, float]] = {}  # row id -> (not before, last delay)
        self.beat = time.monotonic()  # the thread's last pass, for the watchdog
        self._thread = threading.Thread(target=self._main, name="mqtt-outbox", daemon=True)

    # -- what the connection calls ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """After the connection set `stopping`: the thread ends (nothing new goes out)."""
        self._wake.set()
        self._thread.join(timeout=5.0)

    def settle(self) -> None:
        """After the network loop stopped: PUBACKs that arrived while saying goodbye are applied, so
        the next run does not send those rows again."""
        if not self._thread.is_alive():
            self._drain_events()

    def wake(self) -> None:
        """Look at the outbox now (new rows, a new link); without it, it polls every IDLE_POLL_S."""
        self._wake.set()

    def link_down(self, generation: int) -> None:
        """The link of `generation` is gone: what was in flight on it is sent again later."""
        self._events.put(("down", generation, None))
        self._wake.set()

    def session_lost(self) -> None:
        """The broker came back without this agent's session: resend what it acknowledged lately."""
        self._events.put(("session lost", 0, None))

    def acked(self, mid: int, reason_code: ReasonCode) -> None:
        """paho's PUBACK (its network thread)."""
        self._events.put(("ack", mid, reason_code))
        # Deliver once paho's queue behind the wire window runs dry, or half the hand-off is
        # acknowledged, not on every PUBACK: acked rows are deleted and the hand-off refilled in
        # batches, here on the network thread (no hop to the publisher thread: +24% on a backlog in
        # an A/B), or by the publisher when it is busy delivering itself. (Both counts are read
        # without holding _deliver_lock: hints, never a correctness issue; the publisher also wakes
        # on new results, disconnects and every IDLE_POLL_S.)
        self._acks_waiting += 1
        if (
            self._acks_waiting * 2 >= self._handoff
            or len(self._inflight) - self._acks_waiting <= self._max_inflight
        ):
            if not self._deliver_lock.acquire(blocking=False):
                self._wake.set()
                return
            try:
                self._deliver()
            except Exception:
                log.exception("outbox delivery from the network thread failed")
                self._wake.set()
            finally:
                self._deliver_lock.release()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty or `timeout_s` passed; True when empty."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self._wake.set()
        while True:
            if self._outbox.pending() == 0:
                return True
            if self._link() is None:
                return False  # nothing can leave now; the rows wait for the next start
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(0.05, remaining))

    def counts(self) -> dict[str, Any]:
        with self._counts_lock:
            return {
                "published": self._published,
                "rejected": self._rejected,
                "inflight": len(self._inflight_rows),
            }

    # -- the thread ----------------------------------------------------------------------------------

    def _main(self) -> None:
        while True:
            self.beat = time.monotonic()
            # Clear before working: a wake that lands during the work makes the wait return at once.
            self._wake.clear()
            try:
                with self._deliver_lock:
                    self._deliver()
                if self._stopping.is_set():
                    return
            except Exception:
                # SQLite trouble (disk full, I/O error) must not end delivery for good; try again later.
                log.exception("outbox publisher failed; retrying")
                self._stopping.wait(1.0)
            self._wake.wait(IDLE_POLL_S)

    def _deliver(self) -> None:
        """Handle what paho reported, delete acked rows, hand paho more. Caller holds _deliver_lock."""
        self._drain_events()
        if self._stopping.is_set():
            return
        self._fill_window()
        self._drain_events()

    def _fill_window(self) -> None:
        generation = self._link()
        if generation is None:
            return
        room = self._handoff - len(self._inflight)
        if room <= 0:
            return
        now = time.monotonic()
        waiting = {row for row, (not_before, _) in self._retry.items() if not_before > now}
        # After an outage, part of the window goes to the newest results (backlog_share to the oldest).
        fresh = round(room * (1.0 - self._backlog_share))
        for message in self._outbox.peek(room, exclude=self._inflight_rows | waiting, newest=fresh):
            if self._stopping.is_set() or self._link() is None:
                return
            payload = self._prepare_payload(message) if self._prepare_payload else message.payload
            # Topic, payload and header must fit: leave room for the fixed header and properties.
            if len(payload) > payload_room(self.max_payload, message.topic):
                self._reject(
                    message.id,
                    message.topic,
                    f"{len(payload)} bytes is over the limit of "
                    f"{self.max_payload} (mqtt.max_payload_bytes or the broker's maximum packet size)",
                )
                continue
            try:
                info = self._client.publish(message.topic, payload, qos=message.qos)
            except ValueError as exc:
                # Wildcards in the topic, payload too large, ...: it can never be sent.
                self._reject(message.id, message.topic, f"paho refused it: {exc}")
                continue
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._inflight[info.mid] = (message.id, generation)
                self._inflight_rows.add(message.id)
                self._sent[message.id] = message
            else:
                # NO_CONN: the link just dropped; paho's queued copy is discarded at the next
                # CONNACK and the row is published again from the outbox.
                log.debug("publish of outbox row %d not sent (%s)", message.id, mqtt.error_string(info.rc))
                return

    def _drain_events(self) -> None:
        delivered: list[int] = []  # rows whose PUBACK came: removed from the outbox together
        self._acks_waiting = 0
        try:
            while True:
                try:
                    kind, value, reason = self._events.get_nowait()
                except queue.Empty:
                    return
                self._handle_event(kind, value, reason, delivered)
        finally:
            if delivered:
                self._outbox.ack_many(delivered)
                with self._counts_lock:
                    self._published += len(delivered)

    def _handle_event(self, kind: str, value: int, reason: ReasonCode | None, delivered: list[int]) -> None:
        if kind == "down":
            # Anything sent on the lost connection is unacknowledged: publish it again later.
            for mid, (row, generation) in list(self._inflight.items()):
                if generation <= value:
                    del self._inflight[mid]
                    self._inflight_rows.discard(row)
                    self._sent.pop(row, None)
        elif kind == "ack":
            self._handle_ack(value, reason, delivered)
        elif kind == "session lost":
            self._resend_recent()

    def _handle_ack(self, mid: int, reason: ReasonCode | None, delivered: list[int]) -> None:
        entry = self._inflight.pop(mid, None)
        if entry is None:
            return  # a message from before a reconnect, or a status publish
        row, _ = entry
        self._inflight_rows.discard(row)
        message = self._sent.pop(row, None)
        code = reason_value(reason) if reason is not None else 0
        if code < 0x80:
            delivered.append(row)
            self._retry.pop(row, None)
            if message is not None:
                self._remember_delivered(message)
            return
        name = str(reason)
        if code in _PERMANENT_PUBACK_REFUSALS:
            self._reject(row, None, f"broker refused it with reason {code:#x} ({name})")
            return
        _, last_delay = self._retry.get(row, (0.0, 0.0))
        delay = min(_RETRY_MAX_S, max(_RETRY_MIN_S, last_delay * 2))
        self._retry[row] = (time.monotonic() + delay, delay)
        log.warning(
            "broker refused outbox row %d with reason %#x (%s); retrying it in %.0f s", row, code, name, delay
        )

    def _remember_delivered(self, message: OutboxMessage) -> None:
        outbox_cfg = self._config.outbox
        if not outbox_cfg.resend_window_s or not outbox_cfg.resend_max_bytes:
            return
        now = time.monotonic()
        self._recent.append((now, message))
        self._recent_bytes += len(message.payload)
        while self._recent and (
            self._recent[0][0] < now - outbox_cfg.resend_window_s
            or self._recent_bytes > outbox_cfg.resend_max_bytes
        ):
            self._recent_bytes -= len(self._recent.popleft()[1].payload)

    def _resend_recent(self) -> None:
        """The broker came back without our session: it restarted without saving its state, so what
        it acknowledged shortly before may be gone before its subscribers had it (mosquitto keeps
        queued messages in memory). Queue the recently delivered results again; they go out after
        what is queued now, and consumers de-duplicate (at-least-once)."""
        cutoff = time.monotonic() - self._config.outbox.resend_window_s
        again = [message for delivered_at, message in self._recent if delivered_at >= cutoff]
        self._recent.clear()
        self._recent_bytes = 0
        if not again:
            return
        log.warning(
            "the MQTT broker %s has no session for this agent (it restarted without saving it, or the "
            "session expired), so it may have lost what it acknowledged before: sending the %d result(s) it "
            "acknowledged in the last %.0f s again (consumers de-duplicate by pipeline and seq)",
            self._broker,
            len(again),
            self._config.outbox.resend_window_s,
        )
        for queued, message in enumerate(again):
            # Only what fits: a resend must not push out newer results, nor wait for room (this runs
            # on the thread that takes the acks that make room), nor take the room a full outbox kept
            # free for the results made just after the reconnect (outbox.RESERVE_SHARE).
            if not self._outbox.has_room(len(message.payload), spare_reserve=True):
                log.warning(
                    "the outbox is full: %d of those result(s) are not sent again", len(again) - queued
                )
                return
            try:
                self._outbox.put(message.topic, message.payload, message.qos, message.stream)
            except OutboxFull:
                return

    def _reject(self, row: int, topic: str | None, why: str) -> None:
        log.error("dropping outbox row %d%s: %s", row, f" for {topic}" if topic else "", why)
        self._outbox.ack(row)
        self._retry.pop(row, None)
        with self._counts_lock:
            self._rejected += 1
        self._on_error(f"message dropped: {why}")
