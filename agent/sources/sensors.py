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
from typing import Any

import paho.mqtt.client as mqtt

from agent.config import MqttSourceConfig
from agent.sources.frames import FrameQueue, Windower

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


class MqttSource:
    """Subscribes for one pipeline; windows of `window` values every `hop` values into `queue`."""

    def __init__(self, config: MqttSourceConfig, name: str, queue: FrameQueue) -> None:
        self.config = config
        self.name = name
        self.slot = queue
        self.display_uri = f"mqtt://{config.host}:{config.port}/{config.topic}"
        self.kind = "mqtt"
        self.hop = config.hop or config.window
        self._lock = threading.Lock()
        self._windows = Windower(queue, config.window, self.hop)
        self.state = "starting"
        self.error: str | None = None
        self.messages = 0
        self.bad_messages = 0
        self.last_bad: str | None = None
        self.windows = 0
        self.reconnects = 0
        self.outages = 0
        self.last_outage_s: float | None = None
        self._outage_started: float | None = None
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"edge-agent-sensor-{name}",
            clean_session=False,
            protocol=mqtt.MQTTv311,
        )
        if config.username is not None:
            self._client.username_pw_set(config.username, config.password)
        self._client.reconnect_delay_set(round(config.reopen_min_s) or 1, max(1, round(config.reopen_max_s)))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message

    def start(self) -> None:
        try:
            self._client.connect_async(self.config.host, self.config.port, keepalive=30)
        except (OSError, ValueError) as exc:
            self._set_state("retrying", f"cannot connect to {self.display_uri}: {exc}")
        self._client.loop_start()

    def request_stop(self) -> None:
        with self._lock:
            self.state = "stopped"  # before disconnecting: the disconnect is no outage
        self._client.disconnect()

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        self._client.loop_stop()
        self.slot.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "uri": self.display_uri,
                "state": self.state,
                "error": self.error,
                "messages": self.messages,
                "bad_messages": self.bad_messages,
                "last_bad_message": self.last_bad,
                "windows": self.windows,
                "frames_dropped": self.slot.dropped,
                "queued": len(self.slot),
                "reconnects": self.reconnects,
                "outages": self.outages,
                "last_outage_s": self.last_outage_s,
            }

    # --- paho's network thread ------------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._set_state("retrying", f"broker {self.config.host}:{self.config.port} refused: {reason}")
            return
        client.subscribe(self.config.topic, qos=1)
        with self._lock:
            if not flags.session_present:  # what came meanwhile is lost: a new stretch
                self._windows.restart()
        log.info("source %s: subscribed to %s", self.name, self.display_uri)
        self._set_state("streaming")

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        with self._lock:
            if self.state == "stopped":
                return
            self.reconnects += 1
        self._set_state("retrying", f"lost the broker at {self.config.host}:{self.config.port}: {reason}")

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            values = parse_values(message.payload, self.config.field)
        except ValueError as exc:
            with self._lock:
                self.messages += 1
                self.bad_messages += 1
                self.last_bad = f"topic {message.topic}: {exc}"
                count = self.bad_messages
            if count == 1 or count % 100 == 0:
                log.warning(
                    "source %s: bad message (%d so far): topic %s: %s", self.name, count, message.topic, exc
                )
            return
        now = time.time()
        with self._lock:
            self.messages += 1
            self._windows.add(values, now)
            self.windows = self._windows.index

    def _set_state(self, state: str, error: str | None = None) -> None:
        with self._lock:
            if self.state == "stopped":
                return
            if state == "retrying" and self._outage_started is None:
                self._outage_started = time.time()
            if state == "streaming" and self._outage_started is not None:
                if self.state == "retrying":
                    self.outages += 1
                    self.last_outage_s = round(time.time() - self._outage_started, 3)
                self._outage_started = None
            if state == "retrying" and self.error != error:
                log.error("source %s: %s; reconnecting with backoff", self.name, error)
            self.state, self.error = state, error
