"""The topic scheme: pure build/parse functions."""

from __future__ import annotations

import pytest

from agent.mqtt.topics import (
    command_topic,
    desired_topic,
    group_desired_topic,
    parse_results_topic,
    reported_topic,
    results_topic,
    status_topic,
    telemetry_topic,
)


def test_topics_follow_the_scheme() -> None:
    assert status_topic("edge", "cam-01") == "edge/cam-01/status"
    assert results_topic("edge", "cam-01", "people") == "edge/cam-01/results/people"
    assert telemetry_topic("edge", "cam-01") == "edge/cam-01/telemetry"
    assert reported_topic("edge", "cam-01") == "edge/cam-01/reported"
    assert desired_topic("edge", "cam-01") == "edge/cam-01/desired"
    assert group_desired_topic("edge", "lobby") == "edge/groups/lobby/desired"
    assert command_topic("fleet1", "cam-01", "reboot") == "fleet1/cam-01/cmd/reboot"


def test_parse_results_topic_round_trips() -> None:
    topic = results_topic("edge", "box.7", "door_v2")
    assert parse_results_topic(topic) == ("edge", "box.7", "door_v2")


@pytest.mark.parametrize(
    "topic",
    [
        "edge/cam-01/status",
        "edge/cam-01/results",
        "edge/cam-01/results/a/b",
        "edge/cam-01/telemetry/people",
        "edge//results/people",
        "edge/cam-01/results/",
        "edge/+/results/people",
        "edge/cam-01/results/#",
        "/cam-01/results/people",
        "",
    ],
)
def test_parse_results_topic_rejects_anything_else(topic: str) -> None:
    with pytest.raises(ValueError):
        parse_results_topic(topic)


@pytest.mark.parametrize(
    ("build", "args", "part"),
    [
        (status_topic, ("edge", "a/b"), "device"),
        (status_topic, ("ed+ge", "cam"), "prefix"),
        (results_topic, ("edge", "cam", "#"), "pipeline"),
        (results_topic, ("edge", "cam", ""), "pipeline"),
        (telemetry_topic, ("", "cam"), "prefix"),
        (reported_topic, ("edge", "c+m"), "device"),
        (desired_topic, ("edge", ""), "device"),
        (group_desired_topic, ("edge", "lob/by"), "group"),
        (command_topic, ("edge", "cam", "re#boot"), "command name"),
    ],
)
def test_bad_levels_are_rejected_naming_the_part(build: object, args: tuple[str, ...], part: str) -> None:
    assert callable(build)
    with pytest.raises(ValueError, match=part):
        build(*args)


def test_device_named_groups_would_collide_with_group_topics() -> None:
    # edge/groups/cmd/desired would match the group filter edge/groups/+/desired.
    with pytest.raises(ValueError, match="reserved"):
        command_topic("edge", "groups", "desired")
    assert group_desired_topic("edge", "cmd") == "edge/groups/cmd/desired"
