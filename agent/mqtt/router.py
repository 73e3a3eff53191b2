"""The agent's MQTT subscriptions in one place: the subscription table and its dispatcher (owned by
the connection), and the `Router` the daemon's modules subscribe through, with request/response.

- `SubscriptionTable`: topic filter -> handlers. Handlers run on one dispatcher thread, never on
  paho's network thread, and one handler's exception is logged and contained. With MQTT 5,
  subscription identifiers route each incoming copy to the handlers it was sent for (overlapping
  filters do not double-call a handler). Each subscription's state is tracked from the broker's
  SUBACK: "pending" until it is acknowledged on the current connection, then "active", or
  "refused: <reason>" (logged) when the broker will not have it (an ACL, a filter it does not
  support). A message published before the SUBACK may not reach the handler: wait for "active".
  Every subscription is made again on each CONNACK (the broker may have forgotten them).
- `Router`: handlers get the whole Message (payload, retain, MQTT 5 properties: response topic,
  correlation data, user properties, expiry). A handler that raises is contained: logged with its
  filter, counted in `stats()`, the other handlers and the daemon go on. `reply()` answers a request
  where its requester waits: the request's MQTT 5 response topic with its correlation data; under
  MQTT 3.1.1, which has neither, `<request topic>/reply` (documented for controllers that speak 3.1.1).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.mqtt.message import Handler, Message, MessageHandler, check_topic_filter

log = logging.getLogger(__name__)

_INBOX_SIZE = 1000  # incoming messages waiting for handlers; beyond it they are dropped and logged

# the message, MQTT 5 subscription identifiers of the copy (None: match by filter)
_Incoming = tuple[Message, frozenset[int] | None]


@dataclass(frozen=True)
class _Subscription:
    key: int
    topic_filter: str
    handler: Handler | MessageHandler
    qos: int
    whole: bool = False  # the handler takes the Message (with its properties), not (topic, payload)


class SubscriptionTable:
    """The connection's subscriptions and the thread that runs their handlers (module docstring).

    `connected()` says whether the link is up; `on_error(why)` records a refused subscription as
    the connection's last error."""

    def __init__(
        self,
        client: mqtt.Client,
        protocol: str,
        broker: str,
        connected: Callable[[], bool],
        on_error: Callable[[str], None],
    ) -> None:
        self._client = client
        self._protocol = protocol
        self._broker = broker
        self._connected = connected
        self._on_error = on_error
        self._lock = threading.Lock()
        self._subscriptions: dict[int, _Subscription] = {}
        self._filter_ids: dict[str, int] = {}  # filter -> MQTT 5 subscription identifier (stable)
        self._filter_state: dict[str, str] = {}  # filter -> "pending" | "active" | "refused: ..."
        self._suback_wanted: dict[int, str] = {}  # SUBSCRIBE message id -> filter, until its SUBACK
        self._suback_early: dict[int, ReasonCode] = {}  # SUBACKs that beat their mid's bookkeeping
        self._next_key = 0
        self._inbox: queue.Queue[_Incoming | None] = queue.Queue(maxsize=_INBOX_SIZE)
        self.handling_since: float | None = None  # a handler's start, for the watchdog
        self._thread = threading.Thread(target=self._dispatcher_main, name="mqtt-handlers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._inbox_put(None)
        self._thread.join(timeout=5.0)

    def states(self) -> dict[str, str]:
        with self._lock:
            return dict(self._filter_state)

    def add(
        self, topic_filter: str, handler: Handler | MessageHandler, qos: int, whole: bool
    ) -> Callable[[], None]:
        """Subscribe (now when connected, else at the next CONNACK); returns the unsubscribe function."""
        check_topic_filter(topic_filter)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        with self._lock:
            self._next_key += 1
            key = self._next_key
            self._subscriptions[key] = _Subscription(key, topic_filter, handler, qos, whole)
            sub_id = self._filter_ids.setdefault(topic_filter, len(self._filter_ids) + 1)
            self._filter_state.setdefault(topic_filter, "pending")
        # Registered before asking: a CONNACK in between either finds it in its snapshot
        # (resubscribe) or came before this question, which then says connected.
        if self._connected():
            self._subscribe_one(topic_filter, qos, sub_id)

        def unsubscribe() -> None:
            with self._lock:
                if self._subscriptions.pop(key, None) is None:
                    return
                still_used = any(s.topic_filter == topic_filter for s in self._subscriptions.values())
                if not still_used:
                    self._filter_state.pop(topic_filter, None)
            if not still_used and self._connected():
                self._client.unsubscribe(topic_filter)

        return unsubscribe

    def resubscribe(self) -> None:
        """A new link (CONNACK): every filter again."""
        with self._lock:
            wanted: dict[str, int] = {}
            for sub in self._subscriptions.values():
                wanted[sub.topic_filter] = max(sub.qos, wanted.get(sub.topic_filter, 0))
            ids = dict(self._filter_ids)
        for topic_filter, qos in wanted.items():
            self._subscribe_one(topic_filter, qos, ids[topic_filter])

    def link_down(self) -> None:
        """SUBACKs of the old connection will not come; the next CONNACK subscribes again."""
        with self._lock:
            self._suback_wanted.clear()
            self._suback_early.clear()
            for topic_filter in self._filter_state:
                self._filter_state[topic_filter] = "pending"

    def suback(self, mid: int, reason: ReasonCode) -> None:
        """paho's SUBACK (its network thread)."""
        with self._lock:
            topic_filter = self._suback_wanted.pop(mid, None)
            if topic_filter is None:
                self._suback_early[mid] = reason
        if topic_filter is not None:
            self._settle(topic_filter, reason)

    def received(self, message: mqtt.MQTTMessage) -> None:
        """paho's incoming message (its network thread): queued for the dispatcher."""
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

    def _subscribe_one(self, topic_filter: str, qos: int, sub_id: int) -> None:
        properties: Properties | None = None
        if self._protocol == "5":
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
        # across paho's subscribe()); whichever side comes second settles it.
        with self._lock:
            early = self._suback_early.pop(mid, None)
            if early is None:
                self._suback_wanted[mid] = topic_filter
        if early is not None:
            self._settle(topic_filter, early)

    def _settle(self, topic_filter: str, reason: ReasonCode) -> None:
        why = ""
        if reason.is_failure:
            why = f"broker {self._broker} refused the subscription to {topic_filter}: {reason}"
            log.error("%s (%#x); its messages will not arrive", why, reason.value)
            state = f"refused: {reason}"
        else:
            state = "active"
        with self._lock:
            if topic_filter in self._filter_state:  # not unsubscribed meanwhile
                self._filter_state[topic_filter] = state
        if why:
            self._on_error(why)

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
                self.handling_since = time.monotonic()
                try:
                    if sub.whole:
                        cast(MessageHandler, sub.handler)(message)
                    else:
                        cast(Handler, sub.handler)(topic, message.payload)
                except Exception:
                    log.exception("MQTT handler for %s failed on a message on %s", sub.topic_filter, topic)
                finally:
                    self.handling_since = None


REPLY_SUFFIX = "/reply"  # MQTT 3.1.1 requests: the answer goes to the request's topic + this


class _Link(Protocol):
    """What the router needs of the connection (agent/mqtt/connection.py MqttConnection)."""

    def subscribe_messages(
        self, topic_filter: str, handler: MessageHandler, qos: int = 1
    ) -> Callable[[], None]: ...

    def publish_reply(
        self,
        topic: str,
        payload: bytes,
        correlation_data: bytes | None = None,
        content_type: str | None = None,
    ) -> bool: ...


class Router:
    """The daemon's subscriptions by name: each handler contained and counted, and `reply()`."""

    def __init__(self, connection: _Link) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}  # filter -> messages, failures

    def route(self, topic_filter: str, handler: MessageHandler, qos: int = 1) -> Callable[[], None]:
        """Send messages matching `topic_filter` to `handler`; returns the function that stops it."""
        check_topic_filter(topic_filter)
        with self._lock:
            self._counts.setdefault(topic_filter, {"messages": 0, "failures": 0})

        def contained(message: Message) -> None:
            with self._lock:
                self._counts[topic_filter]["messages"] += 1
            try:
                handler(message)
            except Exception:
                with self._lock:
                    self._counts[topic_filter]["failures"] += 1
                log.exception("MQTT handler for %s failed on a message on %s", topic_filter, message.topic)

        return self._connection.subscribe_messages(topic_filter, contained, qos)

    def reply(self, request: Message, answer: bytes | dict[str, Any]) -> bool:
        """Answer `request` (a dict goes as JSON); False when there is no link to send it on."""
        payload = answer if isinstance(answer, bytes) else json.dumps(answer, separators=(",", ":")).encode()
        topic = request.response_topic or request.topic + REPLY_SUFFIX
        content_type = None if isinstance(answer, bytes) else "application/json"
        sent = self._connection.publish_reply(topic, payload, request.correlation_data, content_type)
        if not sent:
            log.warning("could not answer %s on %s: no link to the broker", request.topic, topic)
        return sent

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {f: dict(c) for f, c in self._counts.items()}
