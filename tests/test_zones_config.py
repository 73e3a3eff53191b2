"""Zones and lines in a pipeline's config (agent/config/analytics.py): what `edge-agent config
validate` says about a bad one, at its line and key, and that the exported JSON Schema refuses
what it can state of the same (the rest is listed, with why, in BEYOND_A_SCHEMA)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent.config import LineConfig, PipelineConfig, ZoneConfig, polygon_problem
from agent.config_loader import config_data, parse_config
from tests.config_cases import assert_both_accept, schema_problems, validate_cli

HEAD = """\
device: {id: box-1}
pipelines:
  - name: cam
    model: {path: /opt/m.onnx}
    source: {type: video, uri: /srv/v.mp4}
"""  # the pipeline's keys follow from line 6 on
DETECTION = "    postprocess: {type: detection, labels: [person, car, truck]}\n"


def config(body: str, postprocess: str = DETECTION) -> str:
    return HEAD + postprocess + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"


# name: (pipeline keys after `postprocess`, postprocess line, ["line: key: message", ...])
BAD: dict[str, tuple[str, str, list[str]]] = {
    "self_crossing_polygon": (
        """
        zones:
          - name: bowtie
            points: [[0, 0], [1, 1], [1, 0], [0, 1]]
        """,
        DETECTION,
        [
            "9: pipelines[0].zones[0].points: edge 0-1 meets edge 2-3: a zone's edges must not cross or "
            "touch (list the corners in order around the zone)"
        ],
    ),
    "repeated_corner": (
        """
        zones:
          - name: pinched
            points:
              - [0, 0]
              - [0.8, 0]
              - [0.4, 0.5]
              - [0.8, 1]
              - [0, 1]
              - [0.4, 0.5]
        """,
        DETECTION,
        ["9: pipelines[0].zones[0].points: point 5 (0.4, 0.5) repeats point 2"],
    ),
    "corner_on_another_edge": (
        """
        zones:
          - name: pinched
            units: pixels
            points: [[0, 0], [400, 0], [400, 400], [200, 0], [0, 400]]
        """,
        DETECTION,
        [
            "10: pipelines[0].zones[0].points: edge 0-1 meets edge 2-3: a zone's edges must not cross or "
            "touch (list the corners in order around the zone)"
        ],
    ),
    "fraction_point_outside_the_frame": (
        """
        zones:
          - name: dock
            points: [[0.1, 0.1], [1.5, 0.1], [0.9, 0.9]]
        """,
        DETECTION,
        [
            "9: pipelines[0].zones[0].points: point 1 (1.5, 0.1) is outside the frame: with units: "
            "fraction (the default) coordinates are 0..1 of the frame's width and height; write units: "
            "pixels for pixels"
        ],
    ),
    "points_on_one_line": (
        """
        zones:
          - name: flat
            points: [[0, 0], [0.5, 0.5], [1, 1]]
        """,
        DETECTION,
        ["9: pipelines[0].zones[0].points: the points lie on one line: the zone has no area"],
    ),
    "two_points_zone": (
        """
        zones:
          - name: thin
            points: [[0, 0], [0.5, 0.5]]
        """,
        DETECTION,
        [
            "9: pipelines[0].zones[0].points: List should have at least 3 items after validation, not 2 "
            "(got [[0, 0], [0.5, 0.5]])"
        ],
    ),
    "duplicate_zone_names": (
        """
        zones:
          - name: dock
            points: [[0, 0], [1, 0], [1, 1]]
          - name: dock
            points: [[0, 0], [0, 1], [1, 1]]
        """,
        DETECTION,
        [
            "10: pipelines[0].zones[1].name: 'dock' is already the name of zones[0]: zones and lines need "
            "names of their own"
        ],
    ),
    "a_line_named_like_a_zone": (
        """
        zones:
          - {name: gate, points: [[0, 0], [1, 0], [1, 1]]}
        lines:
          - {name: gate, points: [[0, 0.5], [1, 0.5]]}
        """,
        DETECTION,
        [
            "10: pipelines[0].lines[0].name: 'gate' is already the name of zones[0]: zones and lines need "
            "names of their own"
        ],
    ),
    "zero_length_line": (
        """
        lines:
          - name: gate
            units: pixels
            points: [[320, 200], [320, 200]]
        """,
        DETECTION,
        ["10: pipelines[0].lines[0].points: both ends are (320, 200): a line needs two different points"],
    ),
    "same_name_both_ways": (
        """
        lines:
          - name: gate
            points: [[0, 0.5], [1, 0.5]]
            in: north
            out: north
        """,
        DETECTION,
        [
            "11: pipelines[0].lines[0].out: in and out are both 'north': the two directions need different "
            "names"
        ],
    ),
    "misspelt_in": (
        """
        lines:
          - name: gate
            points: [[0, 0.5], [1, 0.5]]
            inn: north
        """,
        DETECTION,
        [
            "10: pipelines[0].lines[0].inn: unknown key; did you mean 'in'? (allowed here: anchor, "
            "attributes, in, labels, name, out, points, units)"
        ],
    ),
    "unknown_label": (
        """
        zones:
          - name: dock
            points: [[0, 0], [1, 0], [1, 1]]
            labels:
              - car
              - persn
        lines:
          - {name: gate, points: [[0, 0.5], [1, 0.5]], labels: [bus]}
        """,
        DETECTION,
        [
            "12: pipelines[0].zones[0].labels[1]: 'persn' is not one of postprocess.labels (person, car, "
            "truck); did you mean 'person'?",
            "14: pipelines[0].lines[0].labels[0]: 'bus' is not one of postprocess.labels (person, car, "
            "truck)",
        ],
    ),
    "labels_on_regions": (
        """
        zones:
          - name: dock
            points: [[0, 0], [1, 0], [1, 1]]
            labels: [text]
        """,
        "    postprocess: {type: regions}\n",
        ["10: pipelines[0].zones[0].labels: a regions postprocess gives no labels to filter on"],
    ),
    "zones_without_boxes": (
        """
        lines:
          - {name: gate, points: [[0, 0.5], [1, 0.5]]}
        """,
        "    postprocess: {type: classification}\n",
        [
            "7: pipelines[0].lines: zones and lines need boxes: use a detection or regions postprocess, "
            "not classification"
        ],
    ),
    "box_anchor_on_a_line": (
        """
        lines:
          - {name: gate, points: [[0, 0.5], [1, 0.5]], anchor: box}
        """,
        DETECTION,
        [
            "8: pipelines[0].lines[0].anchor: Input should be 'bottom_center' or 'center' (got 'box')",
        ],
    ),
}

# What the validator refuses that no JSON Schema can state (the rest the schema refuses too).
BEYOND_A_SCHEMA = {
    "self_crossing_polygon": "whether a polygon's edges cross is geometry",
    "corner_on_another_edge": "whether a polygon's edges cross is geometry",
    "points_on_one_line": "a polygon's area is geometry",
    "duplicate_zone_names": "names unique across the list's items",
    "a_line_named_like_a_zone": "names unique across two lists",
    "same_name_both_ways": "one value differing from another",
    "unknown_label": "a value from a list elsewhere in the document",
    "labels_on_regions": "a key depending on another section's type",
    "zones_without_boxes": "a key depending on another section's type",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_zone_or_line_is_reported_at_its_line_and_key(tmp_path: Path, case: str) -> None:
    body, postprocess, expected = BAD[case]
    code, problems = validate_cli(tmp_path, config(body, postprocess))
    assert code == 1
    assert problems == expected


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_schema_refuses_the_bad_zones_it_can_state(case: str) -> None:
    body, postprocess, _ = BAD[case]
    problems = schema_problems(config_data(config(body, postprocess), case, environ={}))
    if case in BEYOND_A_SCHEMA:
        assert problems == [], f"{case} is refused by the schema now: take it off BEYOND_A_SCHEMA"
    else:
        assert problems, f"the schema accepts {case}, which config validate refuses"


GOOD = """
zones:
  - name: yard                          # concave (a U), in fractions
    points: [[0, 0], [0.3, 0], [0.3, 0.3], [0.2, 0.3], [0.2, 0.1], [0.1, 0.1], [0.1, 0.3], [0, 0.3]]
    labels: [person]
    anchor: box
    min_frames: 3
    min_seconds: 1.5
    dwell_s: 60
    max_objects: 4
  - name: dock                          # pixels: beyond 1, unchecked against a frame here
    units: pixels
    points: [[100, 100], [1800, 100], [1800, 1000]]
lines:
  - name: gate
    points: [[0, 0.5], [1, 0.5]]
    in: north
    out: south
    anchor: center
  - {name: door, units: pixels, points: [[640, 0], [640, 720]], labels: [car, truck]}
"""


def test_good_zones_and_lines_pass_the_validator_and_the_schema(tmp_path: Path) -> None:
    text = config(GOOD)
    assert validate_cli(tmp_path, text) == (0, [])
    assert_both_accept(text, "GOOD")
    pipeline = parse_config(text, environ={}).pipelines[0]
    yard, dock = pipeline.zones
    assert (yard.units, yard.anchor, yard.min_frames, yard.dwell_s, yard.max_objects) == (
        "fraction",
        "box",
        3,
        60,
        4,
    )
    assert (dock.units, dock.anchor, dock.labels, dock.dwell_s) == ("pixels", "bottom_center", None, None)
    gate, door = pipeline.lines
    assert (gate.in_, gate.out, gate.anchor, door.in_, door.out) == ("north", "south", "center", "in", "out")


def test_a_pipeline_with_zones_and_lines_dumps_and_reads_back_the_same() -> None:
    """The supervisor keeps pipelines as JSON dumps: a line's direction is dumped under `in`, not `in_`."""
    pipeline = parse_config(config(GOOD), environ={}).pipelines[0]
    dump = pipeline.model_dump(mode="json")
    assert dump["lines"][0]["in"] == "north" and "in_" not in dump["lines"][0]
    assert PipelineConfig.model_validate(dump) == pipeline
    line = LineConfig.model_validate({"name": "l", "points": [[0, 0], [1, 1]]})
    assert json.loads(line.model_dump_json()) == {
        "name": "l",
        "units": "fraction",
        "points": [[0.0, 0.0], [1.0, 1.0]],
        "in": "in",
        "out": "out",
        "labels": None,
        "attributes": None,
        "anchor": "bottom_center",
    }


def test_polygon_problem_on_hand_drawn_shapes() -> None:
    square = [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)]
    assert polygon_problem(square) is None
    assert polygon_problem(square[::-1]) is None  # either way round
    u_shape = [(0, 0), (3, 0), (3, 3), (2, 3), (2, 1), (1, 1), (1, 3), (0, 3)]
    assert polygon_problem([(float(x), float(y)) for x, y in u_shape]) is None
    # A corner touching a non-neighbouring edge (not crossing it) is refused too.
    touching = [(0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (2.0, 0.0), (0.0, 4.0)]
    assert polygon_problem(touching) == (
        "edge 0-1 meets edge 2-3: a zone's edges must not cross or touch (list the corners in order around "
        "the zone)"
    )
    assert ZoneConfig.model_validate({"name": "z", "points": square}).anchor == "bottom_center"
