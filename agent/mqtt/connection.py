"""One MQTT connection per daemon: paho-mqtt 2.x behind a small, testable surface.

This module is the link itself; its parts live beside it:
- agent/mqtt/client.py: the paho client from `mqtt:` (protocol, login, TLS) and what TLS failures mean;
- agent/mqtt/publisher.py: the outbox publisher (in-flight window, PUBACKs, retries, resends);
- agent/mqtt/router.py: the subscription table and its dispatcher thread (and the daemon's Router).

What the link guarantees:
- Presence: the last will is the offline payload (retained, QoS 1) on the status topic; every
  successful CONNACK publishes the birth payload there (retained, QoS 1) and then resubscribes
  every registered subscription (the broker may have forgotten them).
- Results never get lost while the link is down: they wait in the SQLite `Outbox`, and the
  publisher deletes a row only on its PUBACK. paho's own copies of what was in flight are dropped at
  each CONNACK (`drop_out_messages`), so the outbox is the single source of truth (at-least-once).
- A PUBACK means the broker took the message, not that it can never lose it: mosquitto keeps what
  it queues for subscribers in memory, and a broker killed before it saved loses it. Such a broker
  comes back without this agent's session (CONNACK session-present 0, though one was asked for):
  the publisher then sends what it acknowledged lately again.
- A broker that is down is retried with backoff for ever (its port probed, so a broker back after a
  long outage is reconnected to within seconds); a refused CONNACK is never treated as connected.
  Refusals for credentials or authorisation are logged as errors naming the reason, and retried
  only every `reconnect_max_s` (the broker's user list may be fixed without restarting the box).
"""

from __future__ import annotations

import logging
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.config import MqttConfig
from agent.mqtt.client import connect_failure, make_client, tls_alert_hint, tls_ended
from agent.mqtt.message import Handler, MessageHandler
from agent.mqtt.outbox import Outbox, OutboxMessage
from agent.mqtt.publisher import OutboxPublisher, reason_value
from agent.mqtt.router import SubscriptionTable
from agent.mqtt.topics import status_topic
from agent.retry import backoff_delay

log = logging.getLogger(__name__)

# While the broker is away: how often its port is probed, and how long a probe may take.
_PROBE_EVERY_S = 1.0
_PROBE_TIMEOUT_S = 1.0
# The most a reconnect waits (at random) once the broker is back: a fleet returns spread out.
_RECONNECT_SPREAD_S = 3.0
# An outbox at least this full is under pressure: every moment offline may cost a result (the
# when_full policy), so its port is probed this often, without end, and the spread is skipped.
_PRESSED_FILL = 0.5
_PROBE_PRESSED_S = 0.05
# CONNACK reason codes about who we are, not about the broker's health:
# bad user name or password, not authorized, banned, bad authentication method.
_AUTH_CONNACK_REFUSALS = {0x86, 0x87, 0x8A, 0x8C}
# paho's keepalive clock (private, see _restart_keepalive_clock): last bytes in (2.2; 2.0-2.1:
# _last_msg_in) and last packet out.
_PAHO_TRAFFIC_CLOCKS = ("_last_bytes_received", "_last_msg_in", "_last_msg_out")
STALL_S = 120.0  # a connection thread without progress this long stops the watchdog pings
_STATUS_WAIT_S = 2.0  # how long stop() waits for the offline status to be acknowledged


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
        self._offline_payload = offline_payload
        self.status_topic = status_topic(config.topic_prefix, device_id)
        self.client_id = config.client_id or f"edge-agent-{device_id}"
        self._broker = f"{config.host}:{config.port}"

        self._lock = threading.Lock()  # guards the state below
        self._connected = False
        self._generation = 0  # +1 per successful CONNACK; tags in-flight publishes
        self._started = False
        self._stopped = False
        self._auth_backoff = False
        self._connects = 0
        self._attempts = 0  # connection attempts since the last CONNACK (paho's network thread)
        self._disconnects = 0
        self._last_error: str | None = None
        self._unreachable_logged = False
        self._socket_error: str | None = None  # paho's last socket error before a CONNACK (TLS alerts)
        self._stopping = threading.Event()

        self._client = self._make_client()
        # prepare_payload: the last touch before a message leaves (the daemon stamps a result's send
        # time); the outbox row is unchanged.
        self.publisher = OutboxPublisher(
            config,
            outbox,
            self._client,
            self._link,
            self._stopping,
            self._set_error,
            self._broker,
            prepare_payload,
        )
        self.subscriptions = SubscriptionTable(
            self._client, config.protocol, self._broker, lambda: self.connected, self._set_error
        )

    # -- setup -----------------------------------------------------------------------------------

    def _make_client(self) -> mqtt.Client:
        cfg = self._config
        client = make_client(cfg, self.client_id)
        # Shared by every connection: each adds its filter for the life of its network loop only
        # (start() to stop()), so a stopped one, or one never started, judges no other's records.
        self._paho_log = log.getChild("paho")
        client.enable_logger(self._paho_log)
        client.on_log = self._on_paho_log
        # Our callbacks catch their own errors; this keeps a slip from killing paho's network thread.
        client.suppress_exceptions = True
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

    def _link(self) -> int | None:
        """The link's generation while connected, None while not (the publisher asks)."""
        with self._lock:
            return self._generation if self._connected else None

    def _set_error(self, why: str) -> None:
        with self._lock:
            self._last_error = why

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
        self._outbox.keep_reserve(True)  # no link yet
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
        self.subscriptions.start()
        self.publisher.start()
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
        self.publisher.stop()
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
        self.publisher.settle()
        self.subscriptions.stop()
        with self._lock:
            self._connected = False
        log.info("MQTT connection to %s stopped", self._broker)

    def stall(self, limit_s: float = STALL_S) -> str | None:
        """Why the watchdog pings must stop: a thread of this connection died, or has made no
        progress for `limit_s` (the publisher passes at least every IDLE_POLL_S; a message handler
        should take seconds). None while all is well, or before start / after stop."""
        with self._lock:
            if not self._started or self._stopped:
                return None
        now = time.monotonic()
        if not self.publisher.is_alive():
            return "MQTT: the outbox publisher thread ended"
        if now - self.publisher.beat > limit_s:
            return f"MQTT: the outbox publisher made no progress for {now - self.publisher.beat:.0f} s"
        if not self.subscriptions.is_alive():
            return "MQTT: the message handler thread ended"
        handling = self.subscriptions.handling_since
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
            link = {
                "connected": self._connected,
                "connects": self._connects,
                "disconnects": self._disconnects,
            }
            last_error = self._last_error
        counts = self.publisher.counts()
        return {
            **link,
            "published": counts["published"],
            "rejected": counts["rejected"],
            "inflight": counts["inflight"],
            "subscriptions": self.subscriptions.states(),
            "last_error": last_error,
        }

    # -- outbox and subscriptions ----------------------------------------------------------------

    def notify_new_message(self) -> None:
        """Wake the publisher now (call after `outbox.put`); without it, it polls every 0.5 s."""
        self.publisher.wake()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty or `timeout_s` passed; True when empty."""
        return self.publisher.flush(timeout_s)

    def subscribe_messages(
        self, topic_filter: str, handler: MessageHandler, qos: int = 1
    ) -> Callable[[], None]:
        """As `subscribe`, the handler getting the whole Message (MQTT 5 properties included)."""
        return self.subscriptions.add(topic_filter, handler, qos, whole=True)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Callable[[], None]:
        """Call `handler(topic, payload)` for each matching message; returns an unsubscribe function.

        Handlers run on one dispatcher thread (keep them short). A retained message may reach a
        handler again after a reconnect, so handlers must be idempotent. With MQTT 5 each
        broker-side subscription carries a subscription identifier, so a message that matches
        several overlapping filters still reaches each handler once; MQTT 3.1.1 cannot say which
        subscription a copy is for, so there a broker that sends one copy per matching filter
        (mosquitto does) calls the handler once per copy. States: `stats()["subscriptions"]`.
        """
        return self.subscriptions.add(topic_filter, handler, qos, whole=False)

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

    # -- paho callbacks (network thread: never block, never raise) --------------------------------

    def _on_pre_connect(self, client: mqtt.Client, userdata: Any) -> None:
        # The offline payload may carry state (version, uptime): refresh the will for each attempt.
        self._set_will()
        self._attempts += 1
        if self._attempts > 1 and not self._auth_backoff:
            self._wait_for_broker(self._attempts)
            self._restart_keepalive_clock()

    def _restart_keepalive_clock(self) -> None:
        """paho stamps its keepalive clock ("last traffic in and out") in reconnect(), *before* it calls
        on_pre_connect; the wait above does not count as silence on a link (there is none), but paho's
        keepalive check counts it: after a wait longer than keepalive_s (a long outage, probed by
        _wait_for_broker) it closed the new socket before the CONNACK could arrive ("Keep alive
        timeout"), and the next attempt came a reconnect delay (reconnect_min_s) later. The clock
        starts again here, when the connect really begins. (Private attributes: paho 2.2 names the
        inbound one _last_bytes_received, 2.0-2.1 _last_msg_in; tests/test_long_outage.py checks.)"""
        client = self._client
        now = getattr(mqtt, "time_func", time.monotonic)()  # paho's own clock
        with client._msgtime_mutex:
            for name in _PAHO_TRAFFIC_CLOCKS:
                if hasattr(client, name):
                    setattr(client, name, now)

    def _wait_for_broker(self, attempt: int) -> None:
        """Back off before reconnect attempt `attempt` (exponential from reconnect_min_s to
        reconnect_max_s, a random half of it as jitter), but end the wait once the broker's port
        accepts a TCP connection again (probed every second): a broker back after a long outage is
        reconnected to within seconds, not at the end of a 60 s backoff. The connect itself waits a
        random moment within a short spread so a fleet does not come back all at once.

        An outbox under pressure (at least half full) cannot afford either: it is probed every
        _PROBE_PRESSED_S until the broker listens, and connects at once (results would be dropped
        while it waited; the spread is for boxes with room to wait)."""
        cfg = self._config
        backoff = backoff_delay(attempt - 1, cfg.reconnect_min_s, cfg.reconnect_max_s, jitter="half")
        deadline = time.monotonic() + backoff
        while not self._stopping.is_set():
            pressed = self._outbox.fill() >= _PRESSED_FILL
            if self._broker_listens():
                if not pressed:
                    self._stopping.wait(random.uniform(0, min(_RECONNECT_SPREAD_S, 3 * cfg.reconnect_min_s)))
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not pressed:
                return
            self._stopping.wait(_PROBE_PRESSED_S if pressed else min(_PROBE_EVERY_S, remaining))

    def _broker_listens(self) -> bool:
        try:
            address = (self._config.host, self._config.port)
            with socket.create_connection(address, timeout=_PROBE_TIMEOUT_S) as probe:
                # A broker on a local port in the ephemeral range can be "reached" by TCP's self-connect
                # (the probe's source port happens to be the port itself): nobody listens then.
                return bool(probe.getsockname() != probe.getpeername())
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
            # The room kept free while the link was down is for the results made from now on, while
            # the first drain's PUBACKs are on their way (outbox.RESERVE_SHARE).
            self._outbox.keep_reserve(False)
            # paho would resend what was in flight on the old link; the outbox resends it instead,
            # so there is one copy per row and the PUBACK bookkeeping stays in one place. This runs
            # before `connected` turns true so no new outbox publish can be dropped with them.
            client.drop_out_messages()
            # An MQTT 5 broker may announce a smaller packet limit than ours; a bigger message
            # would make it drop the link, and the outbox would resend it first, for ever.
            broker_limit = getattr(properties, "MaximumPacketSize", None) if properties else None
            self.publisher.max_payload = min(
                self._config.max_payload_bytes, broker_limit or self._config.max_payload_bytes
            )
            log.info("connected to MQTT broker %s", self._broker)
            # A broker without our session (we always ask it to keep one, unless session_expiry_s is
            # 0) restarted without saving it: what it acknowledged shortly before may be lost.
            if self._connects and self._config.session_expiry_s and not flags.session_present:
                self.publisher.session_lost()
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
            self.subscriptions.resubscribe()
            self.publisher.wake()
        except Exception:
            log.exception("error in the MQTT on_connect handler")

    def _on_refused(self, reason_code: ReasonCode) -> None:
        code = reason_value(reason_code)
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
        why = connect_failure(sys.exc_info()[1], self._config)
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
            self._outbox.keep_reserve(True)
            with self._lock:
                was_connected = self._connected
                self._connected = False
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
                    if tls_ended(self._config, self._socket_error):
                        ended = self._socket_error or "the broker closed the connection"
                        said = f"{ended} ({tls_alert_hint(self._config)})"
                    else:
                        said = str(self._socket_error or reason_code)
                    self._last_error = f"connection to {self._broker} closed before CONNACK: {said}"
                    self._socket_error = None
                    closed_early = not self._unreachable_logged
                    self._unreachable_logged = True
                    why = self._last_error
            self.subscriptions.link_down()
            self.publisher.link_down(generation)
            if was_connected and not stopping:
                log.warning("lost the MQTT connection to %s (%s); reconnecting", self._broker, reason_code)
            elif closed_early:
                log.warning("%s; retrying with backoff, results wait in the outbox", why)
        except Exception:
            log.exception("error in the MQTT on_disconnect handler")

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self.publisher.acked(mid, reason_code)

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        try:
            self.subscriptions.suback(mid, reason_codes[0])  # one filter per SUBSCRIBE
        except Exception:
            log.exception("error in the MQTT on_subscribe handler")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.subscriptions.received(message)
