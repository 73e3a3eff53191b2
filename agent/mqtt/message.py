"""An incoming MQTT message as handlers get it, and what a subscription's filter may be: shared by the
connection (which receives), the router (which dispatches) and every module that handles messages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Handler = Callable[[str, bytes], None]


@dataclass(frozen=True)
class Message:
    """An incoming message with what MQTT 5 says about it (None/empty under MQTT 3.1.1)."""

    topic: str
    payload: bytes
    retain: bool = False
    response_topic: str | None = None  # request/response: where the requester waits for the answer
    correlation_data: bytes | None = None  # ... and what it matches the answer by
    user_properties: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    expiry_s: int | None = None  # what is left of its message expiry interval


MessageHandler = Callable[[Message], None]


def check_topic_filter(topic_filter: str) -> None:
    """ValueError unless `topic_filter` is a valid MQTT filter ('+' a whole level, '#' a whole last level)."""
    if not isinstance(topic_filter, str) or not topic_filter or "\x00" in topic_filter:
        raise ValueError(f"invalid MQTT topic filter {topic_filter!r}")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if ("+" in level and level != "+") or ("#" in level and (level != "#" or i != len(levels) - 1)):
            raise ValueError(f"invalid MQTT topic filter {topic_filter!r}: bad wildcard in level {level!r}")
