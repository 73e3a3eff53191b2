"""The agent's MQTT subscriptions in one place: topic filter -> handler, with request/response.

Handlers get the whole Message (payload, retain, MQTT 5 properties: response topic, correlation data,
user properties, expiry) and run on the connection's dispatcher thread, never paho's network thread.
A handler that raises is contained: logged with its filter, counted in `stats()`, the other handlers
and the daemon go on. `reply()` answers a request where its requester waits: the request's MQTT 5
response topic with its correlation data; under MQTT 3.1.1, which has neither, `<request topic>/reply`
(documented for controllers that speak 3.1.1).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from agent.mqtt.connection import MqttConnection
from agent.mqtt.message import Message, MessageHandler, check_topic_filter

log = logging.getLogger(__name__)

REPLY_SUFFIX = "/reply"  # MQTT 3.1.1 requests: the answer goes to the request's topic + this


class Router:
    def __init__(self, connection: MqttConnection) -> None:
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
