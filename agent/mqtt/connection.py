"""One MQTT connection per daemon: paho-mqtt 2.x behind a small, testable surface.

What it guarantees:
- Presence: the last will is the offline payload (retained, QoS 1) on the status topic; every
  successful CONNACK publishes the birth payload there (retained, QoS 1) and then resubscribes
  every registered subscription (the broker may have forgotten them).
- Results never get lost while the link is down: they wait in the SQLite `Outbox`; a publisher
  thread sends them oldest first, at most `max_inflight` unacknowledged at once, and a row leaves
  the outbox only on the PUBACK for its message id. On a disconnect the in-flight map is forgotten
  and paho's own copies are dropped at the next CONNACK (`drop_out_messages`), so the outbox is
  the single source of truth: rows are published again after reconnecting (at-least-once;
  payloads carry unique ids so consumers de-duplicate).
- A PUBACK means the broker took the message, not that it can never lose it: mosquitto keeps what
  it queues for subscribers in memory, and a broker killed before it saved loses it. Such a broker
  comes back without this agent's session (CONNACK session-present 0, though one was asked for),
  so the results it acknowledged in the last `outbox.resend_window_s` (kept in memory, bounded by
  `resend_max_bytes`) are queued again and sent once more (logged as a WARNING).
- Refused PUBACKs (MQTT 5, reason code >= 0x80): "not authorized", "topic name invalid" and
  "payload format invalid" can never succeed, so the message is dropped with an error log (one
  poison message must not block the queue for ever). Other refusals ("quota exceeded",
  "unspecified error", ...) may pass later: the row stays and is retried after a per-row backoff
  (1 s doubling to 60 s) while the rest of the queue keeps flowing. A message paho refuses to
  even send (a topic with wildcards, a payload over 256 MiB) is dropped the same way.
- A broker that is down is retried with paho's exponential backoff for ever; a refused CONNACK
  is never treated as connected. Refusals for credentials or authorisation are logged as errors
  naming the reason, and retried only every `reconnect_max_s` (the broker's user list may be
  fixed without restarting the box).
- `subscribe(filter, handler)` handlers run on one dispatcher thread, never on paho's network
  thread, and one handler's exception is logged and contained. With MQTT 5, subscription
  identifiers route each incoming copy to the handlers it was sent for (overlapping filters do
  not double-call a handler).
- Each subscription's state is tracked from the broker's SUBACK: "pending" until it is
  acknowledged on the current connection, then "active", or "refused: <reason>" (logged) when
  the broker will not have it (an ACL, a filter it does not support); `stats()["subscriptions"]`.
  A message published before the SUBACK may not reach the handler: wait for "active".
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.config import MqttConfig
from agent.mqtt.client import use_credentials
from agent.mqtt.message import Handler, Message, MessageHandler, check_topic_filter
from agent.mqtt.outbox import Outbox, OutboxFull, OutboxMessage
from agent.mqtt.topics import status_topic

log = logging.getLogger(__name__)

# While the broker is away: how often its port is probed, and how long a probe may take.
_PROBE_EVERY_S = 1.0
_PROBE_TIMEOUT_S = 1.0
# The most a reconnect waits (at random) once the broker is back: a fleet returns spread out.
_RECONNECT_SPREAD_S = 3.0

# Bytes of an MQTT PUBLISH besides topic and payload: fixed header, packet id, properties.
_PACKET_OVERHEAD = 64

# the message, MQTT 5 subscription identifiers of the copy (None: match by filter)
_Incoming = tuple[Message, frozenset[int] | None]

# PUBACK reason codes that no retry can fix (MQTT 5 spec 3.4.2.1).
_PERMANENT_PUBACK_REFUSALS = {
    0x87: "not authorized",
    0x90: "topic name invalid",
    0x99: "payload format invalid",
}
# CONNACK reason codes about who we are, not about the broker's health:
# bad user name or password, not authorized, banned, bad authentication method.
_AUTH_CONNACK_REFUSALS = {0x86, 0x87, 0x8A, 0x8C}
_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 60.0
_HANDOFF_WINDOWS = 4  # see MqttConnection._handoff
_IDLE_POLL_S = 0.5  # the publisher re-checks the outbox at least this often
STALL_S = 120.0  # a connection thread without progress this long stops the watchdog pings
_STATUS_WAIT_S = 2.0  # how long stop() waits for the offline status to be acknowledged
_INBOX_SIZE = 1000  # incoming messages waiting for handlers; beyond it they are dropped and logged


@dataclass(frozen=True)
class _Subscription:
    key: int
    topic_filter: str
    handler: Handler | MessageHandler
    qos: int
    whole: bool = False  # the handler takes the Message (with its properties), not (topic, payload)


def _reason_value(reason: ReasonCode | int) -> int:
    return reason.value if isinstance(reason, ReasonCode) else int(reason)


class MqttConnection:
    """The daemon's MQTT link: presence, the outbox publisher and subscriptions (module docstring)."""

    def __init__(
        self,
        config: MqttConfig,
        device_id: str,
        outbox: Outbox,
        birth_payload: Callable[[], bytes],
        offline_payload: Callable[[], bytes],
        prepare_payload: Callable[[OutboxMessage], bytes] | None = None,
    ) -> None:
        self._config = config
        self._outbox = outbox
        self._birth_payload = birth_payload
        # Last touch before a message leaves (e.g. stamping its send time); the outbox row is unchanged.
        self._prepare_payload = prepare_payload
        self._offline_payload = offline_payload
        self.status_topic = status_topic(config.topic_prefix, device_id)
        self.client_id = config.client_id or f"edge-agent-{device_id}"
        self._broker = f"{config.host}:{config.port}"
        self._max_inflight = config.outbox.max_inflight
        # Rows handed to paho at once: its own window (max_inflight) is on the wire, the rest waits in
        # paho's queue, so a PUBACK frees a slot that paho fills at once, without waiting for this
        # connection's publisher thread (on a busy box that round trip halved the rate). paho's queue
        # is dropped at each CONNACK, like its in-flight copies: the outbox is the source of truth.
        self._handoff = self._max_inflight * _HANDOFF_WINDOWS
        self._acks_waiting = 0  # PUBACKs queued for the publisher since it last drained (a hint)
        self._deliver_lock = threading.Lock()
        self._max_payload = config.max_payload_bytes  # lowered by an MQTT 5 broker's CONNACK

        self._lock = threading.Lock()  # guards the state below and the subscription table
        self._connected = False
        self._generation = 0  # +1 per successful CONNACK; tags in-flight publishes
        self._started = False
        self._stopped = False
        self._auth_backoff = False
        self._connects = 0
        self._attempts = 0  # connection attempts since the last CONNACK (paho's network thread)
        self._backlog_share = config.outbox.backlog_share
        self._disconnects = 0
        self._published = 0
        self._rejected = 0
        self._last_error: str | None = None
        self._unreachable_logged = False
        self._socket_error: str | None = None  # paho's last socket error before a CONNACK (TLS alerts)
        self._subscriptions: dict[int, _Subscription] = {}
        self._filter_ids: dict[str, int] = {}  # filter -> MQTT 5 subscription identifier (stable)
        self._filter_state: dict[str, str] = {}  # filter -> "pending" | "active" | "refused: ..."
        self._suback_wanted: dict[int, str] = {}  # SUBSCRIBE message id -> filter, until its SUBACK
        self._suback_early: dict[int, ReasonCode] = {}  # SUBACKs that beat their mid's bookkeeping
        self._next_key = 0

        # Network thread -> delivery: ("ack", mid, reason), ("down", generation), ("session lost", ..),
        # in order. Delivery (handling them, deleting acked rows, handing paho more) runs under
        # _deliver_lock: on the publisher thread, or on paho's network thread in on_publish, which
        # only ever *tries* the lock (paho holds its own lock around on_publish, and the publisher
        # holds ours across publish(): waiting there could deadlock; busy, it wakes the publisher).
        self._events: queue.SimpleQueue[tuple[str, int, ReasonCode | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        # Owned by whoever holds _deliver_lock.
        self._inflight: dict[int, tuple[int, int]] = {}  # mid -> (outbox row id, generation)
        self._inflight_rows: set[int] = set()
        self._sent: dict[int, OutboxMessage] = {}  # row id -> the message, while in flight
        # Delivered recently (PUBACK time, message), kept for resending when the broker comes back
        # without our session (_resend_recent); bounded by resend_window_s and resend_max_bytes.
        self._recent: collections.deque[tuple[float, OutboxMessage]] = collections.deque()
        self._recent_bytes = 0
        self._retry: dict[int, tuple[float, float]] = {}  # row id -> (not before, last delay)

        self._inbox: queue.Queue[_Incoming | None] = queue.Queue(maxsize=_INBOX_SIZE)
        # Progress marks for the watchdog (stall()): the publisher's last pass, a handler's start.
        self._publisher_beat = time.monotonic()
        self._handling_since: float | None = None
        self._publisher = threading.Thread(target=self._publisher_main, name="mqtt-outbox", daemon=True)
        self._dispatcher = threading.Thread(target=self._dispatcher_main, name="mqtt-handlers", daemon=True)

        self._client = self._make_client()

    # -- setup -----------------------------------------------------------------------------------

    def _make_client(self) -> mqtt.Client:
        cfg = self._config
        if cfg.protocol == "5":
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        else:
            client = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=self.client_id,
                protocol=mqtt.MQTTv311,
                clean_session=cfg.session_expiry_s == 0,  # 3.1.1 sessions live until the broker drops them
            )
        # Shared by every connection: each adds its filter for the life of its network loop only
        # (start() to stop()), so a stopped one, or one never started, judges no other's records.
        self._paho_log = log.getChild("paho")
        client.enable_logger(self._paho_log)
        client.on_log = self._on_paho_log
        # Our callbacks catch their own errors; this keeps a slip from killing paho's network thread.
        client.suppress_exceptions = True
        client.max_inflight_messages_set(self._max_inflight)
        use_credentials(client, cfg)
        # paho waits a short fixed delay between attempts; the backoff (with its jitter and the probe
        # that ends it early) is ours: _wait_for_broker. paho annotates delays as int, handles floats.
        client.reconnect_delay_set(cast(int, cfg.reconnect_min_s), cast(int, cfg.reconnect_min_s))
        client.on_pre_connect = self._on_pre_connect
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        return client

    def _set_will(self) -> None:
        try:
            payload = self._offline_payload()
        except Exception:
            log.exception("offline_payload() failed; the last will keeps its previous payload")
            return
        self._client.will_set(self.status_topic, payload, qos=1, retain=True)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background; a broker that is down is retried with backoff for ever."""
        with self._lock:
            if self._started:
                raise RuntimeError("MqttConnection.start() called twice")
            self._started = True
        self._set_will()
        self._paho_log.addFilter(self._not_shutdown_noise)
        cfg = self._config
        log.info("connecting to MQTT broker %s as %s (MQTT %s)", self._broker, self.client_id, cfg.protocol)
        if cfg.tls is not None and cfg.tls.insecure:  # once per start, not per reconnect
            log.warning(
                "mqtt.tls.insecure is true: the broker's certificate is not checked against the host name "
                "%s, so anyone holding a certificate from the CA can pose as the broker %s and read or "
                "alter what is sent (testing only; set insecure: false)",
                cfg.host,
                self._broker,
            )
        if cfg.protocol == "5":
            # A persistent session: what the broker queued while the link was down (commands, QoS 1)
            # is delivered on reconnect, and the session ends by itself after session_expiry_s.
            session = Properties(PacketTypes.CONNECT)
            session.SessionExpiryInterval = int(cfg.session_expiry_s)
            self._client.connect_async(
                cfg.host,
                cfg.port,
                keepalive=cfg.keepalive_s,
                clean_start=cfg.session_expiry_s == 0,
                properties=session,
            )
        else:
            self._client.connect_async(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        self._dispatcher.start()
        self._publisher.start()
        self._client.loop_start()

    def _not_shutdown_noise(self, record: logging.LogRecord) -> bool:
        """paho logs "Client is not connected" at ERROR each time its loop runs without a link: on
        every failed reconnect while the broker is away (once a second or so, for hours), and once
        more after disconnect(). This connection says it once itself ("cannot reach MQTT broker",
        `last_error`), so paho's copy is not logged while there is no link. A link that the broker
        resets (it stopped or restarted) is paho's ERROR "failed to receive on socket": an everyday
        event that this connection reports itself ("lost the MQTT connection", WARNING), so paho's
        line is lowered to WARNING."""
        message = record.getMessage()
        if message.startswith("failed to receive on socket") and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        if not message.startswith("Client is not connected"):
            return True
        return not (self._stopped or not self._connected)

    def _on_paho_log(self, client: mqtt.Client, userdata: Any, level: int, message: str) -> None:
        """Keeps what paho says about a socket that fails before the CONNACK: with TLS 1.3 a broker's
        refusal of our client certificate (an alert) only shows on the first read after CONNECT, and
        paho then reports a plain disconnect; `last_error` names the alert instead."""
        # No lock: paho may log from a call made under it; a plain read and store are atomic.
        if message.startswith(("failed to receive on socket", "timeout on socket")) and not self._connected:
            self._socket_error = message

    def stop(self, publish_offline: bool = True) -> None:
        """Say offline (retained), stop the threads and disconnect. Idempotent.

        Rows still in the outbox stay there and are sent by the next run.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            started = self._started
        if not started:
            return
        # The publisher first, so nothing new goes out while we say goodbye.
        self._stopping.set()
        self._wake.set()
        self._publisher.join(timeout=5.0)
        if publish_offline and self.connected:
            try:
                info = self._client.publish(self.status_topic, self._offline_payload(), qos=1, retain=True)
                info.wait_for_publish(timeout=_STATUS_WAIT_S)
            except Exception as exc:
                log.warning("could not publish the offline status: %s", exc)
        self._client.disconnect()
        self._client.loop_stop()
        # paho's thread is done (its last "Client is not connected" said): the filter goes.
        self._paho_log.removeFilter(self._not_shutdown_noise)
        if not self._publisher.is_alive():
            # PUBACKs that arrived while we said goodbye: apply them so the next run does not resend.
            self._drain_events()
        self._inbox_put(None)
        self._dispatcher.join(timeout=5.0)
        with self._lock:
            self._connected = False
        log.info("MQTT connection to %s stopped", self._broker)

    def stall(self, limit_s: float = STALL_S) -> str | None:
        """Why the watchdog pings must stop: a thread of this connection died, or has made no
        progress for `limit_s` (the publisher passes at least every _IDLE_POLL_S; a message handler
        should take seconds). None while all is well, or before start / after stop."""
        with self._lock:
            if not self._started or self._stopped:
                return None
        now = time.monotonic()
        if not self._publisher.is_alive():
            return "MQTT: the outbox publisher thread ended"
        if now - self._publisher_beat > limit_s:
            return f"MQTT: the outbox publisher made no progress for {now - self._publisher_beat:.0f} s"
        if not self._dispatcher.is_alive():
            return "MQTT: the message handler thread ended"
        handling = self._handling_since
        if handling is not None and now - handling > limit_s:
            return f"MQTT: a message handler is stuck for {now - handling:.0f} s"
        network = getattr(self._client, "_thread", None)  # paho's loop_start() thread (not public API)
        if network is not None and not network.is_alive():
            return "MQTT: paho's network thread ended"
        return None

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._connected

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "connected": self._connected,
                "connects": self._connects,
                "disconnects": self._disconnects,
                "published": self._published,
                "rejected": self._rejected,
                "inflight": len(self._inflight_rows),
                "subscriptions": dict(self._filter_state),
                "last_error": self._last_error,
            }

    # -- outbox ----------------------------------------------------------------------------------

    def notify_new_message(self) -> None:
        """Wake the publisher now (call after `outbox.put`); without it, it polls every 0.5 s."""
        self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty or `timeout_s` passed; True when empty."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self._wake.set()
        while True:
            if self._outbox.pending() == 0:
                return True
            if not self.connected:
                return False  # nothing can leave now; the rows wait for the next start
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(0.05, remaining))

    def publish_snapshot(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool:
        """Publish now, bypassing the outbox: for reports that the next one supersedes (telemetry at
        QoS 0; reported state retained at QoS 1). False, and nothing queued, when not connected."""
        if not self.connected:
            return False
        try:
            info = self._client.publish(topic, payload, qos=qos, retain=retain)
        except Exception:
            log.exception("could not publish to %s", topic)
            return False
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def publish_reply(
        self,
        topic: str,
        payload: bytes,
        correlation_data: bytes | None = None,
        content_type: str | None = None,
    ) -> bool:
        """Publish an answer straight away (QoS 1, not through the outbox: an answer nobody waits for
        any more is worth nothing after an outage). False when there is no link."""
        properties: Properties | None = None
        if self._config.protocol == "5":
            properties = Properties(PacketTypes.PUBLISH)
            if correlation_data is not None:
                properties.CorrelationData = correlation_data
            if content_type is not None:
                properties.ContentType = content_type
        if not self.connected:
            return False
        info = self._client.publish(topic, payload, qos=1, retain=False, properties=properties)
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def publish_status_now(self) -> bool:
        """Publish the birth payload (retained) again now; False when not connected."""
        if not self.connected:
            return False
        return self._publish_birth()

    def _publish_birth(self) -> bool:
        try:
            payload = self._birth_payload()
            info = self._client.publish(self.status_topic, payload, qos=1, retain=True)
        except Exception:
            log.exception("could not publish the status (birth) message")
            return False
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def _publisher_main(self) -> None:
        while True:
            self._publisher_beat = time.monotonic()
            # Clear before working: a notify that lands during the work makes the wait return at once.
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
            self._wake.wait(_IDLE_POLL_S)

    def _deliver(self) -> None:
        """Handle what paho reported, delete acked rows, hand paho more. Caller holds _deliver_lock."""
        self._drain_events()
        if self._stopping.is_set():
            return
        self._fill_window()
        self._drain_events()

    def _fill_window(self) -> None:
        with self._lock:
            if not self._connected:
                return
            generation = self._generation
        room = self._handoff - len(self._inflight)
        if room <= 0:
            return
        now = time.monotonic()
        waiting = {row for row, (not_before, _) in self._retry.items() if not_before > now}
        # After an outage, part of the window goes to the newest results (backlog_share to the oldest).
        fresh = round(room * (1.0 - self._backlog_share))
        for message in self._outbox.peek(room, exclude=self._inflight_rows | waiting, newest=fresh):
            if self._stopping.is_set() or not self.connected:
                return
            payload = self._prepare_payload(message) if self._prepare_payload else message.payload
            # Topic, payload and header must fit: leave room for the fixed header and properties.
            if len(payload) + len(message.topic.encode()) + _PACKET_OVERHEAD > self._max_payload:
                self._reject(
                    message.id,
                    message.topic,
                    f"{len(payload)} bytes is over the limit of "
                    f"{self._max_payload} (mqtt.max_payload_bytes or the broker's maximum packet size)",
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
                with self._lock:
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
        code = _reason_value(reason) if reason is not None else 0
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
            # on the thread that takes the acks that make room).
            if not self._outbox.has_room(len(message.payload)):
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
        with self._lock:
            self._rejected += 1
            self._last_error = f"message dropped: {why}"

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe_messages(
        self, topic_filter: str, handler: MessageHandler, qos: int = 1
    ) -> Callable[[], None]:
        """As `subscribe`, the handler getting the whole Message (MQTT 5 properties included)."""
        return self._add_subscription(topic_filter, handler, qos, whole=True)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Callable[[], None]:
        """Call `handler(topic, payload)` for each matching message; returns an unsubscribe function.

        Handlers run on one dispatcher thread (keep them short). A retained message may reach a
        handler again after a reconnect, so handlers must be idempotent. With MQTT 5 each
        broker-side subscription carries a subscription identifier, so a message that matches
        several overlapping filters still reaches each handler once; MQTT 3.1.1 cannot say which
        subscription a copy is for, so there a broker that sends one copy per matching filter
        (mosquitto does) calls the handler once per copy.
        """
        return self._add_subscription(topic_filter, handler, qos, whole=False)

    def _add_subscription(
        self, topic_filter: str, handler: Handler | MessageHandler, qos: int, whole: bool
    ) -> Callable[[], None]:
        check_topic_filter(topic_filter)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        with self._lock:
            self._next_key += 1
            key = self._next_key
            self._subscriptions[key] = _Subscription(key, topic_filter, handler, qos, whole)
            sub_id = self._filter_ids.setdefault(topic_filter, len(self._filter_ids) + 1)
            self._filter_state.setdefault(topic_filter, "pending")
            connected = self._connected
        if connected:
            self._subscribe_one(topic_filter, qos, sub_id)

        def unsubscribe() -> None:
            with self._lock:
                if self._subscriptions.pop(key, None) is None:
                    return
                still_used = any(s.topic_filter == topic_filter for s in self._subscriptions.values())
                connected = self._connected
                if not still_used:
                    self._filter_state.pop(topic_filter, None)
            if connected and not still_used:
                self._client.unsubscribe(topic_filter)

        return unsubscribe

    def _subscribe_one(self, topic_filter: str, qos: int, sub_id: int) -> None:
        properties: Properties | None = None
        if self._config.protocol == "5":
            # One identifier per SUBSCRIBE packet, so filters are subscribed one at a time.
            properties = Properties(PacketTypes.SUBSCRIBE)
            properties.SubscriptionIdentifier = sub_id
        with self._lock:
            self._filter_state[topic_filter] = "pending"
        result, mid = self._client.subscribe(topic_filter, qos, properties=properties)
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            log.warning("could not subscribe to %s: %s", topic_filter, mqtt.error_string(result))
            return
        # The SUBACK comes on paho's network thread, possibly before this line (no lock is held
        # across paho's subscribe(): see _events); whichever side comes second settles it.
        with self._lock:
            early = self._suback_early.pop(mid, None)
            if early is None:
                self._suback_wanted[mid] = topic_filter
        if early is not None:
            self._settle_subscription(topic_filter, early)

    def _settle_subscription(self, topic_filter: str, reason: ReasonCode) -> None:
        if reason.is_failure:
            why = f"broker {self._broker} refused the subscription to {topic_filter}: {reason}"
            log.error("%s (%#x); its messages will not arrive", why, _reason_value(reason))
            state = f"refused: {reason}"
        else:
            state = "active"
        with self._lock:
            if topic_filter in self._filter_state:  # not unsubscribed meanwhile
                self._filter_state[topic_filter] = state
            if reason.is_failure:
                self._last_error = why

    def _resubscribe(self) -> None:
        with self._lock:
            wanted: dict[str, int] = {}
            for sub in self._subscriptions.values():
                wanted[sub.topic_filter] = max(sub.qos, wanted.get(sub.topic_filter, 0))
            ids = dict(self._filter_ids)
        for topic_filter, qos in wanted.items():
            self._subscribe_one(topic_filter, qos, ids[topic_filter])

    def _inbox_put(self, item: _Incoming | None) -> None:
        try:
            self._inbox.put_nowait(item)
        except queue.Full:
            if item is None:
                self._inbox.put(item)  # stop() must get through; the dispatcher is draining
            else:
                log.warning("handler queue full (%d); dropped a message on %s", _INBOX_SIZE, item[0].topic)

    def _dispatcher_main(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            message, sub_ids = item
            topic = message.topic
            with self._lock:
                subs = list(self._subscriptions.values())
                ids = dict(self._filter_ids)
            subs = [s for s in subs if mqtt.topic_matches_sub(s.topic_filter, topic)]
            if sub_ids is not None:
                # MQTT 5: this copy is for exactly these broker-side subscriptions. A copy queued in
                # the session by an earlier run carries that run's identifiers, which may number
                # other filters now (agent.yaml changed): when they name none that matches, the
                # topic decides.
                subs = [s for s in subs if ids.get(s.topic_filter) in sub_ids] or subs
            for sub in subs:
                self._handling_since = time.monotonic()
                try:
                    if sub.whole:
                        cast(MessageHandler, sub.handler)(message)
                    else:
                        cast(Handler, sub.handler)(topic, message.payload)
                except Exception:
                    log.exception("MQTT handler for %s failed on a message on %s", sub.topic_filter, topic)
                finally:
                    self._handling_since = None

    # -- paho callbacks (network thread: never block, never raise) --------------------------------

    def _on_pre_connect(self, client: mqtt.Client, userdata: Any) -> None:
        # The offline payload may carry state (version, uptime): refresh the will for each attempt.
        self._set_will()
        self._attempts += 1
        if self._attempts > 1 and not self._auth_backoff:
            self._wait_for_broker(self._attempts)

    def _wait_for_broker(self, attempt: int) -> None:
        """Back off before reconnect attempt `attempt` (exponential from reconnect_min_s to
        reconnect_max_s, a random half of it as jitter), but end the wait once the broker's port
        accepts a TCP connection again (probed every few seconds): a broker back after a long outage
        is reconnected to within seconds, not at the end of a 60 s backoff. The connect itself waits
        a random moment within a short spread so a fleet does not come back all at once."""
        cfg = self._config
        backoff = min(cfg.reconnect_max_s, cfg.reconnect_min_s * 2 ** min(attempt - 2, 16))
        deadline = time.monotonic() + random.uniform(backoff / 2, backoff)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.wait(min(_PROBE_EVERY_S, remaining)):
                return
            if self._broker_listens():
                self._stopping.wait(random.uniform(0, min(_RECONNECT_SPREAD_S, 3 * cfg.reconnect_min_s)))
                return

    def _broker_listens(self) -> bool:
        try:
            with socket.create_connection((self._config.host, self._config.port), timeout=_PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        try:
            if reason_code.is_failure:
                self._on_refused(reason_code)
                return
            if self._stopping.is_set():
                return  # a reconnect racing stop(): don't undo the offline status with a birth
            # paho would resend what was in flight on the old link; the outbox resends it instead,
            # so there is one copy per row and the PUBACK bookkeeping stays in one place. This runs
            # before `connected` turns true so no new outbox publish can be dropped with them.
            client.drop_out_messages()
            # An MQTT 5 broker may announce a smaller packet limit than ours; a bigger message
            # would make it drop the link, and the outbox would resend it first, for ever.
            broker_limit = getattr(properties, "MaximumPacketSize", None) if properties else None
            self._max_payload = min(
                self._config.max_payload_bytes, broker_limit or self._config.max_payload_bytes
            )
            log.info("connected to MQTT broker %s", self._broker)
            # A broker without our session (we always ask it to keep one, unless session_expiry_s is
            # 0) restarted without saving it: what it acknowledged shortly before may be lost.
            if self._connects and self._config.session_expiry_s and not flags.session_present:
                self._events.put(("session lost", 0, None))
            # Birth first: a watcher sees "online" before this connection's results.
            self._publish_birth()
            with self._lock:
                self._connected = True
                self._generation += 1
                self._connects += 1
                self._attempts = 0
                self._last_error = None
                self._unreachable_logged = False
                self._socket_error = None
                restore_backoff = self._auth_backoff
                self._auth_backoff = False
            if restore_backoff:
                cfg = self._config
                client.reconnect_delay_set(cast(int, cfg.reconnect_min_s), cast(int, cfg.reconnect_min_s))
            # After `connected` is set: a concurrent subscribe() is either in this snapshot or
            # subscribes itself (at worst twice, which is harmless).
            self._resubscribe()
            self._wake.set()
        except Exception:
            log.exception("error in the MQTT on_connect handler")

    def _on_refused(self, reason_code: ReasonCode) -> None:
        code = _reason_value(reason_code)
        why = f"broker {self._broker} refused the connection: {reason_code} ({code:#x})"
        with self._lock:
            self._last_error = why
        if code in _AUTH_CONNACK_REFUSALS:
            log.error(
                "%s; check mqtt.username / password(_file) / client certificate and the broker's ACL "
                "(retrying every %g s)",
                why,
                self._config.reconnect_max_s,
            )
            # Hammering a broker with bad credentials helps nobody; retry slowly until it accepts.
            with self._lock:
                self._auth_backoff = True
            delay = cast(int, self._config.reconnect_max_s)
            self._client.reconnect_delay_set(delay, delay)
        else:
            log.error("%s; retrying with backoff", why)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        # paho calls this from its `except OSError` around the connect attempt, so the error is at
        # hand: name it, or a TLS failure (untrusted certificate) reads like a broker that is down.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            why = f"TLS handshake with MQTT broker {self._broker} failed: {error}"
            if isinstance(error, ssl.SSLCertVerificationError) and "mismatch" in str(error):
                why += (
                    f"; the broker's certificate is not for the host name {self._config.host!r} "
                    "(mqtt.host): connect by a host name or address the certificate holds, or give the "
                    "broker a certificate for this one (mqtt.tls.insecure skips this check: testing only)"
                )
        else:
            why = f"cannot reach MQTT broker {self._broker}" + (f": {error}" if error is not None else "")
        with self._lock:
            self._last_error = why
            first = not self._unreachable_logged
            self._unreachable_logged = True
        if first:
            log.warning("%s; retrying with backoff, results wait in the outbox", why)

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        closed_early, why = False, ""
        try:
            with self._lock:
                was_connected = self._connected
                self._connected = False
                # SUBACKs of the old connection will not come; the next CONNACK subscribes again.
                self._suback_wanted.clear()
                self._suback_early.clear()
                for topic_filter in self._filter_state:
                    self._filter_state[topic_filter] = "pending"
                generation = self._generation
                stopping = self._stopped
                if was_connected:
                    self._disconnects += 1
                    if not stopping:
                        self._last_error = f"disconnected: {reason_code}"
                elif not stopping and (self._last_error is None or self._socket_error is not None):
                    # Dropped before CONNACK (e.g. TLS 1.3: the broker refusing our client certificate,
                    # or the lack of one, with an alert): say why, without hiding a more precise
                    # CONNACK refusal seen earlier.
                    if self._tls_ended(self._socket_error):
                        ended = self._socket_error or "the broker closed the connection"
                        said = f"{ended} ({self._tls_alert_hint()})"
                    else:
                        said = str(self._socket_error or reason_code)
                    self._last_error = f"connection to {self._broker} closed before CONNACK: {said}"
                    self._socket_error = None
                    closed_early = not self._unreachable_logged
                    self._unreachable_logged = True
                    why = self._last_error
            self._events.put(("down", generation, None))
            self._wake.set()
            if was_connected and not stopping:
                log.warning("lost the MQTT connection to %s (%s); reconnecting", self._broker, reason_code)
            elif closed_early:
                log.warning("%s; retrying with backoff, results wait in the outbox", why)
        except Exception:
            log.exception("error in the MQTT on_disconnect handler")

    def _tls_ended(self, socket_error: str | None) -> bool:
        """The broker ended the TLS session before the CONNACK: with an alert, or (TLS 1.3, when it
        closes before the alert is read) with a bare end of the stream or a plain close (None)."""
        if self._config.tls is None:
            return False
        text = (socket_error or "").lower()
        return socket_error is None or "alert" in text or "eof occurred in violation" in text

    def _tls_alert_hint(self) -> str:
        """What to check when the broker ended the TLS session with an alert before the CONNACK."""
        tls = self._config.tls
        if tls is None or tls.cert_file is None:
            return (
                "the broker ended the TLS session: if it wants a client certificate, give "
                "mqtt.tls.cert_file and key_file"
            )
        return (
            f"the broker ended the TLS session: check that mqtt.tls.cert_file ({tls.cert_file}) is a "
            "client certificate it trusts"
        )

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._events.put(("ack", mid, reason_code))
        # Deliver once paho's queue behind the wire window runs dry, or half the hand-off is
        # acknowledged, not on every PUBACK: acked rows are deleted and the hand-off refilled in
        # batches, here on the network thread (no hop to the publisher thread: +24% on a backlog in
        # an A/B), or by the publisher when it is busy delivering itself. (Both counts are read
        # without holding _deliver_lock: hints, never a correctness issue; the publisher also wakes
        # on new results, disconnects and every _IDLE_POLL_S.)
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

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        try:
            reason = reason_codes[0]  # one filter per SUBSCRIBE (_subscribe_one)
            with self._lock:
                topic_filter = self._suback_wanted.pop(mid, None)
                if topic_filter is None:
                    self._suback_early[mid] = reason
            if topic_filter is not None:
                self._settle_subscription(topic_filter, reason)
        except Exception:
            log.exception("error in the MQTT on_subscribe handler")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:
            log.warning("ignored a message whose topic is not UTF-8")
            return
        sub_ids: frozenset[int] | None = None
        props = message.properties
        if props is not None and hasattr(props, "SubscriptionIdentifier"):
            raw = props.SubscriptionIdentifier
            sub_ids = frozenset(raw if isinstance(raw, list) else [raw])
        correlation = getattr(props, "CorrelationData", None)
        incoming = Message(
            topic,
            bytes(message.payload),
            bool(message.retain),
            getattr(props, "ResponseTopic", None),
            bytes(correlation) if correlation is not None else None,
            tuple((str(k), str(v)) for k, v in getattr(props, "UserProperty", None) or ()),
            getattr(props, "ContentType", None),
            getattr(props, "MessageExpiryInterval", None),
        )
        self._inbox_put((incoming, sub_ids))
