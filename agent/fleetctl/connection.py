"""One MQTT 5 connection to the fleet's broker and the retained state it holds: what
`edge-agent fleet ...` (agent/fleetctl/client.py) talks through. Connects, subscribes, publishes
(QoS 1, waiting for the PUBACK) and keeps the latest retained reported state, status and desired
documents as bytes, parsed into records only when asked for, so 10,000 devices cost one pass of
JSON parsing.

Retained state is read with QoS 0 subscriptions followed by a barrier: a second SUBSCRIBE (that
asks for no retained messages) whose SUBACK comes after every retained message of the first. A
broker sends QoS 0 messages as it queues them, so once that SUBACK is in, the snapshot is
complete, with no guessing how long a broker takes (mosquitto delivers 10,000 retained messages
in about 0.4 s). QoS 1 would not do: brokers hold QoS 1 messages beyond a small in-flight window
(mosquitto: 20) in a queue the SUBACK overtakes, and drop those beyond `max_queued_messages`
(mosquitto: 1000). A short quiet period after the barrier covers brokers that order differently.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from agent.config import check_name
from agent.errors import EdgeAgentError
from agent.fleet.protocol import device_layer, group_layer
from agent.fleetctl.records import DeviceRecord, parse_device, parse_status, read_document
from agent.mqtt.router import REPLY_SUFFIX
from agent.mqtt.topics import GROUPS_LEVEL

DEFAULT_PREFIX = "edge"
POLL_S = 0.1  # how often waits re-check the state (data messages do not wake waiters one by one)

_Connection = TypeVar("_Connection", bound="BrokerConnection")


class FleetError(EdgeAgentError):
    """Something the operator must fix; the subclass says which kind (the CLI maps it to its exit
    code): BrokerError, FleetTimeout, or FleetError itself for an invalid request."""


class BrokerError(FleetError):
    """The broker cannot be reached, refused us, or the connection was lost."""


class FleetTimeout(FleetError):
    """No answer in time: from the broker, or from a device to a command."""


@dataclass(frozen=True)
class BrokerOptions:
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None  # TLS with this CA bundle
    prefix: str = DEFAULT_PREFIX
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        try:
            check_name(self.prefix)  # the rule of the agents' mqtt.topic_prefix: one topic level
        except ValueError as exc:
            raise FleetError(f"topic prefix: {exc}") from None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class BrokerConnection:
    """One MQTT 5 connection to the fleet's broker (module docstring). Use as a context manager."""

    def __init__(self, options: BrokerOptions | None = None) -> None:
        self.options = options or BrokerOptions()
        self._prefix = self.options.prefix
        self._cond = threading.Condition()
        self._client: mqtt.Client | None = None
        self._connack: ReasonCode | None = None
        self._lost: str | None = None
        self._subacks: dict[int, list[ReasonCode]] = {}
        self._pubacks: dict[int, ReasonCode | None] = {}
        self._watched: set[str] = set()
        # Latest retained payloads (bytes, parsed on demand), and replies by correlation data.
        self._reported: dict[str, bytes] = {}
        self._status: dict[str, bytes] = {}
        self._desired: dict[str, bytes] = {}  # layer -> payload
        self._replies: dict[bytes, bytes] = {}
        self._changed: set[str] = set()  # devices whose reported state or status changed (waves)
        self._last_message = time.monotonic()
        # Parsed records, reused while the payloads are the same objects (only the caller's thread).
        self._records: dict[str, tuple[bytes | None, bytes | None, DeviceRecord]] = {}
        self._generations: dict[str, tuple[bytes, int | None]] = {}
        self._onlines: dict[str, tuple[bytes | None, bool | None]] = {}

    # -- connection ---------------------------------------------------------------------------

    def connect(self: _Connection) -> _Connection:
        opts = self.options
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"edge-agent-fleet-{uuid.uuid4().hex[:12]}",
            protocol=mqtt.MQTTv5,
        )
        client.connect_timeout = opts.connect_timeout_s
        if opts.username is not None:
            client.username_pw_set(opts.username, opts.password)
        if opts.ca_file is not None:
            try:
                client.tls_set(ca_certs=str(opts.ca_file))
            except (OSError, ValueError) as exc:
                raise FleetError(f"cannot load the CA file {opts.ca_file}: {exc}") from None
        client.on_socket_open = _no_delay
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        try:
            client.connect(opts.host, opts.port, keepalive=30, clean_start=True)
        except OSError as exc:  # refused, unreachable, unresolvable, TLS handshake, timeout
            raise BrokerError(
                f"cannot connect to the MQTT broker {opts.address}: {exc.strerror or exc}",
                hint="check --broker (or EDGE_AGENT_FLEET_BROKER) and that the broker is running",
            ) from None
        self._client = client
        client.loop_start()
        deadline = time.monotonic() + opts.connect_timeout_s
        with self._cond:
            while self._connack is None and self._lost is None:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
        if self._connack is None or self._connack.is_failure:
            reason = self._connack or self._lost or f"no CONNACK within {opts.connect_timeout_s:g} s"
            self.close()
            raise BrokerError(
                f"the MQTT broker {opts.address} refused the connection: {reason}",
                hint="check --username/--password-file (and the broker's ACLs)",
            )
        return self

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def __enter__(self: _Connection) -> _Connection:
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def _mqtt(self) -> mqtt.Client:
        if self._client is None:
            raise FleetError("the fleet client is not connected (use it in a `with` block)")
        return self._client

    # -- paho callbacks (paho's network thread) -----------------------------------------------

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self._connack = reason
            self._cond.notify_all()

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self._lost = str(reason)
            self._cond.notify_all()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._cond:
            self._subacks[mid] = list(codes)
            self._cond.notify_all()

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        with self._cond:
            self._pubacks[mid] = reason if isinstance(reason, ReasonCode) else None
            self._cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        parts = message.topic.split("/")
        payload = bytes(message.payload)  # the same object when paho gives bytes
        with self._cond:
            self._last_message = time.monotonic()
            if len(parts) == 3 and parts[0] == self._prefix:
                store = {"reported": self._reported, "status": self._status}.get(parts[2])
                if store is not None:
                    _keep(store, parts[1], payload)
                    self._changed.add(parts[1])
                elif parts[2] == "desired":
                    _keep(self._desired, device_layer(parts[1]), payload)
            elif len(parts) == 4 and parts[1] == GROUPS_LEVEL and parts[3] == "desired":
                _keep(self._desired, group_layer(parts[2]), payload)
            elif message.topic.endswith(REPLY_SUFFIX):
                correlation = getattr(message.properties, "CorrelationData", None)
                if correlation is not None:
                    self._replies[bytes(correlation)] = payload
                    self._cond.notify_all()

    # -- subscriptions and publishing ---------------------------------------------------------

    def _wait(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Wait (holding nothing) until `done()` under the lock; BrokerError if the connection is
        lost, FleetTimeout naming `what` at the deadline."""
        with self._cond:
            while not done():
                if self._lost is not None:
                    raise BrokerError(
                        f"lost the connection to the MQTT broker {self.options.address}: {self._lost}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FleetTimeout(f"{what}: no answer from the broker {self.options.address}")
                self._cond.wait(min(remaining, POLL_S))

    def _subscribe(self, filters: Sequence[str], qos: int, deadline: float, retained: bool = True) -> None:
        options = SubscribeOptions(qos=qos, retainHandling=0 if retained else 2)
        result, mid = self._mqtt.subscribe([(f, options) for f in filters])
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise BrokerError(f"could not subscribe to {', '.join(filters)}: {mqtt.error_string(result)}")
        self._wait(lambda: mid in self._subacks, deadline, f"subscribing to {', '.join(filters)}")
        with self._cond:
            codes = self._subacks.pop(mid)
        refused = [f"{f} ({c})" for f, c in zip(filters, codes, strict=False) if c.is_failure]
        if refused:
            raise BrokerError(
                f"the broker refused the subscription to {', '.join(refused)}",
                hint="the broker's ACLs must let the controller read the fleet's topics",
            )

    def _watch(self, filters: Iterable[str], deadline: float) -> None:
        """Subscribe (QoS 0) to the filters not yet watched and wait until the broker has sent
        every retained message for them (the barrier in the module docstring)."""
        new = [f for f in dict.fromkeys(filters) if f not in self._watched]
        if not new:
            return
        self._subscribe(new, 0, deadline)
        self._subscribe(new[:1], 0, deadline, retained=False)  # the barrier
        self._watched.update(new)

    def _settle(self, settle_s: float, deadline: float) -> None:
        """Wait until no message came for `settle_s`, for at most 10 x settle_s (later messages are
        live updates, not the snapshot) or the deadline."""
        until = min(deadline, time.monotonic() + 10 * settle_s)
        with self._cond:
            while True:
                now = time.monotonic()
                quiet_at = self._last_message + settle_s
                if now >= quiet_at or now >= until:
                    return
                self._cond.wait(min(quiet_at, until) - now)

    def _publish(
        self, topic: str, payload: bytes, deadline: float, retain: bool, properties: Properties | None = None
    ) -> None:
        """Publish at QoS 1 and wait for the PUBACK; BrokerError when the broker refuses it."""
        info = self._mqtt.publish(topic, payload, qos=1, retain=retain, properties=properties)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise BrokerError(f"could not publish on {topic}: {mqtt.error_string(info.rc)}")
        self._wait(lambda: info.mid in self._pubacks, deadline, f"publishing on {topic}")
        with self._cond:
            reason = self._pubacks.pop(info.mid)
        if reason is not None and reason.is_failure:
            raise BrokerError(
                f"the broker refused the message on {topic}: {reason}",
                hint="the broker's ACLs must let the controller publish there",
            )

    # -- records ------------------------------------------------------------------------------

    def _snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
        with self._cond:
            return dict(self._reported), dict(self._status), dict(self._desired)

    def _record(self, device: str, reported: bytes | None, status: bytes | None) -> DeviceRecord:
        cached = self._records.get(device)
        if cached is not None and cached[0] is reported and cached[1] is status:
            return cached[2]
        record = parse_device(device, reported, self._online(device, status))
        self._records[device] = (reported, status, record)
        return record

    def _online(self, device: str, status: bytes | None) -> bool | None:
        """parse_status, once per status payload (reported states change far more often)."""
        cached = self._onlines.get(device)
        if cached is None or cached[0] is not status:
            cached = (status, parse_status(status))
            self._onlines[device] = cached
        return cached[1]

    def _desired_generation(self, layer: str, payload: bytes) -> int | None:
        cached = self._generations.get(layer)
        if cached is None or cached[0] is not payload:
            try:
                generation: int | None = read_document(payload, layer)["generation"]
            except ValueError:
                generation = None
            cached = (payload, generation)
            self._generations[layer] = cached
        return cached[1]


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Send small packets at once: paho leaves Nagle's algorithm on, which holds a request or a
    SUBSCRIBE until the previous packet's ACK (up to 40 ms each on Linux)."""
    with contextlib.suppress(OSError, AttributeError):  # a TLS or websocket wrapper may refuse
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _keep(store: dict[str, bytes], key: str, payload: bytes) -> None:
    if payload:
        store[key] = payload
    else:  # an empty retained message deletes the retained one
        store.pop(key, None)
