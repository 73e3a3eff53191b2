"""The recent-events index (agent/event_index.py): real events from a real Scene (an object walking
through a zone and over a line, snapshots saved in a real SnapshotStore) written through the real
ResultWriter and EventWriter into a real Outbox, and what the index holds of them; its restart,
retention and damaged or unusable files (the events reach the outbox all the same)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import pytest

from agent.clips import ClipRecorder
from agent.config import (
    LineConfig,
    SnapshotRetentionConfig,
    SnapshotsConfig,
    TrackConfig,
    ZoneConfig,
)
from agent.event_index import EventIndex
from agent.events import EventWriter, TrackJournal
from agent.mqtt import Outbox
from agent.processing.scene import Scene
from agent.results import ResultWriter
from agent.snapshots import SnapshotStore
from tests.media_fixtures import astronaut_bgr

W = H = 1000
FPS = 10.0
# The left half's lower part (pixels) with a dwell, and a gate at x = 600 (`in` is moving east).
LEFT = ZoneConfig(
    name="counter", units="pixels", points=[(0, 500), (500, 500), (500, 1000), (0, 1000)], dwell_s=0.3
)
GATE = LineConfig(name="gate", units="pixels", points=[(600, 0), (600, 1000)], **{"in": "east"}, out="west")


def box(cx: float, bottom: float, label: str, score: float, size: float = 60) -> dict[str, Any]:
    return {"box": [cx - size / 2, bottom - 2 * size, cx + size / 2, bottom], "score": score, "label": label}


@dataclass
class Box:
    """A state dir's outbox, snapshots, journal and events index, and the writer the daemon makes."""

    root: Path
    outbox: Outbox
    index: EventIndex
    snapshots: SnapshotStore
    writer: ResultWriter

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(row.payload) for row in self.outbox.peek(10_000)]


def open_box(root: Path, **index_settings: Any) -> Box:
    outbox = Outbox(root / "outbox.sqlite")
    index = EventIndex(root / "events.db", **index_settings)
    snapshots = SnapshotStore(root / "snapshots", SnapshotRetentionConfig())
    events = EventWriter("box-1", "edge", outbox, TrackJournal(root / "tracks"), index)
    writer = ResultWriter(
        "box-1", "edge", 1_000_000, outbox, lambda: None, events=events, snapshots=snapshots
    )
    return Box(root, outbox, index, snapshots, writer)


def walk(
    box_: Box,
    pipeline: str = "door",
    start: float | None = None,
    clip: str | None = None,
    recorder: ClipRecorder | None = None,
) -> float:
    """A person walking east through the zone `counter` (dwelling there) and over the gate, and a car
    standing still by it whose plate is read; both end at the last frame. Returns the last frame's
    time. Every frame goes as the pipeline's tracking does it: snapshots taken from the frame, the
    clip recorder handed the frame (it puts its clip's id on the events), then the events to the
    writer. `clip`: an id put on every event instead (no recorder)."""
    track = TrackConfig(min_hits=1, snapshots=SnapshotsConfig(enabled=True, interval_s=0.2))
    scene = Scene(track, [LEFT], [GATE])
    frame = cv2.resize(astronaut_bgr(), (W, H))
    small = cv2.resize(frame, (160, 160))  # the clip's (its size does not matter here)
    t0 = time.time() - 10 if start is None else start
    tag = {} if clip is None else {"clip": clip}
    now = t0
    for i, x in enumerate(range(100, 820, 20)):
        now = t0 + i / FPS
        # The person's score grows: a later picture is better, and replaces the snapshot before it.
        person, car = box(x, 800, "person", 0.6 + 0.01 * i, 150), box(250, 450, "car", 0.9, 120)
        scene.step([person, car], now, W, H)
        if i == 3:
            car = next(o.id for o in scene.objects.values() if o.label == "car")
            value = {"value": "KX42 <BRT>", "score": 0.97, "at": "2026-11-29T06:00:00.000Z", "runs": 1}
            assert scene.set_attribute(car, "plate", value)
        for wanted in scene.snapshots_wanted():
            saved = box_.writer.save_snapshot(pipeline, wanted, frame, now, track.snapshots)
            assert saved is not None
            scene.snapshot_taken(wanted.track_id, saved, wanted.quality, now)
        events = [{**e, **tag} for e in scene.take_events()]
        if recorder is not None:
            recorder.frame(small, now, events)
        box_.writer.write_events(pipeline, events)
    scene.end_all("stopped", now)
    ends = [{**e, **tag} for e in scene.take_events()]
    if recorder is not None:
        recorder.tag(ends)
    box_.writer.write_events(pipeline, ends)
    return now


def test_real_events_are_indexed_with_what_the_page_shows(tmp_path: Path) -> None:
    box_ = open_box(tmp_path)
    t_end = walk(box_, clip="20261129T071846Z-1a2b3c4d")
    messages = box_.messages()
    kinds = {m["type"] for m in messages}
    assert {"new", "update", "enter", "dwell", "exit", "cross", "end"} <= kinds  # the walk made them all
    rows = box_.index.query(limit=500)
    # Every event but `update`, newest first, each with the seq and the whole message the outbox holds.
    published = [m for m in messages if m["type"] != "update"]
    assert [r.seq for r in reversed(rows)] == [m["seq"] for m in published]
    assert [r.event for r in reversed(rows)] == published
    assert {r.type for r in rows} == kinds - {"update"}
    by_type = {r.type: r for r in rows}
    assert (by_type["enter"].zone, by_type["enter"].label) == ("counter", "person")
    assert (by_type["cross"].line, by_type["cross"].direction) == ("gate", "east")  # its `in` name
    assert by_type["exit"].zone == "counter" and by_type["dwell"].zone == "counter"
    assert all(r.clip == "20261129T071846Z-1a2b3c4d" for r in rows)
    assert all(r.pipeline == "door" and r.track is not None for r in rows)
    assert rows[0].at == messages[-1]["at"] and abs(rows[0].t - t_end) < 0.01
    # The car's plate, as read: on its end (the object) with its score.
    car_end = next(r for r in rows if r.type == "end" and r.label == "car")
    assert (
        car_end.attributes["plate"]["value"] == "KX42 <BRT>" and car_end.attributes["plate"]["score"] == 0.97
    )
    # The brief objects of enter/cross have no snapshot: the row has the track's. Better pictures
    # replaced the first (the old files removed), and every row names the one kept.
    replaced = [m for m in messages if m["type"] == "update" and "snapshot" in m["changed"]]
    assert replaced, "the walk's later, better pictures replace the first"
    for row in rows:
        assert row.snapshot is not None, row
        assert box_.snapshots.path_of(row.snapshot, "door") is not None, (row.type, row.snapshot)


def test_queries_filter_and_page_newest_first(tmp_path: Path) -> None:
    box_ = open_box(tmp_path)
    first_end = walk(box_, "door", start=time.time() - 100)
    walk(box_, "yard", start=time.time() - 50)
    index = box_.index
    everything = index.query(limit=500)
    assert [r.id for r in everything] == sorted((r.id for r in everything), reverse=True)
    assert {r.pipeline for r in index.query(pipeline="yard", limit=500)} == {"yard"}
    assert {r.type for r in index.query(zone="counter", limit=500)} == {"enter", "dwell", "exit"}
    assert {(r.type, r.line) for r in index.query(line="gate", limit=500)} == {("cross", "gate")}
    assert {r.label for r in index.query(label="car", limit=500)} == {"car"}
    assert {r.type for r in index.query(type="cross", pipeline="door")} == {"cross"}
    assert all(r.pipeline == "door" for r in index.query(until=first_end + 0.001, limit=500))
    assert all(r.pipeline == "yard" for r in index.query(since=first_end + 1, limit=500))
    # Paging: each page's last id is the next page's cursor; the pages together are everything.
    pages, cursor = [], None
    for _ in range(100):
        page = index.query(before=cursor, limit=7)
        if not page:
            break
        pages += page
        cursor = page[-1].id
    assert pages == everything
    assert index.newest() == everything[0].id
    assert index.newest(pipeline="door") == index.query(pipeline="door", limit=1)[0].id
    assert index.choices() == {
        "pipeline": ["door", "yard"],
        "zone": ["counter"],
        "line": ["gate"],
        "label": ["car", "person"],
        "type": sorted({r.type for r in everything}),
    }
    with pytest.raises(TypeError):
        index.query(camera="x")  # a filter there is no column for


def test_a_restart_reopens_the_index_and_goes_on(tmp_path: Path) -> None:
    box_ = open_box(tmp_path)
    walk(box_)
    before = box_.index.query(limit=500)
    box_.index.close()
    box_.outbox.close()
    again = open_box(tmp_path)
    assert again.index.query(limit=500) == before
    walk(again)
    after = again.index.query(limit=500)
    assert len(after) == 2 * len(before) and after[len(before)] == before[0]
    assert min(r.id for r in after[: len(before)]) > before[0].id  # ids go on, never reused


def flood(index: EventIndex, count: int, at: float, pipeline: str = "door") -> None:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(at))
    for i in range(count):
        index.add(
            [
                {
                    "pipeline": pipeline,
                    "seq": i,
                    "type": "cross",
                    "at": iso,
                    "line": "gate",
                    "object": {"id": i},
                }
            ]
        )


def test_retention_prunes_by_rows_and_age_in_batches(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    index = EventIndex(path, max_rows=100, prune_every=40)
    flood(index, 119, time.time())
    assert index.count() == 119  # over max_rows: no prune at each insert, only every 40 adds
    flood(index, 1, time.time())
    assert index.count() == 100  # the 120th add: the oldest went
    assert [r.seq for r in index.query(limit=500)][-1] == 20
    index.close()
    # Rows older than max_age_s go at the next open (and at each prune).
    old = EventIndex(path, max_age_s=3600)
    flood(old, 5, time.time() - 7200, pipeline="old")
    assert old.count() == 105
    old.close()
    reopened = EventIndex(path, max_age_s=3600)
    assert reopened.count() == 100 and reopened.choices()["pipeline"] == ["door"]


def test_a_damaged_index_is_moved_aside_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "events.db").write_bytes(b"this is no database " * 400)
    caplog.set_level(logging.WARNING, "agent.event_index")
    box_ = open_box(tmp_path)
    assert box_.index.problem is None
    assert "is damaged" in caplog.text and "events.db.corrupt" in caplog.text
    assert (tmp_path / "events.db.corrupt").read_bytes().startswith(b"this is no database")
    walk(box_)
    assert len(box_.index.query(limit=500)) == len([m for m in box_.messages() if m["type"] != "update"])


def test_an_unusable_index_is_logged_once_and_the_events_still_reach_the_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "agent.event_index")
    (tmp_path / "events.db").mkdir()  # no file can be made there
    box_ = open_box(tmp_path)
    assert box_.index.problem is not None and "events.db" in box_.index.problem
    walk(box_)
    assert {"new", "enter", "cross", "end"} <= {m["type"] for m in box_.messages()}
    with pytest.raises(sqlite3.Error):
        box_.index.query()
    assert len([r for r in caplog.records if r.name == "agent.event_index"]) == 1


def test_a_write_that_fails_is_counted_logged_once_and_costs_no_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "agent.event_index")
    box_ = open_box(tmp_path)
    with sqlite3.connect(tmp_path / "events.db") as other:  # the table gone behind the writer's back
        other.execute("DROP TABLE events")
    walk(box_)
    messages = box_.messages()
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))  # every event, no gap
    assert box_.index.errors > 1
    failures = [r for r in caplog.records if "cannot index events" in r.getMessage()]
    assert len(failures) == 1


def test_the_index_file_is_private(tmp_path: Path) -> None:
    EventIndex(tmp_path / "events.db").close()
    assert (tmp_path / "events.db").stat().st_mode & 0o077 == 0
