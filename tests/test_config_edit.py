"""The zone editor's save (agent/config_edit.py) on real config files with comments: a pipeline's
zones, lines and masks replaced, every other line of the file as it was; bad shapes refused by the
validator `config validate` uses, each problem by its shape, the file untouched; a file changed on
disk refused; the write atomic, mode kept."""

from __future__ import annotations

import difflib
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from agent.config_edit import (
    CHANGED_ON_DISK,
    Drawn,
    Refused,
    edited_text,
    file_hash,
    replace_in,
    save_shapes,
    shapes_of,
)
from agent.config_loader import load_config, parse_config

REPO = Path(__file__).resolve().parents[1]

# A hand-written config: comments everywhere, quoting, flow and block styles, two pipelines.
SHOP = textwrap.dedent(
    """\
    # The shop's agent: a door camera and a yard camera.
    device:
      id: shop-1   # as the fleet knows it
    mqtt:
      host: 127.0.0.1
      port: 1883
    registry:
      url: "file:///srv/registry"
    pipelines:
      # The door: who comes in, who waits at the counter.
      - name: door
        model: {name: det, version: "1"}
        source: {type: video, uri: rtsp://10.0.0.5/door}
        postprocess:
          type: detection
          labels: [person, car]     # what the model's classes are called
        zones:
          - name: counter           # by the till
            points: [[0.7, 0.15], [1.0, 0.15], [1.0, 0.45], [0.7, 0.45]]
            labels: [person]
            dwell_s: 30             # a dwell event after half a minute
          - name: shelf
            units: pixels
            points: [[10, 10], [200, 10], [200, 100]]
        lines:
          - name: entry
            points: [[0.0, 0.7], [1.0, 0.7]]
            in: 'entering'          # quoted on purpose
            out: leaving
        # the clock overlay never counts as motion
        motion:
          threshold: 30
          masks:
            - points: [[0.75, 0.0], [1.0, 0.0], [1.0, 0.08]]

      # The yard: cars only.
      - name: yard
        model: {name: det, version: "1"}
        source: {type: video, uri: /srv/yard.mp4}
        postprocess: {type: detection, labels: [person, car]}
        lines:
          - {name: gate, points: [[0.5, 0.0], [0.5, 1.0]]}
    telemetry:
      interval_s: 60   # once a minute
    """
)

COUNTER = ((0.7, 0.15), (1.0, 0.15), (1.0, 0.45), (0.7, 0.45))
TILL = ((0.1, 0.2), (0.3, 0.2), (0.3, 0.4))


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(SHOP, encoding="utf-8")
    return path


def changed_lines(before: str, after: str) -> list[int]:
    """The original's line numbers (0-based) that the edit replaced or inserted before."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    changed: list[int] = []
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            changed += list(range(i1, max(i2, i1 + 1)))
    return changed


def block(text: str, after: str, key: str) -> range:
    """The lines of `key:`'s block (to the next line as little indented, comments and blanks
    after it left out) in the first pipeline named `after`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- name: {after}")
    start = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith(f"{key}:"))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent or
        lines[end].lstrip().startswith("#")
    ):  # fmt: skip
        end += 1
    while not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#"):
        end -= 1
    return range(start, end + 1)  # +1: a block appended after the last line inserts there


# --- the edit keeps the file ------------------------------------------------------------------------


def test_moving_a_zone_and_adding_one_changes_only_the_zones_block(shop: Path) -> None:
    shapes = {
        "zones": [
            Drawn(((0.5, 0.5), (0.9, 0.5), (0.9, 0.9)), "counter", origin=0, moved=True),
            Drawn(((10, 10), (200, 10), (200, 100)), "shelf", origin=1, moved=False),
            Drawn(TILL, "till"),
        ]
    }
    after = edited_text(SHOP, "door", shapes)
    assert set(changed_lines(SHOP, after)) <= set(block(SHOP, "door", "zones"))
    assert after.splitlines()[block(SHOP, "door", "zones").start :][:11] == [
        "    zones:",
        "      - name: counter           # by the till",
        "        points: [[0.5, 0.5], [0.9, 0.5], [0.9, 0.9]]",
        "        labels: [person]",
        "        dwell_s: 30             # a dwell event after half a minute",
        "      - name: shelf",
        "        units: pixels",
        "        points: [[10, 10], [200, 10], [200, 100]]",  # not moved: its pixels stay
        "      - name: till",
        "        points: [[0.1, 0.2], [0.3, 0.2], [0.3, 0.4]]",
        "    lines:",
    ]
    door = parse_config(after).pipelines[0]
    assert [z.name for z in door.zones] == ["counter", "shelf", "till"]
    assert door.zones[0].labels == ["person"] and door.zones[0].dwell_s == 30


def test_a_name_yaml_would_read_as_false_is_quoted(shop: Path) -> None:
    """PyYAML, the agent's loader, reads `off` as false (YAML 1.1): the editor writes 'off'."""
    after = edited_text(SHOP, "door", {"zones": [Drawn(TILL, "off")]})
    assert "      - name: 'off'\n" in after
    assert [z.name for z in parse_config(after).pipelines[0].zones] == ["off"]


def test_a_moved_pixel_zone_is_written_in_fractions(shop: Path) -> None:
    shapes = {"zones": [Drawn(COUNTER, "counter", 0, False), Drawn(TILL, "shelf", 1, True)]}
    shelf = parse_config(edited_text(SHOP, "door", shapes)).pipelines[0].zones[1]
    assert (shelf.units, shelf.points) == ("fraction", list(TILL))


def test_every_kind_removed_renamed_and_added(shop: Path) -> None:
    shapes = {
        "zones": [],  # both gone: the key goes
        "lines": [Drawn(((0.0, 0.7), (1.0, 0.7)), "door-line", 0, False, ("person",), True)],
        "motion_masks": [Drawn(((0.0, 0.0), (0.2, 0.0), (0.2, 0.1)), origin=None)],
        "object_masks": [Drawn(((0.4, 0.4), (0.6, 0.4), (0.5, 0.6)), labels=("car",), set_labels=True)],
    }
    after = edited_text(SHOP, "door", shapes)
    assert "zones:" not in after.split("- name: yard")[0]
    assert "        in: 'entering'          # quoted on purpose\n" in after  # quoting and comment kept
    assert "    # the clock overlay never counts as motion\n      threshold: 30\n" not in after
    door = parse_config(after).pipelines[0]
    assert [(ln.name, ln.labels, ln.in_) for ln in door.lines] == [("door-line", ["person"], "entering")]
    assert door.motion is not None and door.motion.threshold == 30
    assert [m.points for m in door.motion.masks] == [[(0.0, 0.0), (0.2, 0.0), (0.2, 0.1)]]
    assert door.filters is not None
    assert [(m.labels, len(m.points)) for m in door.filters.masks] == [(["car"], 3)]
    # Outside the pipeline's edited keys, not a byte moved: the yard, the comments, the telemetry.
    assert after.split("  # The yard: cars only.")[1] == SHOP.split("  # The yard: cars only.")[1]
    assert after.startswith(SHOP.split("    zones:")[0])


def test_the_same_shapes_leave_the_file_as_it_is(shop: Path) -> None:
    config = load_config(shop).pipelines[0]
    shapes: dict[str, list[Drawn]] = {
        kind: [Drawn(tuple(s["points"]), s.get("name"), i, False) for i, s in enumerate(items)]
        for kind, items in shapes_of(config).items()
    }
    saved = save_shapes(shop, "door", shapes, file_hash(shop.read_bytes()))
    assert not saved.changed and shop.read_text() == SHOP


@pytest.mark.parametrize(
    ("path", "pipeline", "edits"),
    [
        ("configs/agent.example.yaml", "faces", ("zones", "lines", "motion_masks", "object_masks")),
        ("configs/demo-tracking.yaml", "shop", ("zones", "lines")),
    ],
)
def test_the_repositorys_configs_keep_every_line_outside_the_edit(
    tmp_path: Path, path: str, pipeline: str, edits: tuple[str, ...]
) -> None:
    text = (REPO / path).read_text().replace("@WORK@", str(tmp_path)).replace("@PORT@", "1883")
    config = next(p for p in parse_config(text).pipelines if p.name == pipeline)
    current = shapes_of(config)
    shapes: dict[str, list[Drawn]] = {}
    for kind in edits:  # the first shape moved, the rest kept, one added
        items = [Drawn(tuple(s["points"]), s.get("name"), i, False) for i, s in enumerate(current[kind])]
        if items:
            first = items[0]
            items[0] = Drawn(tuple((x * 0.9, y * 0.9) for x, y in first.points), first.name, 0, True)
        new_points = ((0.1, 0.1), (0.2, 0.1)) if kind == "lines" else TILL
        shapes[kind] = [*items, Drawn(new_points, f"new-{kind}" if kind in ("zones", "lines") else None)]
    after = edited_text(text, pipeline, shapes)
    keys = {"zones": "zones", "lines": "lines", "motion_masks": "motion", "object_masks": "filters"}
    allowed = set().union(*(block(text, pipeline, keys[kind]) for kind in edits))
    assert changed_lines(text, after) and set(changed_lines(text, after)) <= allowed
    edited = next(p for p in parse_config(after).pipelines if p.name == pipeline)
    assert [z.name for z in edited.zones][-1] == "new-zones" and edited.lines[-1].name == "new-lines"
    kept = {k: v for k, v in yaml.safe_load(after).items() if k != "pipelines"}
    assert kept == {k: v for k, v in yaml.safe_load(text).items() if k != "pipelines"}


# --- refused: the file untouched --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "shape", "message"),
    [
        (Drawn(((0.1, 0.1), (0.2, 0.1)), "tiny"), ("zones", 1), "points: List should have at least 3 items"),
        (
            Drawn(((0.1, 0.1), (1.2, 0.1), (0.3, 0.5)), "off"),
            ("zones", 1),
            "points: point 1 (1.2, 0.1) is outside the frame",
        ),
        (
            Drawn(TILL, "counter"),
            ("zones", 1),
            "name: 'counter' is already the name of zones[0]: zones and lines need names of their own",
        ),
        (
            Drawn(TILL, "till", labels=("persn",), set_labels=True),
            ("zones", 1),
            "labels[0]: 'persn' is not one of postprocess.labels (person, car); did you mean 'person'?",
        ),
    ],
)
def test_a_bad_shape_is_refused_by_the_validator_beside_that_shape(
    shop: Path, zone: Drawn, shape: tuple[str, int], message: str
) -> None:
    before = shop.read_bytes()
    shapes = {"zones": [Drawn(COUNTER, "counter", 0, False), zone]}
    with pytest.raises(Refused) as refused:
        save_shapes(shop, "door", shapes, file_hash(before))
    assert refused.value.problems == []
    assert list(refused.value.by_shape) == [shape]
    assert refused.value.by_shape[shape][0].startswith(message)
    assert shop.read_bytes() == before


def test_a_line_crossing_nothing_is_refused_at_that_line(shop: Path) -> None:
    shapes = {
        "lines": [Drawn(((0.0, 0.7), (1.0, 0.7)), "entry", 0, False), Drawn(((0.3, 0.3), (0.3, 0.3)), "x")]
    }
    with pytest.raises(Refused) as refused:
        save_shapes(shop, "door", shapes, file_hash(shop.read_bytes()))
    assert refused.value.by_shape == {
        ("lines", 1): ["points: both ends are (0.3, 0.3): a line needs two different points"]
    }


def test_a_file_changed_since_the_editor_read_it_is_refused(shop: Path) -> None:
    opened = file_hash(shop.read_bytes())
    shop.write_text(SHOP.replace("interval_s: 60", "interval_s: 30"))
    changed = shop.read_bytes()
    with pytest.raises(Refused) as refused:
        save_shapes(shop, "door", {"zones": [Drawn(TILL, "till")]}, opened)
    assert refused.value.problems == [CHANGED_ON_DISK]
    assert shop.read_bytes() == changed


def test_motion_masks_never_turn_a_gate_on(shop: Path) -> None:
    """The yard plays a file: no gate unless `motion:` says so; a mask drawn there is refused."""
    with pytest.raises(Refused, match="runs no motion gate, so motion masks would turn one on"):
        save_shapes(shop, "yard", {"motion_masks": [Drawn(TILL)]}, file_hash(shop.read_bytes()))
    assert shop.read_text() == SHOP


def test_an_unknown_pipeline_and_reordered_shapes_are_refused(shop: Path) -> None:
    with pytest.raises(Refused, match="the file has no pipeline 'hall'"):
        edited_text(SHOP, "hall", {"zones": []})
    reordered = {"zones": [Drawn(TILL, "shelf", 1, False), Drawn(COUNTER, "counter", 0, False)]}
    with pytest.raises(Refused, match="the file's shapes must come first, in their order"):
        edited_text(SHOP, "door", reordered)


# --- the write --------------------------------------------------------------------------------------


def test_the_write_is_atomic_and_keeps_the_mode(shop: Path) -> None:
    shop.chmod(0o640)
    inode = shop.stat().st_ino
    umask = os.umask(0o077)  # the daemon's: a new file would be 0600
    try:
        saved = save_shapes(shop, "door", {"zones": [Drawn(TILL, "till")]}, file_hash(shop.read_bytes()))
    finally:
        os.umask(umask)
    st = shop.stat()
    assert saved.changed and st.st_mode & 0o7777 == 0o640
    assert st.st_ino != inode  # a new file renamed over the old one, never the old one rewritten
    assert saved.sha256 == file_hash(shop.read_bytes())
    assert [z.name for z in load_config(shop).pipelines[0].zones] == ["till"]
    assert [p.name for p in shop.parent.iterdir()] == ["agent.yaml"]  # no temp file left


# --- the fleet's snippet ------------------------------------------------------


def test_the_fleets_snippet_keeps_the_pipelines_other_keys() -> None:
    pipeline = {
        "model": {"name": "det", "version": "1"},
        "zones": [{"name": "counter", "points": [list(p) for p in COUNTER], "dwell_s": 30}],
    }
    new = replace_in(pipeline, {"zones": [Drawn(TILL, "counter", 0, True), Drawn(COUNTER, "door")]})
    assert new == {
        "model": {"name": "det", "version": "1"},
        "zones": [
            {"name": "counter", "points": [list(p) for p in TILL], "dwell_s": 30},
            {"name": "door", "points": [list(p) for p in COUNTER]},
        ],
    }
