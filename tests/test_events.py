"""agent/events.py: a tracking pipeline's events into the outbox (one numbered stream per pipeline),
and the journal that lets the next start end the tracks a killed agent left open."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from agent.config import SnapshotRetentionConfig, SnapshotsConfig
from agent.events import RESTARTED, EventWriter, TrackJournal
from agent.mqtt import Outbox
from agent.processing.scene import SnapshotWanted
from agent.results import Result, ResultWriter
from agent.snapshots import SnapshotStore
from tests.media_fixtures import astronaut_bgr


def new(track_id: int, label: str = "person") -> dict[str, Any]:
    obj = {"id": track_id, "label": label, "first_seen": "2026-11-27T10:00:00.000Z", "zones": []}
    return {"type": "new", "at": "2026-11-27T10:00:00.000Z", "object": obj}


def end(track_id: int, reason: str = "lost") -> dict[str, Any]:
    return {"type": "end", "at": "2026-11-27T10:00:05.000Z", "reason": reason, "object": {"id": track_id}}


def stored(outbox: Outbox) -> list[dict[str, Any]]:
    return [{"topic": row.topic, **json.loads(row.payload)} for row in outbox.peek(1000)]


def test_events_are_numbered_per_pipeline_on_their_own_topic(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    writer = EventWriter("box-7", "edge", outbox, TrackJournal(tmp_path / "tracks"))
    assert writer.write("door", [new(1), new(2)]) == 2
    assert writer.write("yard", [new(1)]) == 1
    assert writer.write("door", [end(1)]) == 1
    messages = stored(outbox)
    assert [(m["topic"], m["seq"], m["type"]) for m in messages] == [
        ("edge/box-7/events/door", 1, "new"),
        ("edge/box-7/events/door", 2, "new"),
        ("edge/box-7/events/yard", 1, "new"),
        ("edge/box-7/events/door", 3, "end"),
    ]
    assert all(m["device"] == "box-7" for m in messages) and len({m["id"] for m in messages}) == 4
    assert messages[0]["object"]["id"] == 1 and messages[3]["reason"] == "lost"


def test_a_restart_ends_the_open_tracks_once_and_ids_go_on(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    journal_dir = tmp_path / "tracks"
    writer = EventWriter("box-7", "edge", outbox, TrackJournal(journal_dir))
    writer.write("door", [new(7), new(8), new(9, "car")])
    writer.write("door", [end(8)])
    # The agent is killed here: a new process reads the journal.
    again = EventWriter("box-7", "edge", outbox, TrackJournal(journal_dir))
    assert again.recover("door") == 10  # ids go on after the highest ever opened
    ends = [m for m in stored(outbox) if m["type"] == "end" and m["reason"] == RESTARTED]
    assert sorted(m["object"]["id"] for m in ends) == [7, 9]
    assert {m["object"]["label"] for m in ends} == {"person", "car"}
    assert [m["seq"] for m in stored(outbox)] == [1, 2, 3, 4, 5, 6]  # one stream, no gap
    # Ended once: a second start finds nothing open.
    third = EventWriter("box-7", "edge", outbox, TrackJournal(journal_dir))
    assert third.recover("door") == 10
    assert len(stored(outbox)) == 6
    assert third.recover("elsewhere") == 1  # a pipeline with no journal starts at 1


def test_a_damaged_journal_is_an_empty_one_and_said_in_the_log(tmp_path: Path, caplog: Any) -> None:
    journal_dir = tmp_path / "tracks"
    journal_dir.mkdir()
    (journal_dir / "door.json").write_text('{"next_id": 5, "open": [{"id": ')  # cut off
    caplog.set_level(logging.WARNING, logger="agent.events")
    writer = EventWriter("box-7", "edge", Outbox(tmp_path / "outbox.sqlite"), TrackJournal(journal_dir))
    assert writer.recover("door") == 1
    assert "cannot read its open tracks" in caplog.text and "door.json" in caplog.text


def test_the_result_writer_sends_a_frames_events_even_when_its_result_is_off(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    written: list[int] = []
    events = EventWriter("box-7", "edge", outbox, TrackJournal(tmp_path / "tracks"))
    scenes: list[tuple[str, Any, Any]] = []
    writer = ResultWriter(
        "box-7",
        "edge",
        262_144,
        outbox,
        lambda: written.append(1),
        events=events,
        scene_observer=lambda pipeline, summary, evs: scenes.append((pipeline, summary, evs)),
    )
    result = Result(
        pipeline="door",
        captured_at=1_763_800_000.0,
        model={"name": "m", "version": "1", "sha256": "0" * 64},
        backend="onnxruntime:CPUExecutionProvider",
        precision="fp32",
        latency_ms={"inference": 1.0},
        source={"uri": "file:clip.mp4", "frame": 1},
        output={"detections": []},
        held_back=0,
        events=[new(1)],
        publish=False,
        scene={"tracks": 1, "zones": {}, "lines": {}},
    )
    writer.submit(result)
    assert [m["topic"] for m in stored(outbox)] == ["edge/box-7/events/door"]
    assert written == [1] and scenes == [("door", {"tracks": 1, "zones": {}, "lines": {}}, [new(1)])]


def test_a_restarts_end_describes_the_object_as_its_last_update_did(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    writer = EventWriter("box-7", "edge", outbox, TrackJournal(tmp_path / "tracks"))
    writer.write("door", [new(3)])
    moved = {**new(3)["object"], "zones": ["dock"], "entered_zones": ["dock"], "crossings_total": 1}
    writer.write(
        "door", [{"type": "enter", "zone": "dock"}, {"type": "update", "changed": ["zones"], "object": moved}]
    )
    EventWriter("box-7", "edge", outbox, TrackJournal(tmp_path / "tracks")).recover("door")
    end = stored(outbox)[-1]
    assert (end["type"], end["reason"]) == ("end", RESTARTED)
    assert end["object"]["zones"] == ["dock"] and end["object"]["crossings_total"] == 1


def test_an_object_keeps_one_snapshot_its_best(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", SnapshotRetentionConfig())
    pictures: list[tuple[str, str, bytes]] = []
    writer = ResultWriter(
        "box-7",
        "edge",
        262_144,
        Outbox(tmp_path / "outbox.sqlite"),
        lambda: None,
        snapshots=store,
        snapshot_observer=lambda pipeline, label, jpeg: pictures.append((pipeline, label, jpeg)),
    )
    frame, config = astronaut_bgr(), SnapshotsConfig(enabled=True)
    first = writer.save_snapshot(
        "door", SnapshotWanted(1, "person", [173, 82, 274, 180], 10.0), frame, 1.0, config
    )
    assert first is not None and store.path_of(first, "door") is not None
    better = SnapshotWanted(1, "person", [170, 80, 280, 185], 20.0, replaces=first)
    second = writer.save_snapshot("door", better, frame, 2.0, config)
    assert second is not None and second != first
    assert store.path_of(first, "door") is None and store.path_of(second, "door") is not None
    assert sorted(p.name for p in (tmp_path / "snapshots" / "door").iterdir()) == [f"{second}.jpg"]
    assert [(p, label) for p, label, _ in pictures] == [("door", "person")] * 2
    assert pictures[-1][2] == (tmp_path / "snapshots" / "door" / f"{second}.jpg").read_bytes()
