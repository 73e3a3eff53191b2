"""`edge-agent watch`: what a box publishes, live, read off its broker with the config's `mqtt:`
settings (login, TLS: agent/mqtt/client.py) on the topics of agent/mqtt/topics.py: its results and
tracking events (all pipelines or one), its retained status and, when the config turns them on, its
state topics; or its tracking events alone.

`Watch` connects (a clean session: a viewer leaves nothing queued at the broker), subscribes, and
hands each message to the caller as a `Seen` (topic, kind, pipeline, the payload parsed) on the
caller's own thread, until a number of messages or seconds; Ctrl-C reaches the caller as usual. A
broker it cannot reach or that refuses the login is an EdgeAgentError saying which and what to check.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt

from agent.clock import iso_utc
from agent.config import AgentConfig
from agent.errors import EdgeAgentError
from agent.mqtt.client import connect_failure, make_client
from agent.mqtt.topics import events_topic, results_topic, state_topic, status_topic

CONNACK_TIMEOUT_S = 10.0  # the TCP connect itself is bounded by paho's connect_timeout (5 s)
_POLL_S = 0.2  # how often the caller's thread looks at the clock while no message comes


@dataclass(frozen=True)
class Seen:
    """One message the box published."""

    topic: str
    kind: str  # "result" | "event" (a result whose output has an event) | "status" | "state"
    pipeline: str | None  # results and state: the pipeline ("_device": the box's own state)
    retained: bool  # a retained message the broker held (status, state), not a live one
    received_at: float  # time.time()
    payload: Any  # JSON parsed; else text; None for binary (a state image)
    size: int  # bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "kind": self.kind,
            "pipeline": self.pipeline,
            "retained": self.retained,
            "received_at": iso_utc(self.received_at),
            "bytes": self.size,
            "payload": self.payload,
        }


def filters(config: AgentConfig, pipeline: str | None, events_only: bool = False) -> list[str]:
    """The topic filters for this device's results and events (all or `pipeline`'s), status and
    state topics; `events_only`: the tracking events alone."""
    prefix, device = config.mqtt.topic_prefix, config.device.id
    try:
        status = status_topic(prefix, device)
        if pipeline is None:
            base = status.removesuffix("status")
            results, events, state = f"{base}results/+", f"{base}events/+", f"{base}state/#"
        else:
            results, events, state = (
                results_topic(prefix, device, pipeline),
                events_topic(prefix, device, pipeline),
                state_topic(prefix, device, pipeline) + "/#",
            )
    except ValueError as exc:
        raise EdgeAgentError(f"cannot watch: {exc}") from None
    if events_only:
        return [events]
    return [results, events, status, *([state] if config.state_topics_on else [])]


def classify(config: AgentConfig, topic: str, payload: bytes, retained: bool) -> Seen:
    """What a message on one of this device's topics is."""
    base = status_topic(config.mqtt.topic_prefix, config.device.id).removesuffix("status")
    levels = topic.removeprefix(base).split("/")
    parsed = _parse(payload)
    kind, pipeline = "status", None
    if levels[0] == "results" and len(levels) == 2:
        output = parsed.get("output") if isinstance(parsed, dict) else None
        kind = "event" if isinstance(output, dict) and output.get("event") else "result"
        pipeline = levels[1]
    elif levels[0] == "events" and len(levels) == 2:  # a tracking pipeline's (docs/results.md)
        kind, pipeline = "event", levels[1]
    elif levels[0] == "state" and len(levels) >= 2:
        kind, pipeline = "state", levels[1]
    return Seen(topic, kind, pipeline, retained, time.time(), parsed, len(payload))


def _parse(payload: bytes) -> Any:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


class Watch:
    """A connection to the box's broker that collects the box's messages."""

    def __init__(self, config: AgentConfig, pipeline: str | None = None, events_only: bool = False) -> None:
        self.config = config
        self.filters = filters(config, pipeline, events_only)
        self._messages: queue.Queue[Seen] = queue.Queue()
        self._connack: queue.Queue[Any] = queue.Queue()
        self._subscribed: queue.Queue[Any] = queue.Queue()
        self._lost: str | None = None
        cfg = config.mqtt
        self.broker = f"{cfg.host}:{cfg.port}"
        # A clean session whatever mqtt.session_expiry_s says (that is the agent's own session).
        client_id = f"edge-agent-watch-{config.device.id}-{os.getpid()}"
        self._client = make_client(cfg.model_copy(update={"session_expiry_s": 0}), client_id)
        self._client.on_connect = lambda _c, _u, _f, reason, _p: self._connack.put(reason)
        self._client.on_subscribe = lambda _c, _u, _mid, codes, _p: self._subscribed.put(codes)
        self._client.on_message = self._on_message
        self._client.on_disconnect = self._on_disconnect

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        self._messages.put(classify(self.config, message.topic, bytes(message.payload), bool(message.retain)))

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason is not None and getattr(reason, "is_failure", False):
            self._lost = f"the broker {self.broker} closed the connection: {reason}"

    def start(self) -> None:
        """Connect and subscribe; EdgeAgentError when the broker cannot be reached or refuses."""
        cfg = self.config.mqtt
        try:
            self._client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
        except (OSError, ValueError) as exc:
            raise EdgeAgentError(
                connect_failure(exc, cfg),
                hint="check mqtt.host and mqtt.port in the config and that the broker runs "
                "(edge-agent doctor -c CONFIG checks the whole link)",
            ) from None
        self._client.loop_start()
        try:
            reason = self._connack.get(timeout=CONNACK_TIMEOUT_S)
        except queue.Empty:
            self.close()
            raise EdgeAgentError(
                f"no MQTT answer (CONNACK) from {self.broker} within {CONNACK_TIMEOUT_S:g} s",
                hint="check that this is the broker's MQTT port (a TLS port needs mqtt.tls)",
            ) from None
        if reason.is_failure:
            self.close()
            who = repr(cfg.username) if cfg.username else "an anonymous client"
            raise EdgeAgentError(
                f"{self.broker} refused the login of {who}: {reason}",
                hint="check mqtt.username and mqtt.password_file (edge-agent doctor -c CONFIG)",
            )
        self._client.subscribe([(f, 0) for f in self.filters])
        try:
            codes = self._subscribed.get(timeout=CONNACK_TIMEOUT_S)
        except queue.Empty:
            codes = []
        refused = [f for f, code in zip(self.filters, codes, strict=False) if code.is_failure]
        if len(codes) != len(self.filters) or refused:
            self.close()
            raise EdgeAgentError(
                f"{self.broker} did not let this login read {', '.join(refused or self.filters)}",
                hint="the broker's ACL must allow reading them (configs/mosquitto/)",
            )

    def run(self, show: Callable[[Seen], None], seconds: float = 0.0, count: int = 0) -> int:
        """Hand each message to `show` until `count` messages (0: no limit) or `seconds` (0: no
        limit); returns how many. EdgeAgentError when the broker drops the connection."""
        deadline = time.monotonic() + seconds if seconds else None
        shown = 0
        while not count or shown < count:
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if wait <= 0:
                break
            try:
                seen = self._messages.get(timeout=wait)
            except queue.Empty:
                if self._lost is not None:
                    raise EdgeAgentError(self._lost, hint="see the broker's log") from None
                continue
            show(seen)
            shown += 1
        return shown

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
