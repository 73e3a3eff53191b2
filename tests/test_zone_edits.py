"""Editing a zone while objects are in it (issue 34, item 6; agent/processing/scene.py `Scene.use`): an
object inside both the old and the new shape stays in with its entry time, so its dwell comes on
time and its `stayed_s` counts from its first entry; only objects the change puts out or in get an
`exit` or `enter`.

- The scene, on boxes along known paths: an edge moved while a person waits; a change that puts one
  out and one in; the zone's rules changed (dwell_s, max_objects) while it is occupied.
- A real pipeline (agent/pipeline.py) with the real YOLOv8n face detector and tracker on the rendered
  walking-faces clip of tests/test_tracking_video.py: the bench's top edge moved from 0.60 to 0.58
  while D waits on it, by a stage swap as a reload or the fleet makes it.
- The daemon (`edge-agent run`, a real mosquitto): the same edit by a config reload (SIGHUP), the
  events and the bench's Home Assistant state topics read off the broker.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import PipelineConfig, TrackConfig, ZoneConfig
from agent.pipeline import Pipeline
from agent.processing.scene import Scene
from agent.stage import LoadedModel, Stage
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.agent_process import StartAgent, read_status
from tests.media_fixtures import ListSink, cls_artifact
from tests.mosquitto import Mosquitto, Subscriber
from tests.test_scene import box, flat, run
from tests.test_tracking_video import (
    BENCH,
    DEVICE,
    EXPECTED_EVENTS,
    EXPECTED_TRACKS,
    LINES,
    PIPELINE,
    TRACK_DEFAULTS,
    WALKS,
    ZONES,
    Events,
    render,
    summary,
    write_config,
)
from tests.waits import wait_until

# --- the scene ------------------------------------------------------------------------------------------

# x 0..500, y 500..1000 (pixels): the counter a person waits at.
COUNTER = {"name": "counter", "units": "pixels", "points": [(0, 500), (500, 500), (500, 1000), (0, 1000)]}


def zone(**changes: Any) -> ZoneConfig:
    return ZoneConfig.model_validate({**COUNTER, "min_frames": 2, **changes})


def moved_top(top: float, **changes: Any) -> ZoneConfig:
    return zone(points=[(0, top), (500, top), (500, 1000), (0, 1000)], **changes)


def test_an_edge_moved_while_a_person_waits_keeps_them_in_with_their_entry_time() -> None:
    """The counter's top edge moves from 500 to 480 (0.50 -> 0.48 of the frame) 3 s into a ~10 s wait:
    one enter, the dwell dwell_s after it, one exit whose stayed_s is the whole wait."""
    track = TrackConfig(min_hits=2)
    scene = Scene(track, [zone(dwell_s=4.0)], [])
    waiting = [[box(250, 800)] for _ in range(30)]
    events = run(scene, waiting)
    (enter,) = [e for frame in events for e in frame if e["type"] == "enter"]
    scene.use(track, [moved_top(480, dwell_s=4.0)], [])
    away = [[box(250, 780 - 20 * k)] for k in range(20)]  # walking up out of it, 20 px a frame
    events += run(scene, [[box(250, 800)] for _ in range(60)] + away, start=30)
    kinds = [k for k in flat(events) if k[0] != "update"]
    assert kinds == [
        ("new", "", ""),
        ("enter", "counter", ""),
        ("dwell", "counter", ""),
        ("exit", "counter", "left"),
    ]
    every = [e for frame in events for e in frame]
    (dwell,) = [e for e in every if e["type"] == "dwell"]
    (exit_,) = [e for e in every if e["type"] == "exit"]
    assert seconds(dwell["at"]) - seconds(enter["at"]) == pytest.approx(4.0)  # on time: not from the edit
    assert dwell["stayed_s"] == pytest.approx(4.0)
    # Entered on frame 2 (min_hits 2, min_frames 2); outside the new shape from frame 106 (bottom 460;
    # at 480 it was outside the old shape already, on the new one's edge), left at 107 (min_frames 2).
    assert exit_["stayed_s"] == pytest.approx((107 - 2) / 10)
    assert exit_["stayed_s"] == pytest.approx(seconds(exit_["at"]) - seconds(enter["at"]))


def seconds(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def test_only_objects_the_change_puts_out_or_in_leave_or_enter() -> None:
    """Three people: one deep in the counter (in both shapes), one near its top (put out when the top
    edge moves down to 700), one just above it (put in when it moves back up to 450)."""
    track = TrackConfig(min_hits=1)
    scene = Scene(track, [zone()], [])
    people = [box(100, 900), box(300, 600), box(450, 470)]  # deep, near the top, above it
    events = run(scene, [people] * 3)
    ids = {e["object"]["id"]: e["object"]["box"][3] for f in events for e in f if e["type"] == "new"}
    deep, near, above = (next(i for i, bottom in ids.items() if bottom == b) for b in (900, 600, 470))
    assert [(k[0], k[1]) for k in flat(events) if k[0] == "enter"] == [("enter", "counter")] * 2
    entered = {e["object"]["id"] for f in events for e in f if e["type"] == "enter"}
    assert entered == {deep, near}

    scene.use(track, [moved_top(700)], [])  # `near` is out now
    out = run(scene, [people] * 3, start=3)
    moves = [(e["type"], e["object"]["id"], e.get("reason")) for f in out for e in f if e["type"] != "update"]
    assert moves == [("exit", near, "left")]  # after min_frames (2) frames outside, as any leaving
    assert scene.summary()["zones"]["counter"]["count"] == 1

    scene.use(track, [moved_top(450)], [])  # all three are in now: `near` again, and `above`
    back = run(scene, [people] * 3, start=6)
    moves = [(e["type"], e["object"]["id"]) for f in back for e in f if e["type"] != "update"]
    assert sorted(moves) == sorted([("enter", near), ("enter", above)])
    assert scene.objects[deep].zones["counter"] == pytest.approx(0.1)  # in since its entry (frame 1)
    assert scene.summary()["zones"]["counter"]["count"] == 3


def test_a_removed_zone_lets_its_objects_out_with_an_exit_event() -> None:
    """A zone removed while two people are in it: each gets an `exit` (reason "zone removed", with its
    stay) on the next frame, as a consumer counting enters and exits needs, and nobody lists it."""
    track = TrackConfig(min_hits=1)
    scene = Scene(track, [zone()], [])
    people = [box(100, 900), box(300, 600)]
    run(scene, [people] * 3)
    assert scene.summary()["zones"]["counter"]["count"] == 2
    scene.use(track, [], [])
    out = run(scene, [people] * 2, start=3)
    exits = [e for f in out for e in f if e["type"] == "exit"]
    assert [(e["zone"], e["reason"]) for e in exits] == [("counter", "zone removed")] * 2
    assert all(e["stayed_s"] == pytest.approx(0.2) for e in exits)  # entered at frame 1, out at frame 3
    assert [(e["type"], e.get("zone")) for f in out for e in f if e["type"] not in ("exit", "update")] == []
    assert all(not obj.zones for obj in scene.objects.values())


def test_rules_changed_while_it_is_occupied_apply_to_who_is_in() -> None:
    """max_objects removed while overcrowded ends the overcrowding; dwell_s removed ends the dwelling;
    a lower dwell_s makes those already in long enough dwell at once."""
    track = TrackConfig(min_hits=1)
    scene = Scene(track, [zone(max_objects=1, dwell_s=1.0)], [])
    two = [box(100, 900), box(300, 900)]
    events = run(scene, [two] * 15)
    assert [k for k in flat(events) if k[0] in ("overcrowded", "dwell")] == [
        ("overcrowded", "counter", "start"),
        ("dwell", "counter", ""),
        ("dwell", "counter", ""),
    ]
    scene.use(track, [zone()], [])
    later = run(scene, [two] * 2, start=15)
    assert [k for k in flat(later) if k[0] != "update"] == [("overcrowded", "counter", "end")]
    assert scene.summary()["zones"]["counter"] == {
        "count": 2, "labels": {"person": 2}, "dwelling": 0, "overcrowded": False
    }  # fmt: skip
    scene.use(track, [zone(dwell_s=30.0)], [])
    assert [k for k in flat(run(scene, [two] * 2, start=17)) if k[0] != "update"] == []
    scene.use(track, [zone(dwell_s=0.5)], [])
    assert [k[0] for k in flat(run(scene, [two], start=19))] == ["dwell", "dwell"]


# --- a real pipeline on the rendered clip ----------------------------------------------------------------

# The bench's top edge moved from 0.60 to 0.58 (the edit): D (anchor ~(578, 449)) and C
# (walking down x = 430 from t 5 s) are inside both shapes.
BENCH_MOVED = {**BENCH, "points": [[0.625, 0.58], [1, 0.58], [1, 1], [0.625, 1]]}
D_STAND = (WALKS["D"][0][0], WALKS["D"][-1][0])  # D stands on the bench from 5.0 s to 12.5 s


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "walking-faces.avi"
    render(path)
    return path


@pytest.fixture(scope="module")
def loaded(yolo_path: Path) -> Iterator[LoadedModel]:
    session = OnnxRuntimeBackend().load(cls_artifact(yolo_path))
    model = LoadedModel(name="faces", version="1", sha256="ab" * 32, session=session)
    yield model
    session.close()


def pipeline_config(clip: Path, labels: list[str], zones: list[dict[str, Any]]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": PIPELINE,
            "model": {"path": str(clip)},  # not read: the test hands the pipeline its loaded model
            "source": {"type": "video", "uri": str(clip)},  # at its own 10 fps: the video's times
            "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
            "postprocess": {"type": "detection", "score_threshold": 0.1, "labels": labels},
            "report": {"results": False},
            "zones": zones,
            "lines": LINES,
            "track": {},
        }
    )


def d_on_the_bench(events: list[dict[str, Any]]) -> int | None:
    """D's track id once it entered the bench: the first to enter it (C comes ~0.8 s later)."""
    enters = [e for e in events if e["type"] == "enter" and e["zone"] == "bench"]
    return int(enters[0]["object"]["id"]) if enters else None


def check_d_stayed_once(events: list[dict[str, Any]], edited_at: tuple[float, float]) -> None:
    """The whole clip's events are those of the clip without an edit; D entered the bench once,
    before the edit, dwelt dwell_s after that, and left it once, when its track ended, having stayed
    from its first entry (edited_at: when the edit was asked for and when it was in)."""
    tracks = [e["object"]["id"] for e in events if e["type"] == "new"]
    assert len(EXPECTED_TRACKS) <= len(tracks) <= len(EXPECTED_TRACKS) + 1  # (A and B may swap once)
    said = Counter(summary(e) for e in events if e["type"] != "update")
    ends = Counter(summary(e) for e in events if e["type"] == "end")
    assert said == EXPECTED_EVENTS + Counter({("new", None): len(tracks)}) + ends, said
    d = d_on_the_bench(events)
    mine = [e for e in events if e.get("zone") == "bench" and e.get("object", {}).get("id") == d]
    assert [e["type"] for e in mine] == ["enter", "dwell", "exit"], mine
    enter, dwell, leave = (seconds(e["at"]) for e in mine)
    assert enter < edited_at[0] and edited_at[1] < leave  # the edit came while D waited
    assert BENCH["dwell_s"] <= dwell - enter < BENCH["dwell_s"] + 0.35  # within a frame or so
    assert mine[1]["stayed_s"] == pytest.approx(dwell - enter, abs=0.002)
    assert mine[2]["reason"] == "track ended"
    assert mine[2]["stayed_s"] == pytest.approx(leave - enter, abs=0.002)
    # D stood there 7.5 s; its stay ends with its track, max_lost_s after it was last seen.
    stood = D_STAND[1] - D_STAND[0]
    assert stood - 0.6 <= mine[2]["stayed_s"] <= stood + TRACK_DEFAULTS.max_lost_s + 0.6


@pytest.mark.slow  # the 16 s clip plays at its own rate
def test_a_zone_edge_moved_by_a_stage_swap_keeps_the_waiting_person_in(
    clip: Path, loaded: LoadedModel, yolo_labels: list[str]
) -> None:
    sink = ListSink()
    pipeline = Pipeline(pipeline_config(clip, yolo_labels, ZONES), loaded, sink)
    events = lambda: [e for _, e in list(sink.events)]  # noqa: E731
    pipeline.start()
    try:
        wait_until(lambda: d_on_the_bench(events()) is not None, "D on the bench", timeout=120)
        swap_started = time.time()
        edited = Stage(pipeline_config(clip, yolo_labels, [ZONES[0], BENCH_MOVED]), loaded)
        assert pipeline.stages.swap_in(edited, timeout=60)
        swapped = time.time()
        wait_until(lambda: pipeline.finished, "the clip's end", timeout=120)
    finally:
        pipeline.stop(timeout=30)
    got = events()
    assert pipeline.status().stage_swaps == 1
    check_d_stayed_once(got, (swap_started, swapped))
    final = pipeline.status().tracking
    assert final is not None and final["zones"]["bench"]["count"] == 0


# --- the daemon: a config reload ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_reload_that_moves_a_zone_edge_keeps_the_waiting_person_in_and_home_assistant_s_count(
    tmp_path: Path,
    mosquitto: Mosquitto,
    clip: Path,
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
) -> None:
    config = write_config(tmp_path, mosquitto.port, clip, yolo_path, yolo_labels, {})
    data = yaml.safe_load(config.read_text())
    data["home_assistant"] = {"enabled": True}
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    state_dir = tmp_path / "state"
    bench = f"edge/{DEVICE}/state/{PIPELINE}/zone/bench"
    events = Events(mosquitto)
    ha = Subscriber(mosquitto.host, mosquitto.port, f"{bench}/#")
    agent = start_agent(config)
    try:
        wait_until(
            lambda: d_on_the_bench(events.all()) is not None,
            "D on the bench",
            timeout=180,
            state=lambda: agent.log()[-3000:],
        )
        data["pipelines"][0]["zones"] = [ZONES[0], BENCH_MOVED]
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        reload_sent = time.time()
        agent.send_signal(signal.SIGHUP)

        def swapped() -> bool:
            status = read_status(state_dir)
            reload = (status.get("config") or {}).get("last_reload") or {}
            swaps = status.get("pipelines", {}).get(PIPELINE, {}).get("stage_swaps")
            return reload.get("result") == "applied" and swaps == 1

        wait_until(swapped, "the reload's new stage", timeout=60, state=lambda: agent.log()[-3000:])
        reloaded = time.time()

        def played_through() -> bool:
            got = events.all()
            state = read_status(state_dir).get("pipelines", {}).get(PIPELINE, {}).get("state")
            finished = state == "finished"
            news = sorted(e["object"]["id"] for e in got if e["type"] == "new")
            return finished and news == sorted(e["object"]["id"] for e in got if e["type"] == "end")

        wait_until(played_through, "the clip's end and every track's", timeout=120)
        agent.stop()
        got = events.all()
        check_d_stayed_once(got, (reload_sent, reloaded))
        # Home Assistant's bench count never dropped while D waited: the seed, D, C, C gone, C back,
        # C gone, D gone; its dwelling sensor went on once, with D's dwell, and off with D's stay.
        counts = [m.payload for m in ha.messages if m.topic == f"{bench}/count"]
        assert counts == [b"0", b"1", b"2", b"1", b"2", b"1", b"0"], counts
        dwelling = [m.payload for m in ha.messages if m.topic == f"{bench}/dwelling"]
        assert dwelling == [b"OFF", b"ON", b"OFF"], dwelling
    finally:
        events.close()
        ha.close()
