"""Zones and lines that count only objects whose attributes match (`attributes: {text: "^[A-Z]{2}"}` on
a zone or a line: agent/config/analytics.py, agent/processing/scene.py): real Scene objects fed tracked
boxes, the answers put on them as the attributes step does (`Scene.set_attribute`), and what
`edge-agent config validate` says of a bad condition, at its line and key."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from agent.config import LineConfig, TrackConfig, ZoneConfig
from agent.processing.scene import Scene
from tests.config_cases import validate_cli
from tests.test_scene import FPS, H, W, box, flat

# The left half, lower part (pixels), and a vertical gate at x = 600 (`in` is moving east).
LEFT = {"name": "left", "units": "pixels", "points": [(0, 500), (500, 500), (500, 1000), (0, 1000)]}
GATE = {"name": "gate", "units": "pixels", "points": [(600, 0), (600, 1000)]}
PLATE = {"text": "^[A-Z]{2}"}


def read(scene: Scene, track_id: int, text: str, score: float = 0.97) -> None:
    """A recognizer's answer on an object, as agent/steps/attributes.py puts it."""
    value = {"value": text, "score": score, "at": "2026-11-29T06:00:00.000Z", "runs": 1}
    assert scene.set_attribute(track_id, "text", value)


def frames_of(
    scene: Scene, xs: list[float], start: int = 0, bottom: float = 800
) -> list[list[dict[str, Any]]]:
    """Two objects walking side by side east (one at `bottom`, one 300 px higher): each frame's events."""
    out = []
    for i, x in enumerate(xs, start):
        scene.step([box(x, bottom), box(x, bottom - 300)], i / FPS, W, H)
        out.append(scene.take_events())
    return out


def ids_by_height(scene: Scene) -> tuple[int, int]:
    low = max(scene.objects.values(), key=lambda o: o.box[3])
    high = min(scene.objects.values(), key=lambda o: o.box[3])
    return low.id, high.id


def test_a_line_counts_only_the_objects_whose_attribute_matches() -> None:
    scene = Scene(TrackConfig(min_hits=1), [], [LineConfig(**GATE, attributes=PLATE)])
    frames_of(scene, [450, 480])  # both tracked, neither read
    low, high = ids_by_height(scene)
    read(scene, low, "KX42 BRT")  # matches ^[A-Z]{2}
    read(scene, high, "4X42 BRT")  # does not
    events = frames_of(scene, list(range(490, 700, 10)), start=2)
    crossings = [e for frame in events for e in frame if e["type"] == "cross"]
    assert [(c["line"], c["direction"], c["object"]["id"]) for c in crossings] == [("gate", "in", low)]
    # The crossing event's object carries what was read on it.
    assert crossings[0]["object"]["attributes"]["text"]["value"] == "KX42 BRT"
    assert scene.summary()["lines"] == {"gate": {"in": 1, "out": 0}}


def test_an_object_not_read_yet_is_not_counted_and_may_enter_once_it_matches() -> None:
    zone = ZoneConfig(**LEFT, attributes=PLATE)
    scene = Scene(TrackConfig(min_hits=1), [zone], [])
    before = [[box(100 + 10 * i, 800)] for i in range(5)]
    events = [scene.step(b, i / FPS, W, H) or scene.take_events() for i, b in enumerate(before)]
    assert [k for k in flat(events) if k[0] == "enter"] == []  # inside, but nothing read: not counted
    assert scene.summary()["zones"]["left"]["count"] == 0
    (track_id,) = scene.objects
    read(scene, track_id, "AB 123")
    assert [k[0] for k in flat([scene.take_events()])] == ["update"]  # changed ["attributes"]
    scene.step([box(160, 800)], 5 / FPS, W, H)  # the next frame
    enter = [e for e in scene.take_events() if e["type"] == "enter"]
    assert [(e["zone"], e["object"]["id"]) for e in enter] == [("left", track_id)]
    assert enter[0]["object"]["attributes"]["text"]["value"] == "AB 123"
    assert scene.summary()["zones"]["left"]["count"] == 1


def test_a_zone_lets_an_object_out_when_a_new_reading_no_longer_matches() -> None:
    scene = Scene(TrackConfig(min_hits=1), [ZoneConfig(**LEFT, min_frames=3, attributes=PLATE)], [])
    scene.step([box(100, 800)], 0.0, W, H)
    (track_id,) = scene.objects
    read(scene, track_id, "AB 123")
    for i in range(1, 4):
        scene.step([box(100 + i, 800)], i / FPS, W, H)
    assert scene.summary()["zones"]["left"]["count"] == 1
    scene.take_events()
    read(scene, track_id, "8B 123")  # read again, better: not a plate that counts here
    scene.step([box(105, 800)], 0.5, W, H)
    exits = [e for e in scene.take_events() if e["type"] == "exit"]
    # Like a label filter: out at once, not after min_frames (the object did not move).
    assert [(e["zone"], e["reason"]) for e in exits] == [("left", "left")]
    assert scene.summary()["zones"]["left"]["count"] == 0


def test_every_named_attribute_must_match_and_values_that_are_not_text_match_as_json() -> None:
    both = {"text": "^[A-Z]{2}", "direction": "^0$"}
    scene = Scene(TrackConfig(min_hits=1), [ZoneConfig(**LEFT, attributes=both)], [])
    scene.step([box(100, 800)], 0.0, W, H)
    (track_id,) = scene.objects
    read(scene, track_id, "AB 123")
    scene.step([box(101, 800)], 0.1, W, H)
    assert scene.summary()["zones"]["left"]["count"] == 0  # direction not read yet
    scene.set_attribute(track_id, "direction", {"value": 0, "score": 0.99, "at": "x", "runs": 1})
    scene.step([box(102, 800)], 0.2, W, H)
    assert scene.summary()["zones"]["left"]["count"] == 1  # 0 matched as "0"


# --- the config ------------------------------------------------------------------------------------

HEAD = """\
device: {id: box-1}
pipelines:
  - name: gate-cam
    model: {path: /opt/m.onnx}
    source: {type: video, uri: /srv/v.mp4}
    postprocess: {type: detection, labels: [plate]}
"""  # the pipeline's keys follow from line 7 on
TEXT = """\
attributes:
  - name: text
    model: {path: /opt/rec.onnx}
    postprocess: {type: classification, labels: [a, b]}
"""  # lines 7-10


def config(body: str, attributes: str = TEXT) -> str:
    return HEAD + textwrap.indent(attributes + textwrap.dedent(body).strip("\n"), "    ") + "\n"


BAD: dict[str, tuple[str, str, list[str]]] = {
    "bad_regex": (
        """
        lines:
          - name: gate
            points: [[0.5, 0], [0.5, 1]]
            attributes: {text: "^[A-Z"}
        """,
        TEXT,
        [
            "14: pipelines[0].lines[0].attributes.text: '^[A-Z' is not a regular expression: "
            "unterminated character set at position 1"
        ],
    ),
    "unknown_attribute": (
        """
        zones:
          - name: bay
            points: [[0, 0], [1, 0], [1, 1]]
            attributes:
              txt: "^[A-Z]{2}"
        """,
        TEXT,
        [
            "15: pipelines[0].zones[0].attributes.txt: 'txt' is not one of the pipeline's attributes (text); "
            "did you mean 'text'?"
        ],
    ),
    "no_attributes_at_all": (
        """
        lines:
          - name: gate
            points: [[0.5, 0], [0.5, 1]]
            attributes: {text: "^[A-Z]{2}"}
        """,
        "",
        [
            "10: pipelines[0].lines[0].attributes.text: the pipeline reads no attributes: add an "
            "`attributes:` entry named 'text' to match on"
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_condition_is_reported_at_its_line_and_key(tmp_path: Path, case: str) -> None:
    body, attributes, expected = BAD[case]
    assert validate_cli(tmp_path, config(body, attributes)) == (1, expected)


def test_a_good_condition_passes(tmp_path: Path) -> None:
    body = """
    zones:
      - name: bay
        points: [[0, 0], [1, 0], [1, 1]]
        attributes: {text: "^[A-Z]{2}"}
    lines:
      - name: gate
        points: [[0.5, 0], [0.5, 1]]
        attributes: {text: "BRT$"}
    """
    assert validate_cli(tmp_path, config(body)) == (0, [])
