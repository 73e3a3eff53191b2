"""MQTT: topic scheme, durable outbox and the broker connection (presence, publisher, subscriptions).

Results leave the box only through the `Outbox` (SQLite); `MqttConnection` publishes it with QoS 1
and deletes a row on its PUBACK, so nothing is lost while the broker is away.
"""

from agent.mqtt.connection import MqttConnection
from agent.mqtt.message import Handler
from agent.mqtt.outbox import Outbox, OutboxMessage
from agent.mqtt.topics import (
    command_topic,
    desired_topic,
    events_topic,
    group_desired_topic,
    parse_results_topic,
    reported_topic,
    results_topic,
    status_topic,
    telemetry_topic,
)

__all__ = [
    "Handler",
    "MqttConnection",
    "Outbox",
    "OutboxMessage",
    "command_topic",
    "desired_topic",
    "events_topic",
    "group_desired_topic",
    "parse_results_topic",
    "reported_topic",
    "results_topic",
    "status_topic",
    "telemetry_topic",
]
