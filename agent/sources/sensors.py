"""Sensor values from MQTT: subscribe, parse each message into numbers, cut them into windows.

Every value goes into windows in arrival order and the windows into a bounded FrameQueue, so a
model that keeps up within `max_queue` windows sees every value. A message that is not a number,
an array of numbers, or JSON with the configured field is counted and named in the stats, never
fatal. The subscription is QoS 1 on a persistent session (one client id per pipeline): while the
agent is away the broker keeps what arrives, within its own limits.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt

from agent.config import MqttConfig, MqttSourceConfig
from agent.logfmt import first_or_every
from agent.mqtt.client import use_credentials
from agent.sources.base import SourceBase
from agent.sources.frames import FrameQueue, Windower
from agent.status import SensorCounters

log = logging.getLogger(__name__)

_SEPARATORS = re.compile(r"[,\s;]+")


def parse_values(payload: bytes | bytearray, field: str | None) -> list[float]:
    """The numbers in one message. ValueError says what is wrong with it."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if not text:
        raise ValueError("empty payload")
    try:
        value: Any = json.loads(text)
    except ValueError:
        if field is not None:
            raise ValueError(f"not JSON, so it has no field {field!r}") from None
        try:
            return _finite([float(part) for part in _SEPARATORS.split(text) if part])
        except ValueError:
            raise ValueError(f"not a number, a JSON array of numbers or JSON: {text[:40]!r}") from None
    if field is not None:
        for key in field.split("."):
            if isinstance(value, dict) and key in value:
                value = value[key]
            elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            else:
                raise ValueError(f"no field {field!r} (missing {key!r})")
    numbers = value if isinstance(value, list) else [value]
    if not numbers or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        raise ValueError(
            f"{'field ' + repr(field) if field else 'payload'} is not a number or a list of numbers"
        )
    return _finite([float(v) for v in numbers])


def _finite(values: list[float]) -> list[float]:
    if not all(math.isfinite(v) for v in values):
        raise ValueError("NaN or infinite value")
    return values


@dataclass(frozen=True)
class BrokerLink:
    """The agent's broker connection, for MQTT sensor sources that name no broker of their own."""

    mqtt: MqttConfig
    client_id: str  # the agent's client id; a source's is this plus "-sensor-<pipeline>"


class MqttSource(SourceBase):
    """Subscribes for one pipeline; windows of `window` values every `hop` values into `queue`."""

    kind = "mqtt"

    def __init__(
        self, config: MqttSourceConfig, name: str, queue: FrameQueue, broker: BrokerLink | None = None
    ) -> None:
        """`broker`: the agent's own broker and client id, used when the config names no host."""
        own = broker is not None and config.host is None
        self.host = broker.mqtt.host if own and broker else (config.host or "127.0.0.1")
        self.port = broker.mqtt.port if own and broker else config.port
        super().__init__(name, queue, f"mqtt://{self.host}:{self.port}/{config.topic}")
        self.config = config
        self._windows = Windower(queue, config.window, config.hop or config.window)
        self.messages = 0
        self.bad_messages = 0
        self.last_bad: str | None = None
        # Client ids are unique per broker: a fleet's boxes share one, so the device's id is in it.
        client_id = f"{broker.client_id if broker else 'edge-agent'}-sensor-{name}"
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False, protocol=mqtt.MQTTv311
        )
        if own and broker:
            use_credentials(self._client, broker.mqtt)
        elif config.username is not None:
            self._client.username_pw_set(config.username, config.login_password())
        self._client.reconnect_delay_set(round(config.reopen_min_s) or 1, max(1, round(config.reopen_max_s)))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe

    def start(self) -> None:
        try:
            self._client.connect_async(self.host, self.port, keepalive=30)
        except (OSError, ValueError) as exc:
            self._fail(f"cannot connect to {self.display_uri}: {exc}")
        self._client.loop_start()

    def request_stop(self) -> None:
        with self._lock:
            self.state = "stopped"  # before disconnecting: the disconnect is no outage
        self._client.disconnect()

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        self._client.loop_stop()
        self.slot.close()

    def _counters(self) -> SensorCounters:
        return SensorCounters(self.messages, self.bad_messages, self.last_bad, self._windows.index)

    # --- paho's network thread ------------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._fail(f"broker {self.host}:{self.port} refused: {reason}")
            return
        with self._lock:
            if not flags.session_present:  # what came meanwhile is lost: a new stretch
                self._windows.restart()
        # Streaming only once the broker grants the subscription (_on_subscribe): before its
        # SUBACK a message on the topic may pass the source by.
        client.subscribe(self.config.topic, qos=1)

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, _mid: int, reasons: Any, _props: Any
    ) -> None:
        reason = reasons[0]
        if not reason.is_failure:
            log.info("source %s: subscribed to %s", self.name, self.display_uri)
            self._set_state("streaming")
            return
        # An ACL that does not allow the topic: say so, and ask again later (it may be fixed).
        self._fail(f"broker {self.host}:{self.port} refused the subscription to "
                   f"{self.config.topic}: {reason}; check the broker's ACL for this client")  # fmt: skip
        retry = threading.Timer(self.config.reopen_max_s, self._subscribe_again, args=(client,))
        retry.daemon = True
        retry.start()

    def _subscribe_again(self, client: mqtt.Client) -> None:
        if self.state != "stopped" and client.is_connected():
            client.subscribe(self.config.topic, qos=1)

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if self.state == "stopped":  # our own disconnect
            return
        self._count_reconnect()
        self._fail(f"lost the broker at {self.host}:{self.port}: {reason}")

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            values = parse_values(message.payload, self.config.field)
        except ValueError as exc:
            with self._lock:
                self.messages += 1
                self.bad_messages += 1
                self.last_bad = f"topic {message.topic}: {exc}"
                count = self.bad_messages
            if first_or_every(count):
                log.warning(
                    "source %s: bad message (%d so far): topic %s: %s", self.name, count, message.topic, exc
                )
            return
        now = time.time()
        with self._lock:
            self.messages += 1
            self._windows.add(values, now)
