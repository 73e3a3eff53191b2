"""A tracking pipeline's state topics and Home Assistant entities (agent/home_automation/,
docs/integrations.md "Tracking"): zone occupancy, dwelling and overcrowding, line counters, the
objects tracked, the snapshots.

- The discovery config for zones, lines and snapshots, checked against Home Assistant's discovery
  schema (tests/ha_schema.py).
- The state topics, on the interface the daemon publishes through, driven by a real scene
  (agent/processing/scene.py: the tracker, the zones and the line) frame by frame as the pipeline
  drives it: each value on change only; a zone removed by a reload leaves discovery and has its
  retained state cleared; the snapshots, per label, bounded by the broker's limit, kept across a
  restart while snapshots stay on.
- End to end: the scene through the agent's own result writer (its event writer, snapshot store and
  the hooks the daemon wires), outbox and MQTT connection to a real mosquitto, plain paho clients as
  Home Assistant and Node-RED: the retained discovery config and state, the snapshot JPEGs as saved,
  and docs/integrations.md's Node-RED flow and Home Assistant automation (its trigger topic and its
  condition, parsed out of the page) over the events that arrived.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.home_automation import (
    MEMORY_FILE,
    HomeAutomation,
    PipelineView,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.mqtt import events_topic
from agent.processing.drawing import encode_jpeg
from agent.processing.scene import Scene
from agent.results import Result
from tests.ha_fixtures import (
    CONFIG_TOPIC,
    Holder,
    Link,
    Recorder,
    Router,
    config_of,
    doc_block,
    home_rig,
    msg_get,
    run_flow,
)
from tests.ha_schema import check_device_discovery, entity_topics, unique_ids
from tests.media_fixtures import astronaut_bgr
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

W, H = 1000, 1000  # the frames' size (the zones and the line are in pixels of it)
FPS = 10.0
STATE = "edge/box-1/state/dock"


def loading_bay(**extra: Any) -> dict[str, Any]:
    """The lower left quarter; a dwell of 2 s and room for one object unless `extra` says otherwise."""
    zone = {
        "name": "loading-bay",
        "units": "pixels",
        "points": [[0, 500], [500, 500], [500, 1000], [0, 1000]],
    }
    return {**zone, "dwell_s": 2, "max_objects": 1, **extra}


OFFICE = {"name": "office", "units": "pixels", "points": [[600, 0], [1000, 0], [1000, 400], [600, 400]]}
# Vertical at x = 600, drawn downwards: `east` (right side to left of the walker) is moving east.
GATE = {"name": "gate", "units": "pixels", "points": [[600, 0], [600, 1000]], "in": "east", "out": "west"}


def tracker(
    name: str = "dock",
    zones: list[dict[str, Any]] | None = None,
    lines: list[dict[str, Any]] | None = None,
    snapshots: bool = True,
) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "/y.onnx"},
        "source": {"type": "video", "uri": "/cam.mp4"},
        "postprocess": {"type": "detection", "labels": ["person", "forklift", "dog/cat"]},
        "zones": [loading_bay(), OFFICE] if zones is None else zones,
        "lines": [GATE] if lines is None else lines,
        "track": {"snapshots": {"enabled": snapshots}},
    }


def box(cx: float, bottom: float, label: str = "person", size: float = 60) -> dict[str, Any]:
    """A detection whose bottom centre (the zones' and the line's anchor) is (cx, bottom)."""
    return {"box": [cx - size / 2, bottom - 2 * size, cx + size / 2, bottom], "score": 0.9, "label": label}


def story() -> Iterator[list[dict[str, Any]]]:
    """A person walks into the loading bay and stays past its dwell; a forklift comes into the bay
    (overcrowding it), drives out east across the gate and stays in view; the person goes (its track
    ends, max_lost_s later)."""
    yield from ([box(200, 800)] for _ in range(30))
    yield from ([box(200, 800), box(350 + 25 * i, 800, "forklift")] for i in range(23))
    yield from ([box(900, 800, "forklift")] for _ in range(15))


def scene_for(pipeline: PipelineConfig) -> Scene:
    tracking = pipeline.tracking
    assert tracking is not None
    return Scene(tracking, pipeline.zones, pipeline.lines)


def short(sent: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The topics under state/dock/, shortened to the levels below it."""
    assert all(t.startswith(STATE + "/") for t, _ in sent), sent
    return [(t.removeprefix(STATE + "/"), p) for t, p in sent]


SEEDED = [
    ("line/gate/east", b"0"),
    ("line/gate/west", b"0"),
    ("tracks", b"0"),
    ("zone/loading-bay/count", b"0"),
    ("zone/loading-bay/dwelling", b"OFF"),
    ("zone/loading-bay/overcrowded", b"OFF"),
    ("zone/office/count", b"0"),
]


# --- the discovery config -----------------------------------------------------------------------------


def test_zones_lines_and_the_snapshot_fit_home_assistants_schema(tmp_path: Path) -> None:
    config = config_of(tmp_path, [tracker()], home_assistant={"enabled": True})
    views = [PipelineView.of(p) for p in config.pipelines]
    identity = identity_of(config)
    components = discovery_components(views, identity, "edge")
    payload = discovery_payload(identity, components, {"dock__zone__yard__count": "sensor"})
    assert check_device_discovery(CONFIG_TOPIC, payload) == []
    cmps = payload["cmps"]
    tracking = {
        "dock__tracks": ("sensor", "dock tracks", "tracks"),
        "dock__zone__loading-bay__count": ("sensor", "dock zone loading-bay count", "zone/loading-bay/count"),
        "dock__zone__loading-bay__dwelling": (
            "binary_sensor", "dock zone loading-bay dwelling", "zone/loading-bay/dwelling"
        ),
        "dock__zone__loading-bay__overcrowded": (
            "binary_sensor", "dock zone loading-bay overcrowded", "zone/loading-bay/overcrowded"
        ),
        "dock__zone__office__count": ("sensor", "dock zone office count", "zone/office/count"),
        "dock__zone__loading-bay__stayed_s": (
            "sensor", "dock zone loading-bay last stay", "zone/loading-bay/stayed_s"
        ),
        "dock__zone__loading-bay__mean_stayed_s": (
            "sensor", "dock zone loading-bay mean stay", "zone/loading-bay/mean_stayed_s"
        ),
        "dock__zone__office__stayed_s": ("sensor", "dock zone office last stay", "zone/office/stayed_s"),
        "dock__zone__office__mean_stayed_s": (
            "sensor", "dock zone office mean stay", "zone/office/mean_stayed_s"
        ),
        "dock__line__gate__east": ("sensor", "dock line gate east", "line/gate/east"),
        "dock__line__gate__west": ("sensor", "dock line gate west", "line/gate/west"),
        "dock__snapshot": ("image", "dock snapshot", "snapshot"),
    }  # fmt: skip
    # A detection pipeline's count, its fps and backend, the box's own two, the removal.
    assert set(cmps) == {
        *tracking, "dock__count", "dock__fps", "dock__backend", "_device__online", "_device__outbox_pending",
        "dock__zone__yard__count",
    }  # fmt: skip
    for cid, (platform, name, key) in tracking.items():
        topic_key = "image_topic" if platform == "image" else "state_topic"
        assert cmps[cid]["p"] == platform and cmps[cid]["name"] == name, cid
        assert cmps[cid][topic_key] == f"{STATE}/{key}" and cmps[cid]["qos"] == 1, cid
        assert cmps[cid]["unique_id"] == f"edge-agent__box-1__{cid}"
    # An office with neither dwell_s nor max_objects has no binary sensors.
    assert not any(cid.startswith("dock__zone__office__") and cid.endswith(("dwelling", "overcrowded"))
                   for cid in cmps)  # fmt: skip
    assert cmps["dock__zone__loading-bay__count"]["state_class"] == "measurement"
    assert cmps["dock__tracks"]["state_class"] == "measurement"
    # Crossings since the agent started: total_increasing (a restart's 0 is a reset to Home Assistant).
    assert {cmps[f"dock__line__gate__{d}"]["state_class"] for d in ("east", "west")} == {"total_increasing"}
    assert cmps["dock__zone__loading-bay__dwelling"]["device_class"] == "occupancy"
    assert cmps["dock__zone__loading-bay__overcrowded"]["device_class"] == "problem"
    assert (
        cmps["dock__snapshot"]["content_type"] == "image/jpeg" and "state_topic" not in cmps["dock__snapshot"]
    )
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids)) == 17
    assert f"{STATE}/snapshot" in entity_topics(payload)["state"]
    # Without snapshots, no image; without tracking, none of it.
    plain = config_of(tmp_path, [tracker(snapshots=False, zones=[], lines=[GATE])])
    cids = set(discovery_components([PipelineView.of(plain.pipelines[0])], identity, "edge"))
    basic = {"dock__count", "dock__fps", "dock__backend", "_device__online", "_device__outbox_pending"}
    assert cids - basic == {"dock__tracks", "dock__line__gate__east", "dock__line__gate__west"}
    untracked = {**tracker(zones=[], lines=[]), "track": None}
    view = PipelineView.of(config_of(tmp_path, [untracked]).pipelines[0])
    assert view.tracking is None
    assert set(discovery_components([view], identity, "edge")) == {
        "dock__count", "dock__fps", "dock__backend", "_device__online", "_device__outbox_pending"
    }  # fmt: skip


def test_events_only_pipelines_have_no_result_entities_and_refuse_watched_labels(tmp_path: Path) -> None:
    quiet = {**tracker(snapshots=False, zones=[], lines=[GATE]), "report": {"results": False}}
    config = config_of(tmp_path, [quiet])
    identity = identity_of(config)
    view = PipelineView.of(config.pipelines[0])
    cids = set(discovery_components([view], identity, "edge"))
    assert "dock__count" not in cids  # it would follow results that are never published
    assert {"dock__tracks", "dock__line__gate__east", "dock__fps"} <= cids
    watched = {**quiet, "home_automation": {"watch": ["person"]}}
    with pytest.raises(ValidationError, match=r"home_automation.watch follows the published results"):
        config_of(tmp_path, [watched])


def test_component_ids_stay_unique_when_names_clash(tmp_path: Path) -> None:
    """A zone named like a line's direction level, a dotted name: ids stay unique and valid."""
    zones = [{**OFFICE, "name": "a.b"}, {**loading_bay(), "name": "a_b"}]
    lines = [{**GATE, "name": "count"}]
    config = config_of(tmp_path, [tracker(zones=zones, lines=lines)], home_assistant={"enabled": True})
    identity = identity_of(config)
    payload = discovery_payload(
        identity, discovery_components([PipelineView.of(config.pipelines[0])], identity, "edge"), {}
    )
    assert check_device_discovery(CONFIG_TOPIC, payload) == []
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", cid) for cid in payload["cmps"])
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids))
    topics = {c.get("state_topic") for c in payload["cmps"].values()}
    assert {f"{STATE}/zone/a.b/count", f"{STATE}/zone/a_b/count", f"{STATE}/line/count/east"} <= topics


# --- the state topics, driven by a real scene -------------------------------------------------------------


def test_the_scene_drives_the_state_topics_on_change_only(tmp_path: Path) -> None:
    home, link, _, wanted = home_for_tracker(tmp_path, state_topics={"enabled": True})
    home.tick()
    assert sorted(short(link.take())) == SEEDED  # what a new scene has, once the pipeline runs
    home.tick()
    assert link.take() == []

    scene = scene_for(config_of(tmp_path, wanted).pipelines[0])
    published: dict[str, list[bytes]] = {k: [v] for k, v in SEEDED}
    moments: list[tuple[str, list[tuple[str, bytes]]]] = []  # (the frame's events, what it published)
    for i, boxes in enumerate(story()):
        scene.step(boxes, 1000.0 + i / FPS, W, H)
        events = scene.take_events()
        if events:  # as the pipeline: its summary after each frame with events
            home.observe_scene("dock", scene.summary(), events)
        sent = short(link.take())
        if not events:
            assert sent == [], i
            continue
        for topic, payload in sent:
            published.setdefault(topic, []).append(payload)
        kinds = " ".join(
            f"{e['type']}:{e.get('zone') or e.get('line') or e['object']['label']}" for e in events
        )
        moments.append((kinds, sorted(sent)))
    assert moments == [
        ("new:person enter:loading-bay", [("tracks", b"1"), ("zone/loading-bay/count", b"1")]),
        ("dwell:loading-bay", [("zone/loading-bay/dwelling", b"ON")]),
        (
            "new:forklift enter:loading-bay overcrowded:loading-bay",
            [("tracks", b"2"), ("zone/loading-bay/count", b"2"), ("zone/loading-bay/overcrowded", b"ON")],
        ),
        (
            "exit:loading-bay overcrowded:loading-bay update:forklift",
            [
                ("zone/loading-bay/count", b"1"), ("zone/loading-bay/mean_stayed_s", b"0.6"),
                ("zone/loading-bay/overcrowded", b"OFF"), ("zone/loading-bay/stayed_s", b"0.6"),
            ],
        ),
        ("cross:gate update:forklift", [("line/gate/east", b"1")]),
        (
            "exit:loading-bay end:person",
            [
                ("tracks", b"1"), ("zone/loading-bay/count", b"0"), ("zone/loading-bay/dwelling", b"OFF"),
                ("zone/loading-bay/mean_stayed_s", b"3.4"), ("zone/loading-bay/stayed_s", b"6.2"),
            ],
        ),
    ]  # fmt: skip
    # On change only: no topic got the value it already had.
    for topic, payloads in published.items():
        assert all(a != b for a, b in itertools.pairwise(payloads)), (topic, payloads)
    summary = scene.summary()
    assert summary["lines"] == {"gate": {"east": 1, "west": 0}} and summary["tracks"] == 1
    home.tick()
    assert link.take() == []


def home_for_tracker(
    tmp_path: Path, pipelines: list[dict[str, Any]] | None = None, **top: Any
) -> tuple[HomeAutomation, Link, Router, list[dict[str, Any]]]:
    """HomeAutomation on the recording link, the `dock` pipeline running."""
    wanted = pipelines if pipelines is not None else [tracker()]
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    link, router = Link(), Router()
    home = HomeAutomation(
        config_of(tmp_path, wanted, **top),
        link,
        wanted=lambda: config_of(tmp_path, wanted, **top).pipelines,
        running=lambda: [Holder(p["name"]) for p in wanted],
    )
    home.start(router)
    return home, link, router, wanted


def test_a_reload_that_removes_a_zone_removes_its_entities_and_clears_its_state(tmp_path: Path) -> None:
    home, link, _, wanted = home_for_tracker(tmp_path, home_assistant={"enabled": True})
    home.tick()
    sent = link.take()
    assert sent[0][0] == CONFIG_TOPIC and sorted(short(sent[1:])) == SEEDED
    assert check_device_discovery(CONFIG_TOPIC, json.loads(sent[0][1])) == []
    summary = {
        "tracks": 3, "started": 5, "ended": 2,
        "zones": {
            "loading-bay": {"count": 2, "labels": {"person": 2}, "dwelling": 1, "overcrowded": True},
            "office": {"count": 1, "labels": {"forklift": 1}, "dwelling": 0, "overcrowded": False},
        },
        "lines": {"gate": {"east": 4, "west": 1}},
    }  # fmt: skip
    home.observe_scene("dock", summary, [{"type": "enter", "zone": "office"}])
    assert sorted(short(link.take())) == [
        ("line/gate/east", b"4"), ("line/gate/west", b"1"), ("tracks", b"3"),
        ("zone/loading-bay/count", b"2"), ("zone/loading-bay/dwelling", b"ON"),
        ("zone/loading-bay/overcrowded", b"ON"), ("zone/office/count", b"1"),
    ]  # fmt: skip

    # The office goes; the gate is moved (a line keeps its counts); the loading bay stays as it was.
    wanted[0] = tracker(zones=[loading_bay()], lines=[{**GATE, "points": [[650, 0], [650, 1000]]}])
    home.tick()
    sent = link.take()
    config = json.loads(sent[0][1])
    assert sent[0][0] == CONFIG_TOPIC and check_device_discovery(CONFIG_TOPIC, config) == []
    assert config["cmps"]["dock__zone__office__count"] == {"p": "sensor"}
    assert "dock__zone__loading-bay__count" in config["cmps"] and "dock__line__gate__east" in config["cmps"]
    # Only the office's topic is cleared; what the scene keeps is not sent again.
    assert short(sent[1:]) == [("zone/office/count", b"")]
    memory = json.loads((tmp_path / "state" / MEMORY_FILE).read_text())
    assert f"{STATE}/zone/office/count" not in memory["state_topics"]
    assert memory["discovery"]["removed"] == {
        f"dock__zone__office__{key}": "sensor" for key in ("count", "stayed_s", "mean_stayed_s")
    }

    # The loading bay's edge moves: the scene keeps who is in it, and Home Assistant sees no change
    # (no 2 -> 0 -> 2: issue 34).
    moved = [[0, 400], [500, 400], [500, 1000], [0, 1000]]
    gate = {**GATE, "points": [[650, 0], [650, 1000]]}
    wanted[0] = tracker(zones=[loading_bay(points=moved)], lines=[gate])
    home.tick()
    assert link.take() == []
    # Its dwell goes too: the count and the crowding stay as they are, the dwelling sensor goes and
    # its topic is cleared.
    wanted[0] = tracker(zones=[loading_bay(dwell_s=None, points=moved)], lines=[gate])
    home.tick()
    sent = link.take()
    config = json.loads(sent[0][1])
    assert config["cmps"]["dock__zone__loading-bay__dwelling"] == {"p": "binary_sensor"}
    assert short(sent[1:]) == [("zone/loading-bay/dwelling", b"")]
    # A summary from before the change (a frame in flight) cannot bring back what went.
    home.observe_scene("dock", summary, [])
    assert link.take() == []
    home.tick()
    assert link.take() == []

    # Tracking off: every tracking topic is cleared and its entities removed.
    wanted[0] = {**tracker(zones=[], lines=[]), "track": None}
    home.tick()
    sent = link.take()
    config = json.loads(sent[0][1])
    gone = {cid: c for cid, c in config["cmps"].items() if "__zone__" in cid or "__line__" in cid}
    assert all(c == {"p": c["p"]} for c in gone.values()) and config["cmps"]["dock__tracks"] == {
        "p": "sensor"
    }
    assert sorted(short(sent[1:])) == [
        ("line/gate/east", b""), ("line/gate/west", b""), ("tracks", b""),
        ("zone/loading-bay/count", b""), ("zone/loading-bay/overcrowded", b""),
    ]  # fmt: skip


def jpeg(seed: int) -> bytes:
    image = cv2.resize(astronaut_bgr(), (256, 256))
    image[:16, :16] = seed  # a different picture per seed
    data = encode_jpeg(image, 80, 1 << 20)
    assert data is not None
    return data


def test_snapshots_per_label_within_the_brokers_limit_and_across_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home, link, _, wanted = home_for_tracker(tmp_path, state_topics={"enabled": True})
    person, forklift, other = jpeg(0), jpeg(100), jpeg(200)
    home.observe_snapshot("dock", "person", person)  # before the first tick: kept, published by it
    home.tick()
    sent = dict(short(link.take()))
    assert sent.pop("snapshot") == person and sent.pop("snapshot/person") == person
    assert sorted(sent.items()) == SEEDED
    home.observe_snapshot("dock", "forklift", forklift)
    assert short(link.take()) == [("snapshot", forklift), ("snapshot/forklift", forklift)]
    # A label that cannot be a topic level: only the pipeline's newest.
    home.observe_snapshot("dock", "dog/cat", other)
    assert short(link.take()) == [("snapshot", other)]
    # Too big for mqtt.max_payload_bytes: not published, said in the log.
    small = tracker()
    big, cut = home_for_tracker(
        tmp_path / "small", [small], state_topics={"enabled": True}, mqtt={"max_payload_bytes": 4096}
    )[:2]
    big.tick()
    cut.take()
    with caplog.at_level(logging.WARNING, logger="agent.home_automation"):
        big.observe_snapshot("dock", "person", person)
    assert cut.take() == [] and "snapshot does not fit mqtt.max_payload_bytes" in caplog.text
    tiny = encode_jpeg(np.zeros((16, 16, 3), np.uint8), 80, 2000)
    assert tiny is not None
    big.observe_snapshot("dock", "person", tiny)
    assert [t for t, _ in short(cut.take())] == ["snapshot", "snapshot/person"]

    # A restart: the last run's per-label snapshots stay retained (they are still the newest).
    again, link2, _, _ = home_for_tracker(tmp_path, wanted, state_topics={"enabled": True})
    again.tick()
    assert sorted(short(link2.take())) == SEEDED
    memory = json.loads((tmp_path / "state" / MEMORY_FILE).read_text())["state_topics"]
    assert {f"{STATE}/snapshot/person", f"{STATE}/snapshot/forklift"} <= set(memory)
    # Snapshots off: they are all cleared.
    wanted[0] = tracker(snapshots=False)
    again.tick()
    assert sorted(short(link2.take())) == [
        ("snapshot", b""),
        ("snapshot/forklift", b""),
        ("snapshot/person", b""),
    ]
    again.observe_snapshot("dock", "person", person)  # (a frame in flight): not published
    again.tick()
    assert link2.take() == []


# --- end to end: the agent's writer, outbox and connection, a real mosquitto -------------------------------

DEVICE_ID = "cam-01"  # docs/integrations.md's automation: a person entering dock-cam's loading bay
PIPELINE = "dock-cam"
E2E_STATE = f"edge/{DEVICE_ID}/state/{PIPELINE}"
E2E_CONFIG = f"homeassistant/device/{DEVICE_ID}/config"


def slugify(text: str) -> str:
    """Home Assistant's entity id from a name: lower case, runs of anything else as one `_`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def template_condition(template: str) -> list[tuple[str, str]]:
    """The (payload path, value) terms of `{{ trigger.payload_json.<path> == '<value>' and ... }}`;
    the test fails on anything else in it (what it does not understand, it cannot vouch for)."""
    body = re.fullmatch(r"\{\{\s*(.*?)\s*\}\}", template.strip(), re.S)
    assert body, template
    terms = []
    for term in re.split(r"\s+and\s+", body.group(1)):
        found = re.fullmatch(r"trigger\.payload_json\.([\w.]+) == '([^']*)'", term.strip())
        assert found, term
        terms.append((found.group(1), found.group(2)))
    return terms


def holds(terms: list[tuple[str, str]], event: dict[str, Any]) -> bool:
    try:
        return all(msg_get(event, path) == value for path, value in terms)
    except (KeyError, IndexError, TypeError):
        return False


def test_a_real_broker_gets_the_state_the_snapshots_and_the_events_and_the_docs_work(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    pipeline = {
        **tracker(PIPELINE, zones=[loading_bay(), OFFICE], lines=[GATE]),
        "report": {"results": False},
    }
    rig = home_rig(tmp_path, mosquitto, DEVICE_ID, [pipeline])
    config, conn, home, writer, snapshots = rig.config, rig.conn, rig.home, rig.writer, rig.snapshots
    ha = Recorder(mosquitto, "homeassistant/#", f"{E2E_STATE}/#")
    nodered = Recorder(mosquitto, "edge/+/events/+")
    try:
        conn.start()
        wait_until(lambda: conn.connected, "connected", state=conn.stats)
        home.tick()
        wait_until(lambda: ha.on(E2E_CONFIG), "the discovery config")
        discovery = json.loads(ha.on(E2E_CONFIG)[-1])
        assert check_device_discovery(E2E_CONFIG, discovery) == []
        snapshot_entity = discovery["cmps"][f"{PIPELINE}__snapshot"]
        assert snapshot_entity["image_topic"] == f"{E2E_STATE}/snapshot"

        # The pipeline's part (agent/pipeline.py Pipeline._track), frame by frame.
        pipeline_config = config.pipelines[0]
        tracking = pipeline_config.tracking
        assert tracking is not None
        scene = scene_for(pipeline_config)
        frame = cv2.resize(astronaut_bgr(), (W, H))
        start = time.time()
        taken: dict[str, str] = {}  # label -> its newest snapshot id
        for i, boxes in enumerate(story()):
            at = start + i / FPS
            scene.step(boxes, at, W, H)
            for wanted in scene.snapshots_wanted():
                snapshot_id = writer.save_snapshot(PIPELINE, wanted, frame, at, tracking.snapshots)
                assert snapshot_id is not None
                taken[wanted.label] = snapshot_id
                scene.snapshot_taken(wanted.track_id, snapshot_id, wanted.quality, at)
            events = scene.take_events()
            if events:
                writer.submit(
                    Result(
                        pipeline=PIPELINE, captured_at=at, model={}, backend="onnxruntime/CPU",
                        precision="fp32", latency_ms={}, source={}, output={"detections": boxes}, held_back=0,
                        events=events, publish=False, scene=scene.summary(),
                    )
                )  # fmt: skip
        assert set(taken) == {"person", "forklift"}

        # Home Assistant's view: every entity's topic has its value, as the scene counts.
        expected = {
            "tracks": b"1", "zone/loading-bay/count": b"0", "zone/loading-bay/dwelling": b"OFF",
            "zone/loading-bay/overcrowded": b"OFF", "zone/office/count": b"0",
            "line/gate/east": b"1", "line/gate/west": b"0",
        }  # fmt: skip
        last = lambda key: (ha.on(f"{E2E_STATE}/{key}") or [None])[-1]  # noqa: E731
        wait_until(
            lambda: all(last(k) == v for k, v in expected.items()),
            "the scene's counts on the state topics",
            state=lambda: {k: last(k) for k in expected},
        )
        assert ha.on(f"{E2E_STATE}/zone/loading-bay/overcrowded") == [b"OFF", b"ON", b"OFF"]
        assert ha.on(f"{E2E_STATE}/line/gate/east") == [b"0", b"1"]
        tracking_topics = {f"{E2E_STATE}/{key}" for key in (*expected, "snapshot")}
        assert tracking_topics <= entity_topics(discovery)["state"]
        # The snapshots: the JPEGs the store saved, byte for byte, on the pipeline's and the labels'.
        saved = {label: snapshots.path_of(sid, PIPELINE) for label, sid in taken.items()}
        files = {label: path.read_bytes() for label, path in saved.items() if path is not None}
        assert set(files) == {"person", "forklift"} and all(f[:2] == b"\xff\xd8" for f in files.values())
        wait_until(
            lambda: all(last(f"snapshot/{label}") == data for label, data in files.items()),
            "each label's newest snapshot",
        )
        assert last("snapshot") in files.values()
        decoded = cv2.imdecode(np.frombuffer(last("snapshot") or b"", np.uint8), cv2.IMREAD_COLOR)
        assert decoded is not None and decoded.shape[2] == 3
        # Retained: a Home Assistant that starts now gets them.
        late = Recorder(mosquitto, f"{E2E_STATE}/#")
        try:
            wait_until(lambda: late.on(f"{E2E_STATE}/snapshot/person"), "the retained person snapshot")
            assert late.on(f"{E2E_STATE}/snapshot/person") == [files["person"]]
            wait_until(lambda: late.on(f"{E2E_STATE}/line/gate/east") == [b"1"], "the retained line counter")
        finally:
            late.close()

        # The events arrived on edge/<device>/events/<pipeline>.
        topic = events_topic("edge", DEVICE_ID, PIPELINE)
        wait_until(
            lambda: any(json.loads(p)["type"] == "end" for _, p in nodered.matching(topic)), "the end event"
        )
        events_got = [json.loads(p) for _, p in nodered.matching(topic)]
        assert [e["seq"] for e in events_got] == list(range(1, len(events_got) + 1))
        assert all({"id", "device", "pipeline", "seq", "type", "at"} <= set(e) for e in events_got)
    finally:
        ha.close()
        nodered.close()
        rig.close()

    # docs/integrations.md: the Home Assistant automation, over these events.
    automation = yaml.safe_load(doc_block("yaml", "trigger: mqtt"))
    (trigger,) = automation["triggers"]
    assert trigger["trigger"] == "mqtt" and trigger["topic"] == topic
    (condition,) = automation["conditions"]
    assert condition["condition"] == "template"
    terms = template_condition(condition["value_template"])
    chosen = [e for e in events_got if holds(terms, e)]
    assert [(e["type"], e["zone"], e["object"]["label"]) for e in chosen] == [
        ("enter", "loading-bay", "person")
    ]
    assert any(e["type"] == "enter" and e["object"]["label"] == "forklift" for e in events_got)  # left out
    (action,) = automation["actions"]
    assert action["action"].startswith("notify.")
    for path in re.findall(r"trigger\.payload_json\.([\w.]+)", action["data"]["message"]):
        msg_get(chosen[0], path)  # every field the message names is in the event
    image = action["data"]["data"]["image"]
    entity_id = "image." + slugify(f"{DEVICE_ID} {snapshot_entity['name']}")
    assert image == f"/api/image_proxy/{entity_id}"

    # docs/integrations.md: the Node-RED flow on the events, over what arrived.
    flow = json.loads(doc_block("json", '"topic": "edge/+/events/+"'))
    got = run_flow(flow, [(t, p) for t, p, _ in nodered.messages])
    assert got["entered"] == ["person", "forklift"]
    assert got["crossed"] == [1]
    assert [(e["zone"], e["state"], e["count"]) for e in got["overcrowded"]] == [
        ("loading-bay", "start", 2), ("loading-bay", "end", 1)
    ]  # fmt: skip
