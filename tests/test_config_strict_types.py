"""One truth for types (issue 34, item 7): `edge-agent config validate` (pydantic, `parse_config`) and
the JSON Schema of `edge-agent config schema` (checked with jsonschema, as an editor checks it) give
the same verdict on each document: numbers written as numbers, true/false as booleans, a point as two
numbers; text where a number or a boolean is meant is refused by both (pydantic alone would read
"0.5" as 0.5 and "yes" as true). `${VAR}` is the one exception, documented in README: its text is
read as the type its key wants (`port: ${PORT}` is the number), which a schema, seeing text, cannot."""

from __future__ import annotations

import textwrap

import pytest

from agent.config_loader import config_data, parse_config
from agent.errors import ConfigError
from tests.config_cases import schema_problems

# A tracking pipeline with a zone and a line, and every kind of scalar: numbers (fps, coordinates,
# dwell_s), whole numbers (port, min_frames), true/false (loop). Each case replaces one line of it.
GOOD = """\
device: {id: box-1}
mqtt: {host: 127.0.0.1, port: 1883, keepalive_s: 30}
pipelines:
  - name: door
    model: {path: /opt/m.onnx}
    source: {type: video, uri: /srv/door.mp4, fps: 5, loop: true}
    postprocess: {type: detection, labels: [person, car]}
    zones:
      - {name: counter, points: [[0.1, 0.5], [0.4, 0.5], [0.4, 0.9]], min_frames: 2, dwell_s: 5}
    lines:
      - {name: door, points: [[0.3, 0], [0.3, 1]]}
"""
ZONE = "      - {name: counter, points: [[0.1, 0.5], [0.4, 0.5], [0.4, 0.9]], min_frames: 2, dwell_s: 5}"
LINE = "      - {name: door, points: [[0.3, 0], [0.3, 1]]}"
SOURCE = "    source: {type: video, uri: /srv/door.mp4, fps: 5, loop: true}"
MQTT = "mqtt: {host: 127.0.0.1, port: 1883, keepalive_s: 30}"

# (the line, what replaces it) per document; True: both accept it, False: both refuse it.
CASES: dict[str, tuple[str, str, bool]] = {
    "as_written": (ZONE, ZONE, True),
    "a_whole_number_where_a_number_is_meant": (SOURCE, SOURCE.replace("fps: 5", "fps: 12"), True),
    "a_fraction_where_a_number_is_meant": (SOURCE, SOURCE.replace("fps: 5", "fps: 2.5"), True),
    "a_whole_float_where_a_whole_number_is_meant": (
        ZONE,
        ZONE.replace("min_frames: 2", "min_frames: 2.0"),
        True,
    ),
    "pixels_as_numbers": (LINE, "      - {name: door, units: pixels, points: [[300, 0], [300, 720]]}", True),
    # text where a number is meant
    "a_coordinate_as_text": (LINE, LINE.replace("[0.3, 0]", '["0.3", 0]'), False),
    "every_coordinate_as_text": (LINE, '      - {name: door, points: [["0.3", "0"], ["0.3", "1"]]}', False),
    "min_frames_as_text": (ZONE, ZONE.replace("min_frames: 2", 'min_frames: "2"'), False),
    "dwell_s_as_text": (ZONE, ZONE.replace("dwell_s: 5", 'dwell_s: "5"'), False),
    "fps_as_text": (SOURCE, SOURCE.replace("fps: 5", 'fps: "5"'), False),
    "port_as_text": (MQTT, MQTT.replace("port: 1883", 'port: "1883"'), False),
    "keepalive_as_words": (MQTT, MQTT.replace("keepalive_s: 30", "keepalive_s: often"), False),
    # true/false where a number is meant (YAML reads yes, no, on, off as true/false)
    "min_frames_as_yes": (ZONE, ZONE.replace("min_frames: 2", "min_frames: yes"), False),
    "a_coordinate_as_true": (LINE, LINE.replace("[0.3, 0]", "[0.3, true]"), False),
    # anything but true/false where a boolean is meant
    "loop_as_text": (SOURCE, SOURCE.replace("loop: true", 'loop: "true"'), False),
    "loop_as_1": (SOURCE, SOURCE.replace("loop: true", "loop: 1"), False),
    "a_backends_threads_as_a_number": (
        MQTT,
        MQTT + "\nbackends: {options: {tflite/cpu: {threads: 2}}}",
        True,
    ),
    "a_backends_threads_as_text": (MQTT, MQTT + '\nbackends: {options: {tflite/cpu: {threads: "2"}}}', False),
    # a point is two numbers
    "a_point_of_three_numbers": (LINE, LINE.replace("[0.3, 1]", "[0.3, 1, 0]"), False),
    "a_flat_list_of_numbers": (
        ZONE,
        ZONE.replace("[[0.1, 0.5], [0.4, 0.5], [0.4, 0.9]]", "[0.1, 0.5, 0.4, 0.5, 0.4, 0.9]"),
        False,
    ),
    "a_point_as_text": (LINE, LINE.replace("[0.3, 0]", '"0.3, 0"'), False),
}


def _document(case: str) -> str:
    line, replacement, _ = CASES[case]
    assert line in GOOD
    return GOOD.replace(line, replacement)


def _verdicts(text: str, environ: dict[str, str] | None = None) -> tuple[bool, bool]:
    """(config validate accepts it, the JSON Schema accepts it)."""
    environ = environ or {}
    try:
        parse_config(text, source="agent.yaml", environ=environ)
        validator = True
    except ConfigError:
        validator = False
    return validator, not schema_problems(config_data(text, "agent.yaml", environ=environ))


@pytest.mark.parametrize("case", CASES)
def test_the_validator_and_the_schema_agree(case: str) -> None:
    accepted = CASES[case][2]
    assert _verdicts(_document(case)) == (accepted, accepted)


def test_a_number_as_text_is_refused_at_its_key_saying_what_is_expected() -> None:
    text = _document("min_frames_as_text").replace(LINE, LINE.replace("[0.3, 0]", '["0.3", 0]'))
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="agent.yaml", environ={})
    assert info.value.problems == [
        'agent.yaml:9: pipelines[0].zones[0].min_frames: expected a whole number, got the text "2": '
        "write it without quotes",
        'agent.yaml:11: pipelines[0].lines[0].points[0][0]: expected a number, got the text "0.3": '
        "write it without quotes",
    ]


def test_var_is_the_one_exception_typed_by_its_key() -> None:
    text = textwrap.dedent(
        """\
        device: {id: box-1}
        mqtt:
          host: 127.0.0.1
          port: ${PORT}
        state_topics:
          enabled: ${STATE_TOPICS:-false}
        """
    )
    config = parse_config(text, source="agent.yaml", environ={"PORT": "8883"})
    assert config.mqtt.port == 8883 and config.state_topics.enabled is False
    # The schema sees the expanded text: the documented exception (README).
    assert _verdicts(text, {"PORT": "8883"}) == (True, False)
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="agent.yaml", environ={"PORT": "eighty"})
    assert info.value.problems == [
        'agent.yaml:4: mqtt.port: expected a whole number, got "eighty" (from ${PORT})'
    ]
