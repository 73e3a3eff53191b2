"""The scene's events from tracked boxes (agent/processing/scene.py): objects moved along known paths
through zones and across lines, frame by frame, with the events each frame must make."""

from __future__ import annotations

from typing import Any

import pytest

from agent.config import LineConfig, SnapshotsConfig, TrackConfig, ZoneConfig
from agent.processing.scene import Scene

W, H = 1000, 1000
FPS = 10.0
# A zone in the left half, lower part: x 0..500, y 500..1000 (pixels, so the arithmetic is plain).
LEFT = ZoneConfig(name="left", units="pixels", points=[(0, 500), (500, 500), (500, 1000), (0, 1000)])
# A vertical line at x = 600 from top to bottom. Walking down it (y grows downwards), the walker's
# right is the picture's left: `in` (right side to left) is moving east, `out` moving west.
GATE = LineConfig(name="gate", units="pixels", points=[(600, 0), (600, 1000)], **{"in": "east"}, out="west")


def box(
    cx: float, bottom: float, label: str = "person", score: float = 0.9, size: float = 60
) -> dict[str, Any]:
    """A detection whose bottom centre is (cx, bottom)."""
    return {"box": [cx - size / 2, bottom - 2 * size, cx + size / 2, bottom], "score": score, "label": label}


def run(scene: Scene, frames: list[list[dict[str, Any]]], start: int = 0) -> list[list[dict[str, Any]]]:
    """Feed frames at FPS; the events of each frame."""
    out = []
    for i, boxes in enumerate(frames, start):
        scene.step(boxes, i / FPS, W, H)
        out.append(scene.take_events())
    return out


def flat(per_frame: list[list[dict[str, Any]]]) -> list[tuple[str, ...]]:
    """(type, zone or line, direction or reason) per event, in order."""
    result = []
    for events in per_frame:
        for e in events:
            extra = e.get("zone") or e.get("line") or ""
            result.append((e["type"], extra, e.get("direction") or e.get("reason") or e.get("state") or ""))
    return result


def walk(x0: float, x1: float, steps: int, bottom: float = 800, **kw: Any) -> list[list[dict[str, Any]]]:
    return [[box(x0 + (x1 - x0) * i / (steps - 1), bottom, **kw)] for i in range(steps)]


def test_an_object_walking_through_the_zone_and_across_the_line_makes_each_event_once() -> None:
    scene = Scene(TrackConfig(min_hits=2), [LEFT], [GATE])
    frames = walk(100, 900, 41) + [[] for _ in range(15)]  # then gone: ends after max_lost_s
    events = run(scene, frames)
    kinds = flat(events)
    assert kinds == [
        ("new", "", ""),
        ("enter", "left", ""),  # in the new frame the object is already inside: enter follows new
        ("exit", "left", "left"),
        ("update", "", ""),
        ("cross", "gate", "east"),
        ("update", "", ""),
        ("end", "", "lost"),
    ]
    new = next(e for e in events[1] if e["type"] == "new")  # confirmed on its second frame
    assert new["object"]["id"] == 1 and new["object"]["zones"] == ["left"]
    end = next(e for frame in events for e in frame if e["type"] == "end")
    obj = end["object"]
    assert obj["entered_zones"] == ["left"] and obj["zones"] == []
    assert [(c["line"], c["direction"]) for c in obj["crossings"]] == [("gate", "east")]
    assert scene.summary()["lines"] == {"gate": {"east": 1, "west": 0}}
    assert scene.summary()["tracks"] == 0


def test_crossing_back_counts_the_other_direction_and_touching_the_line_counts_nothing() -> None:
    scene = Scene(TrackConfig(min_hits=1), [], [GATE])
    there = walk(500, 700, 11)
    touch_and_back = [[box(650 - 5 * i, 800)] for i in range(11)]  # 650 -> 600 (on the line) -> ...
    touch_and_back += [[box(600 + 5 * i, 800)] for i in range(1, 11)]  # ... and back east: no crossing
    back = walk(650, 500, 11)
    kinds = [k for k in flat(run(scene, there + touch_and_back + back)) if k[0] == "cross"]
    assert kinds == [("cross", "gate", "east"), ("cross", "gate", "west")]
    assert scene.summary()["lines"]["gate"] == {"west": 1, "east": 1}


def test_a_rebuilt_pipelines_scene_counts_on_from_the_counts_it_is_given() -> None:
    """A pipeline rebuilt (a new source, a retry) makes a new scene; the daemon keeps the line counts
    (ResultWriter.line_counts), so `count` and the line's totals go on from the last scene's."""
    counts: dict[str, dict[str, int]] = {}
    first = Scene(TrackConfig(min_hits=1), [], [GATE], line_counts=counts)
    run(first, walk(500, 700, 11))
    assert counts == {"gate": {"east": 1}}
    again = Scene(TrackConfig(min_hits=1), [], [GATE], line_counts=counts)
    events = [e for f in run(again, walk(500, 700, 11), start=20) for e in f if e["type"] == "cross"]
    assert [(e["direction"], e["count"]) for e in events] == [("east", 2)]
    assert again.summary()["lines"]["gate"] == {"east": 2, "west": 0}


def test_min_frames_is_inertia_both_ways_and_a_flicker_on_the_edge_neither_enters_nor_leaves() -> None:
    zone = LEFT.model_copy(update={"min_frames": 3})
    scene = Scene(TrackConfig(min_hits=1), [zone], [])
    # Small steps (the tracker keeps the one track): in for 2 frames, out for 1, in for 2: never 3 in
    # a row, so never entered.
    xs = [480, 490, 510, 490, 480, 510, 520]
    kinds = flat(run(scene, [[box(x, 800, size=100)] for x in xs]))
    assert [k for k in kinds if k[0] in ("enter", "exit")] == []
    # Three in a row: entered; then out for 2 (stays), back in, out for 3: left once.
    xs = [490, 480, 480, 510, 520, 490, 510, 520, 530]
    kinds = flat(run(scene, [[box(x, 800, size=100)] for x in xs], start=len(xs)))
    assert [k for k in kinds if k[0] in ("enter", "exit")] == [
        ("enter", "left", ""),
        ("exit", "left", "left"),
    ]


def test_min_seconds_waits_for_time_inside_as_well_as_frames() -> None:
    zone = LEFT.model_copy(update={"min_seconds": 0.5})
    scene = Scene(TrackConfig(min_hits=1), [zone], [])
    events = run(scene, [[box(300, 800)] for _ in range(10)])  # 0.1 s per frame
    entered_at = [i for i, frame in enumerate(events) if any(e["type"] == "enter" for e in frame)]
    assert entered_at == [5]  # first inside at frame 0, 0.5 s later at frame 5


def test_dwell_fires_once_per_stay_and_again_after_leaving_and_coming_back() -> None:
    zone = LEFT.model_copy(update={"dwell_s": 1.0})
    scene = Scene(TrackConfig(min_hits=1, max_lost_s=5), [zone], [])
    stay = [[box(300, 800)] for _ in range(25)]  # 2.4 s inside
    leave = walk(300, 700, 21) + walk(700, 300, 21)
    kinds = flat(run(scene, stay + leave + stay))
    assert [k[0] for k in kinds if k[0] in ("enter", "dwell", "exit")] == [
        "enter",
        "dwell",
        "exit",
        "enter",
        "dwell",
    ]
    dwell = [k for k in kinds if k[0] == "dwell"]
    assert len(dwell) == 2


def test_overcrowding_starts_above_max_objects_and_ends_when_it_drops() -> None:
    zone = LEFT.model_copy(update={"max_objects": 2})
    scene = Scene(TrackConfig(min_hits=1, max_lost_s=0.15), [zone], [])
    three = [[box(100, 800), box(250, 800), box(400, 800)] for _ in range(5)]
    two = [[box(100, 800), box(250, 800)] for _ in range(5)]  # the third is gone: its track ends
    events = run(scene, three + two)
    crowd = [(e["state"], e["count"]) for frame in events for e in frame if e["type"] == "overcrowded"]
    assert crowd == [("start", 3), ("end", 2)]
    assert scene.summary()["zones"]["left"]["count"] == 2


def test_a_lost_object_stays_in_its_zone_until_its_track_ends_then_leaves_with_the_end() -> None:
    scene = Scene(TrackConfig(min_hits=1, max_lost_s=0.5), [LEFT], [])
    events = run(scene, [[box(300, 800)] for _ in range(3)] + [[] for _ in range(4)])
    assert scene.summary()["zones"]["left"]["count"] == 1  # unseen for 0.4 s: still there
    events += run(scene, [[] for _ in range(3)], start=7)
    kinds = flat(events)
    assert kinds[-2:] == [("exit", "left", "track ended"), ("end", "", "lost")]
    assert scene.summary()["zones"]["left"]["count"] == 0


def test_label_filters_keep_other_labels_out_of_zones_and_line_counts() -> None:
    zone = LEFT.model_copy(update={"labels": ["car"]})
    line = GATE.model_copy(update={"labels": ["car"]})
    scene = Scene(TrackConfig(min_hits=1), [zone], [line])
    person = walk(100, 900, 21)
    car = walk(100, 900, 21, bottom=700, label="car")
    both = [p + c for p, c in zip(person, car, strict=True)]
    kinds = flat(run(scene, both))
    assert [k for k in kinds if k[0] in ("enter", "cross")] == [
        ("enter", "left", ""),
        ("cross", "gate", "east"),
    ]
    events_objects = [e for e in kinds if e[0] == "new"]
    assert len(events_objects) == 2  # both tracked


def test_per_label_tracking_gives_each_label_its_own_ids() -> None:
    scene = Scene(TrackConfig(min_hits=1), [], [])
    boxes = [[box(300, 800, label="person"), box(300, 800, label="dog")] for _ in range(3)]
    run(scene, boxes)
    assert sorted((o.label, o.id) for o in scene.objects.values()) == [("dog", 2), ("person", 1)]


def test_changing_zones_keeps_every_track_and_the_unchanged_zones_state() -> None:
    right = ZoneConfig(
        name="right", units="pixels", points=[(500, 500), (1000, 500), (1000, 1000), (500, 1000)]
    )
    scene = Scene(TrackConfig(min_hits=1), [LEFT], [GATE])
    run(scene, [[box(300, 800), box(800, 800)] for _ in range(3)])
    ids = sorted(scene.objects)
    scene.use(TrackConfig(min_hits=1), [LEFT, right], [GATE])
    events = run(scene, [[box(300, 800), box(800, 800)] for _ in range(2)], start=3)
    assert sorted(scene.objects) == ids  # same tracks
    kinds = flat(events)
    assert ("enter", "left", "") not in kinds  # left's state kept: no second enter
    assert ("enter", "right", "") in kinds  # the new zone places its objects from the next frame
    assert all(k[0] != "new" for k in kinds)
    scene.use(TrackConfig(min_hits=1), [right], [])  # left removed: its object no longer lists it
    run(scene, [[box(300, 800), box(800, 800)]], start=5)
    assert all("left" not in o.zones for o in scene.objects.values())
    assert set(scene.summary()["zones"]) == {"right"}


def test_end_all_ends_every_track_with_the_reason_and_ids_go_on_from_next_id() -> None:
    scene = Scene(TrackConfig(min_hits=1), [LEFT], [], next_id=41)
    run(scene, [[box(300, 800), box(900, 800)] for _ in range(2)])
    assert sorted(scene.objects) == [41, 42]
    scene.end_all("stopped", 1.0)
    kinds = flat([scene.take_events()])
    assert kinds == [("exit", "left", "track ended"), ("end", "", "stopped"), ("end", "", "stopped")]
    assert scene.objects == {}


def test_the_summary_lists_the_configured_zones_and_lines_before_the_first_frame() -> None:
    scene = Scene(TrackConfig(), [LEFT], [GATE])
    before = scene.summary()
    assert before["zones"] == {"left": {"count": 0, "labels": {}, "dwelling": 0, "overcrowded": False}}
    assert before["lines"] == {"gate": {"east": 0, "west": 0}} and before["tracks"] == 0
    run(scene, [[]])
    assert scene.summary() == before  # the same shape once shaped


def test_track_ids_are_written_into_the_entries_and_none_while_tentative() -> None:
    scene = Scene(TrackConfig(min_hits=2), [], [])
    first = [box(300, 800)]
    scene.step(first, 0.0, W, H)
    assert first[0]["track_id"] is None
    second = [box(302, 800)]
    scene.step(second, 0.1, W, H)
    assert second[0]["track_id"] == 1


def test_snapshots_are_wanted_for_a_new_object_then_only_for_a_clearly_better_picture() -> None:
    track = TrackConfig(min_hits=1, snapshots=SnapshotsConfig(enabled=True, interval_s=0.0))
    scene = Scene(track, [], [])
    scene.step([box(300, 800, score=0.6)], 0.0, W, H)
    wanted = scene.snapshots_wanted()
    assert [w.track_id for w in wanted] == [1]
    scene.snapshot_taken(1, "1-a", wanted[0].quality, 0.0)
    assert [e["changed"] for e in scene.take_events() if e["type"] == "update"] == []  # `new` carries it
    scene.step([box(300, 800, score=0.62)], 0.1, W, H)  # hardly better: not worth a picture
    assert scene.snapshots_wanted() == []
    scene.step([box(300, 800, score=0.9, size=90)], 0.2, W, H)  # much better
    better = scene.snapshots_wanted()
    assert [w.track_id for w in better] == [1]
    scene.snapshot_taken(1, "1-b", better[0].quality, 0.2)
    updates = [e for e in scene.take_events() if e["type"] == "update"]
    assert updates[0]["changed"] == ["snapshot"] and updates[0]["object"]["snapshot"] == "1-b"
    scene.step([box(0, 800, score=0.95, size=200)], 0.3, W, H)  # bigger, but cut by the frame's edge
    assert scene.snapshots_wanted() == [] or scene.objects[1].snapshot_quality > 0


@pytest.mark.parametrize("count", [0, 1, 50])
def test_many_or_no_objects_in_a_frame(count: int) -> None:
    scene = Scene(TrackConfig(min_hits=1), [LEFT], [GATE])
    boxes = [[box(20 + 19 * i, 600 + (i % 5) * 80, size=10) for i in range(count)] for _ in range(3)]
    run(scene, boxes)
    assert len(scene.objects) == count
