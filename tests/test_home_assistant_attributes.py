"""A pipeline with attributes (second models on its objects) in Home Assistant and on its state topics
(agent/home_automation/views.py, docs/integrations.md): per zone and per line a sensor with the last
value read (zone/<zone>/last/<attribute>, line/<line>/last/<attribute>: the last plate through the
gate), and its snapshots carry what was read on the object (agent/snapshots.py: the JPEG's metadata,
which the Home Assistant image is).

End to end on a real mosquitto: a real scene (agent/processing/scene.py) stepped frame by frame as the
pipeline steps it, answers put on its objects as the attributes step puts them (`Scene.set_attribute`),
through the agent's own result writer, outbox, MQTT connection and HomeAutomation; a plain paho client
as Home Assistant."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import SnapshotRetentionConfig
from agent.home_automation import (
    PipelineView,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.processing.scene import Scene
from agent.results import Result
from agent.snapshots import SnapshotStore
from tests.ha_fixtures import CONFIG_TOPIC, Recorder, config_of, home_rig
from tests.ha_schema import check_device_discovery, unique_ids
from tests.media_fixtures import astronaut_bgr
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

W, H = 1000, 1000
FPS = 10.0
DEVICE_ID = "box-1"
PIPELINE = "gate-cam"
STATE = f"edge/{DEVICE_ID}/state/{PIPELINE}"

BAY = {"name": "bay", "units": "pixels", "points": [[0, 500], [500, 500], [500, 1000], [0, 1000]]}
GATE = {"name": "gate", "units": "pixels", "points": [[600, 0], [600, 1000]]}  # `in`: moving east
ATTRIBUTES = [
    {
        "name": "direction",
        "model": {"path": "/cls.onnx"},
        "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
    },
    {"name": "text", "model": {"path": "/rec.onnx"}, "postprocess": {"type": "ctc"}},
    {"name": "face", "model": {"path": "/emb.onnx"}, "postprocess": {"type": "embedding"}},
]


def gate_cam(**extra: Any) -> dict[str, Any]:
    return {
        "name": PIPELINE,
        "model": {"path": "/det.onnx"},
        "source": {"type": "video", "uri": "/cam.mp4"},
        "postprocess": {"type": "detection", "labels": ["plate"]},
        "zones": [BAY],
        "lines": [GATE],
        "attributes": ATTRIBUTES,
        "track": {"snapshots": {"enabled": True, "interval_s": 0}},
        "report": {"results": False},
        **extra,
    }


def test_each_zone_and_line_has_a_last_value_sensor_per_attribute_but_embeddings(tmp_path: Path) -> None:
    config = config_of(tmp_path, [gate_cam()], home_assistant={"enabled": True})
    identity = identity_of(config)
    payload = discovery_payload(
        identity, discovery_components([PipelineView.of(p) for p in config.pipelines], identity, "edge"), {}
    )
    assert check_device_discovery(CONFIG_TOPIC, payload) == []
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids))
    last = {cid: c for cid, c in payload["cmps"].items() if "__last__" in cid}
    assert {cid: (c["p"], c["name"], c["state_topic"]) for cid, c in last.items()} == {
        f"{PIPELINE}__zone__bay__last__direction": ("sensor", f"{PIPELINE} zone bay last direction",
                                                    f"{STATE}/zone/bay/last/direction"),
        f"{PIPELINE}__zone__bay__last__text": ("sensor", f"{PIPELINE} zone bay last text",
                                               f"{STATE}/zone/bay/last/text"),
        f"{PIPELINE}__line__gate__last__direction": ("sensor", f"{PIPELINE} line gate last direction",
                                                     f"{STATE}/line/gate/last/direction"),
        f"{PIPELINE}__line__gate__last__text": ("sensor", f"{PIPELINE} line gate last text",
                                                f"{STATE}/line/gate/last/text"),
    }  # fmt: skip
    # Text, not a measurement: no state class or unit (Home Assistant would refuse "KX42 BRT").
    assert all("state_class" not in c and "unit_of_measurement" not in c for c in last.values())
    # A line whose direction is named "last" counts per label on line/<name>/last/<label>: an attribute
    # named like one of those labels would share its topic, and has no sensor there.
    clash = gate_cam(lines=[{**GATE, "out": "last", "labels": ["plate"]}])
    clash["attributes"] = [*ATTRIBUTES, {**ATTRIBUTES[0], "name": "plate"}]
    view = PipelineView.of(config_of(tmp_path, [clash]).pipelines[0])
    assert view.tracking is not None
    assert view.tracking.lines[0].attributes == ("direction", "text")
    assert view.tracking.zones[0].attributes == ("direction", "text", "plate")
    # Without attributes, none of it.
    plain = PipelineView.of(config_of(tmp_path, [gate_cam(attributes=[])]).pipelines[0])
    assert not any("__last__" in cid for cid in discovery_components([plain], identity, "edge"))


def box(cx: float, bottom: float, score: float = 0.9) -> dict[str, Any]:
    return {"box": [cx - 30, bottom - 120, cx + 30, bottom], "score": score, "label": "plate"}


def read(scene: Scene, track_id: int, name: str, value: Any, score: float = 0.97) -> None:
    answer = {"value": value, "score": score, "at": "2026-11-29T07:00:00.000Z", "runs": 1}
    assert scene.set_attribute(track_id, name, answer)


def frames() -> Iterator[tuple[list[dict[str, Any]], str | None]]:
    """(boxes, what is read after the frame): plate A (bottom 800) starts in the bay and drives east out
    of it and across the gate, read on its way; plate B (bottom 650) does the same later, read only
    after it crossed; then A is read again, no longer the last one through either."""
    for i in range(45):  # A: x 200 -> 640, its score rising once read (a better snapshot)
        yield [box(200 + 10 * i, 800, 0.7 if i < 5 else 0.95)], "A" if i == 2 else None
    for i in range(20):  # B: x 450 -> 640; A waits past the gate
        yield [box(650, 800, 0.95), box(450 + 10 * i, 650)], None
    yield [box(650, 800, 0.95), box(650, 650)], "B"
    yield [box(650, 800, 0.95), box(650, 650)], "A again"
    yield [box(650, 800, 0.95), box(650, 650)], None


def test_a_real_broker_gets_the_last_value_through_each_zone_and_line_and_snapshots_carry_them(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    rig = home_rig(tmp_path, mosquitto, DEVICE_ID, [gate_cam()])
    config, conn, home, writer, snapshots = rig.config, rig.conn, rig.home, rig.writer, rig.snapshots
    ha = Recorder(mosquitto, "homeassistant/#", f"{STATE}/#")
    pipeline = config.pipelines[0]
    tracking = pipeline.tracking
    assert tracking is not None
    scene = Scene(tracking, pipeline.zones, pipeline.lines)
    frame = cv2.resize(astronaut_bgr(), (W, H))
    taken: dict[int, str] = {}  # track id -> its newest snapshot id
    try:
        conn.start()
        wait_until(lambda: conn.connected, "connected", state=conn.stats)
        home.tick()
        wait_until(lambda: ha.on(f"homeassistant/device/{DEVICE_ID}/config"), "the discovery config")
        start = time.time()
        ids: dict[str, int] = {}
        for i, (boxes, then) in enumerate(frames()):
            at = start + i / FPS
            scene.step(boxes, at, W, H)  # (the track step)
            for wanted in scene.snapshots_wanted():
                snapshot_id = writer.save_snapshot(PIPELINE, wanted, frame, at, tracking.snapshots)
                assert snapshot_id is not None
                taken[wanted.track_id] = snapshot_id
                scene.snapshot_taken(wanted.track_id, snapshot_id, wanted.quality, at)
            for entry in boxes:  # A is the one at the bottom, B the one above it
                if entry["track_id"] is not None:
                    ids.setdefault("A" if entry["box"][3] == 800 else "B", entry["track_id"])
            if then == "A":
                read(scene, ids["A"], "text", "KX42 BRT")
            elif then == "B":
                read(scene, ids["B"], "text", "AB 123")
                read(scene, ids["B"], "direction", "180", 0.88)
                read(scene, ids["B"], "face", [0.6, 0.8])  # an embedding: no sensor
            elif then == "A again":
                read(scene, ids["A"], "text", "KX42 BRX")
            events = scene.take_events()  # (the attributes step's, at the frame's end)
            if events:
                writer.submit(
                    Result(
                        pipeline=PIPELINE, captured_at=at, model={}, backend="onnxruntime/CPU",
                        precision="fp32", latency_ms={}, source={}, output={"detections": boxes}, held_back=0,
                        events=events, publish=False, scene=scene.summary(),
                    )
                )  # fmt: skip
        assert scene.summary()["lines"]["gate"]["in"] == 2

        def last(key: str) -> list[bytes]:
            return ha.on(f"{STATE}/{key}")

        wait_until(lambda: last("line/gate/last/direction"), "B's direction through the gate")
        # A was read in the bay (after it entered) and carried its text across the gate; B crossed
        # unread, then was read: its text replaces A's. A's late reading changes neither: B went later.
        assert last("zone/bay/last/text") == [b"KX42 BRT", b"AB 123"]
        assert last("line/gate/last/text") == [b"KX42 BRT", b"AB 123"]
        assert last("zone/bay/last/direction") == last("line/gate/last/direction") == [b"180"]
        assert not ha.matching(f"{STATE}/+/+/last/face")
        # The snapshots: A's best, taken once its text was read, has it in its metadata (the file
        # as saved, and the Home Assistant image, which is that file).
        a_file = snapshots.path_of(taken[ids["A"]], PIPELINE)
        assert a_file is not None
        a_jpeg = a_file.read_bytes()
        assert b'"attributes": {"text": {"value": "KX42 BRT"' in a_jpeg
        wait_until(lambda: a_jpeg in last("snapshot/plate"), "A's snapshot as the plate image")
        again = SnapshotStore(tmp_path / "state" / "snapshots", SnapshotRetentionConfig())
        kept = again.get(PIPELINE, taken[ids["A"]])
        assert kept is not None and kept.attributes["text"]["value"] == "KX42 BRT"
        assert kept.attributes["text"]["score"] == pytest.approx(0.97)
    finally:
        ha.close()
        rig.close()
    # Retained: a Home Assistant that starts now gets the last plate through the gate.
    late = Recorder(mosquitto, f"{STATE}/+/+/last/#")
    try:
        wait_until(lambda: len(late.messages) == 4, "the retained last values", state=lambda: late.messages)
        assert sorted((t.removeprefix(STATE + "/"), p, retained) for t, p, retained in late.messages) == [
            ("line/gate/last/direction", b"180", True), ("line/gate/last/text", b"AB 123", True),
            ("zone/bay/last/direction", b"180", True), ("zone/bay/last/text", b"AB 123", True),
        ]  # fmt: skip
    finally:
        late.close()


def test_a_snapshots_caption_names_what_was_read(tmp_path: Path) -> None:
    """The same object's snapshot with and without a reading: the pictures differ only in the caption
    strip above its box, which the reading makes longer (`plate #7 | text: KX42 BRT`)."""
    store = SnapshotStore(tmp_path / "snapshots", SnapshotRetentionConfig())
    frame = cv2.resize(astronaut_bgr(), (640, 480))
    box = [200.0, 200.0, 300.0, 260.0]
    answer = {"text": {"value": "KX42 BRT", "score": 0.97, "at": "2026-11-29T07:00:00.000Z", "runs": 1}}
    pictures = []
    for attributes in (None, answer):
        saved = store.save(PIPELINE, 7, "plate", frame, box, quality=95, crop=False, captured_at=1.0,
                           attributes=attributes)  # fmt: skip
        pictures.append(cv2.imread(str(saved.path)).astype(int))
        assert saved.attributes == (attributes or {})
    changed = np.argwhere(np.abs(pictures[0] - pictures[1]).max(axis=2) > 48)
    assert len(changed) > 100  # the reading's words
    (top, left), (bottom, right) = changed.min(axis=0), changed.max(axis=0)
    # Above the box's top edge (JPEG's 8x8 blocks blur a little either side), from its left edge on
    # and past its right one: the longer words.
    assert top >= 160 and bottom <= 200 + 8 and left >= 200 - 8 and right > 300, (top, bottom, left, right)
