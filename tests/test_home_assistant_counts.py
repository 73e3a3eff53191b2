"""The counts people ask for (issue 34, item 11; agent/home_automation/, docs/integrations.md "Counts
and wait times"): per zone and label its occupancy, per line, direction and label its crossings, and
per zone the last stay and the mean of the last stays (the wait time), as state topics and Home
Assistant sensors.

- The discovery config for docs/integrations.md's shop (its YAML, parsed out of the page), checked
  against Home Assistant's discovery schema (tests/ha_schema.py).
- End to end: a real scene (the tracker, the counter zone, the door line) fed a shop's story through
  the agent's own result writer, outbox and MQTT connection to a real mosquitto, a plain paho client
  as Home Assistant: every value it receives, against what the events say; and the page's
  automation (its entities, trigger and condition) over what it received.
- The per-label crossings start again with the scene's (a pipeline restart), and what a pipeline's
  first frames told before the state topics knew the pipeline is not lost.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.home_automation import (
    PipelineView,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.processing.scene import Scene
from agent.results import Result
from tests.ha_fixtures import CONFIG_TOPIC, Holder, Recorder, config_of, doc_block, home_for, home_rig
from tests.ha_schema import check_device_discovery, unique_ids
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DEVICE_ID = "cam-01"  # docs/integrations.md's shop
PIPELINE = "shop-cam"
STATE = f"edge/{DEVICE_ID}/state/{PIPELINE}"
W, H = 1000, 1000
STEP_S = 0.5  # a frame every half second: long waits in few frames


def shop() -> dict[str, Any]:
    """docs/integrations.md's shop pipeline, with a model, source and postprocess filled in."""
    (pipeline,) = yaml.safe_load(doc_block("yaml", "name: shop-cam"))["pipelines"]
    assert "model" not in pipeline and "source" not in pipeline  # (the page leaves them to the reader)
    return {
        **pipeline,
        "model": {"path": "/yolo.onnx"},
        "source": {"type": "video", "uri": "rtsp://127.0.0.1:8554/shop"},
        "postprocess": {"type": "detection", "labels": ["person", "dog", "cat/dog"]},
    }


def slugify(text: str) -> str:
    """Home Assistant's entity id from a name: lower case, runs of anything else as one `_`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def entity_ids(discovery: dict[str, Any], device_name: str) -> dict[str, dict[str, Any]]:
    """`<platform>.<device name and entity name>` -> its component, as Home Assistant names them."""
    return {
        f"{c['p']}.{slugify(device_name + ' ' + c['name'])}": c
        for c in discovery["cmps"].values()
        if "name" in c
    }


# --- the discovery config ---------------------------------------------------------------------------------


def test_the_shop_s_sensors_per_label_and_its_wait_times_fit_home_assistants_schema(tmp_path: Path) -> None:
    config = config_of(tmp_path, [shop()], home_assistant={"enabled": True})
    identity = identity_of(config)
    payload = discovery_payload(
        identity, discovery_components([PipelineView.of(config.pipelines[0])], identity, "edge"), {}
    )
    assert check_device_discovery(CONFIG_TOPIC, payload) == []
    cmps = payload["cmps"]
    prefix = "edge/box-1/state/shop-cam"
    measurement = {"state_class": "measurement"}
    stay = {"device_class": "duration", "unit_of_measurement": "s", "state_class": "measurement"}
    total = {"state_class": "total_increasing"}
    expected = {
        "shop-cam__zone__counter__count": ("shop-cam zone counter count", "zone/counter/count", measurement),
        "shop-cam__zone__counter__count__person": (
            "shop-cam zone counter person count", "zone/counter/count/person", measurement
        ),
        "shop-cam__zone__counter__stayed_s": (
            "shop-cam zone counter last stay", "zone/counter/stayed_s", stay
        ),
        "shop-cam__zone__counter__mean_stayed_s": (
            "shop-cam zone counter mean stay", "zone/counter/mean_stayed_s", stay
        ),
        **{
            f"shop-cam__line__door__{d}{'__' + label if label else ''}": (
                f"shop-cam line door {d}{' ' + label if label else ''}",
                f"line/door/{d}{'/' + label if label else ''}",
                total,
            )
            for d in ("entering", "leaving")
            for label in ("", "person", "dog")
        },
    }  # fmt: skip
    for cid, (name, key, options) in expected.items():
        assert cmps[cid]["p"] == "sensor" and cmps[cid]["name"] == name, cid
        assert cmps[cid]["state_topic"] == f"{prefix}/{key}" and cmps[cid]["qos"] == 1, cid
        assert options.items() <= cmps[cid].items(), cid
    tracking = {cid for cid in cmps if "__zone__" in cid or "__line__" in cid}
    assert tracking == set(expected)  # no per-label sensor for a label not in the filter
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids))

    # A label that cannot be a topic level gets no per-label topic; a zone or line without `labels`
    # has only its totals.
    pipeline = shop()
    pipeline["zones"][0]["labels"] = ["person", "cat/dog"]
    pipeline["lines"][0].pop("labels")
    view = PipelineView.of(config_of(tmp_path, [pipeline]).pipelines[0])
    cids = set(discovery_components([view], identity, "edge"))
    assert {c for c in cids if "__count__" in c} == {"shop-cam__zone__counter__count__person"}
    assert {c for c in cids if "__line__" in c} == {
        "shop-cam__line__door__entering",
        "shop-cam__line__door__leaving",
    }


# --- end to end: a shop's story through the agent's writer to a real mosquitto ------------------------------


def box(cx: float, bottom: float, label: str = "person") -> dict[str, Any]:
    """A detection whose bottom centre (the zone's and the line's anchor) is (cx, bottom)."""
    return {"box": [cx - 30, bottom - 120, cx + 30, bottom], "score": 0.9, "label": label}


def path(points: list[tuple[float, float, float]]) -> dict[float, tuple[float, float]]:
    """(t, x, y) key points -> the anchor at each frame time from the first to the last, walking
    straight between them."""
    out = {}
    for (t0, x0, y0), (t1, x1, y1) in itertools.pairwise(points):
        steps = round((t1 - t0) / STEP_S)
        for i in range(steps):
            f = i / steps
            out[round(t0 + i * STEP_S, 3)] = (x0 + (x1 - x0) * f, y0 + (y1 - y0) * f)
    out[round(points[-1][0], 3)] = points[-1][1:]
    return out


# The door line is y = 800 for x 100..400 (drawn left to right: moving up is `entering`); the counter
# is x 550..950, y 600..950. Walking speed: at most 20 px a frame (the tracker's boxes overlap).
WALKERS = {
    # A dog comes in and goes out again.
    ("dog", "rex"): path([(0, 300, 980), (10, 300, 700), (14, 300, 700), (24, 300, 980)]),
    # Ann comes in, waits at the counter ~200 s, goes out.
    ("person", "ann"): path(
        [(20, 200, 980), (30, 200, 700), (50, 650, 800), (250, 650, 800), (270, 200, 700), (280, 200, 980)]
    ),
    # Bob comes in after her, waits ~240 s further along the counter, goes out after her.
    ("person", "bob"): path(
        [(40, 250, 980), (50, 250, 700), (70, 850, 800), (310, 850, 800), (335, 250, 700), (345, 250, 980)]
    ),
}


def story() -> Iterator[tuple[float, list[dict[str, Any]]]]:
    times = sorted({t for walk in WALKERS.values() for t in walk})
    for t in times:
        yield t, [box(*walk[t], label=label) for (label, _), walk in WALKERS.items() if t in walk]
    for k in range(1, 5):  # an empty shop: the last tracks end
        yield times[-1] + k * STEP_S, []


def test_a_real_broker_gets_the_counts_per_label_and_the_wait_times_and_the_automation_works(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    rig = home_rig(tmp_path, mosquitto, DEVICE_ID, [shop()])
    config, conn, home, writer = rig.config, rig.conn, rig.home, rig.writer
    config_topic = f"homeassistant/device/{DEVICE_ID}/config"
    ha = Recorder(mosquitto, "homeassistant/#", f"{STATE}/#")
    events: list[dict[str, Any]] = []
    try:
        conn.start()
        wait_until(lambda: conn.connected, "connected", state=conn.stats)
        home.tick()
        wait_until(lambda: ha.on(config_topic), "the discovery config")
        discovery = json.loads(ha.on(config_topic)[-1])
        assert check_device_discovery(config_topic, discovery) == []

        pipeline = config.pipelines[0]
        assert pipeline.tracking is not None
        scene = Scene(pipeline.tracking, pipeline.zones, pipeline.lines)
        start = time.time()
        for t, boxes in story():  # the pipeline's part (agent/steps/track.py, report.py)
            scene.step(boxes, start + t, W, H)
            frame_events = scene.take_events()
            events += frame_events
            if frame_events:
                writer.submit(
                    Result(
                        pipeline=PIPELINE, captured_at=start + t, model={}, backend="onnxruntime/CPU",
                        precision="fp32", latency_ms={}, source={}, output={"detections": boxes}, held_back=0,
                        events=frame_events, publish=False, scene=scene.summary(),
                    )
                )  # fmt: skip

        # What the events say, as a consumer of the events would count it.
        exits = [e for e in events if e["type"] == "exit"]
        assert [(e["object"]["label"], e["reason"]) for e in exits] == [("person", "left")] * 2
        stays = [e["stayed_s"] for e in exits]
        # Ann is in the counter from t 46 (x 560), entered at 48 (min_seconds 2), out at 254.5 (x 549);
        # Bob from 60 (x 550: on its edge), entered at 62, out at 323 (x 538).
        assert stays == [pytest.approx(206.5, abs=0.01), pytest.approx(261.0, abs=0.01)]
        crossings = Counter((e["direction"], e["object"]["label"]) for e in events if e["type"] == "cross")
        assert crossings == {
            ("entering", "dog"): 1, ("leaving", "dog"): 1, ("entering", "person"): 2, ("leaving", "person"): 2
        }  # fmt: skip
        expected = {
            "zone/counter/count": [b"0", b"1", b"2", b"1", b"0"],
            "zone/counter/count/person": [b"0", b"1", b"2", b"1", b"0"],
            "zone/counter/stayed_s": [f"{s:.1f}".encode() for s in stays],
            "zone/counter/mean_stayed_s": [f"{stays[0]:.1f}".encode(), f"{sum(stays) / 2:.1f}".encode()],
            "line/door/entering": [b"0", b"1", b"2", b"3"],
            "line/door/leaving": [b"0", b"1", b"2", b"3"],
            "line/door/entering/dog": [b"0", b"1"],
            "line/door/leaving/dog": [b"0", b"1"],
            "line/door/entering/person": [b"0", b"1", b"2"],
            "line/door/leaving/person": [b"0", b"1", b"2"],
        }
        got = lambda: {key: ha.on(f"{STATE}/{key}") for key in expected}  # noqa: E731
        wait_until(lambda: got() == expected, "every value, in order, once", state=got)
        # Every one of them is a sensor Home Assistant reads.
        topics = {c.get("state_topic") for c in discovery["cmps"].values()}
        assert {f"{STATE}/{key}" for key in expected} <= topics
        # Retained: a Home Assistant that starts now gets the latest values.
        late = Recorder(mosquitto, f"{STATE}/#")
        try:
            latest = {key: values[-1] for key, values in expected.items()}
            wait_until(
                lambda: (
                    {key: late.on(f"{STATE}/{key}") for key in latest} == {k: [v] for k, v in latest.items()}
                ),
                "the retained values",
            )
        finally:
            late.close()
        received = [(t, p) for t, p, _ in list(ha.messages) if t.startswith(STATE + "/")]
    finally:
        ha.close()
        rig.close()

    # docs/integrations.md's automation: every entity it names is one of the shop's sensors.
    automation = yaml.safe_load(doc_block("yaml", "trigger: numeric_state"))
    sensors = entity_ids(discovery, DEVICE_ID)
    text = json.dumps(automation)
    named = set(re.findall(r"sensor\.[a-z0-9_]+", text))
    assert named and named <= set(sensors), named - set(sensors)
    (trigger,) = automation["triggers"]
    (condition,) = automation["conditions"]
    assert trigger["trigger"] == "numeric_state" and condition["condition"] == "numeric_state"
    topic_of = {entity: sensors[entity]["state_topic"] for entity in named}
    # Replayed as Home Assistant sees the states change: the trigger fires when its sensor goes above
    # its threshold, and the condition holds then: Bob is still waiting when Ann's 200 s make the
    # mean go over 180 s.
    states: dict[str, float] = {}
    fired = []
    for topic, payload in received:
        for entity, entity_topic in topic_of.items():
            if topic != entity_topic:
                continue
            before, states[entity] = states.get(entity), float(payload)
            crossed = states[entity] > trigger["above"] and (before is None or before <= trigger["above"])
            if entity == trigger["entity_id"] and crossed:
                fired.append(states.get(condition["entity_id"], 0.0) > condition["above"])
    assert fired == [True]
    for entity in re.findall(r"states\('([^']+)'\)", automation["actions"][0]["data"]["message"]):
        assert entity in states, entity  # each value the message shows has one


# --- the per-label crossings with the scene's -------------------------------------------------------------


def cross(direction: str, label: str, count: int) -> dict[str, Any]:
    return {"type": "cross", "line": "door", "direction": direction, "object": {"id": 1, "label": label},
            "count": count}  # fmt: skip


def door_summary(entering: int, leaving: int) -> dict[str, Any]:
    zone = {"count": 0, "labels": {}, "dwelling": 0, "overcrowded": False}
    return {
        "tracks": 0,
        "zones": {"counter": zone},
        "lines": {"door": {"entering": entering, "leaving": leaving}},
    }


def test_per_label_crossings_start_again_with_the_scene_and_none_is_lost_before_the_first_tick(
    tmp_path: Path,
) -> None:
    home, link, _, _ = home_for(tmp_path, [shop()], [Holder(PIPELINE)], state_topics={"enabled": True})
    # Before the state topics know the pipeline (its first tick): kept, all of it.
    home.observe_scene(PIPELINE, door_summary(1, 0), [cross("entering", "person", 1)])
    home.observe_scene(PIPELINE, door_summary(2, 0), [cross("entering", "dog", 2)])
    home.observe_scene(PIPELINE, door_summary(3, 0), [cross("entering", "person", 3)])
    home.tick()
    sent = {t.removeprefix("edge/box-1/state/shop-cam/"): p for t, p in link.take()}
    assert {k: v for k, v in sent.items() if k.startswith("line/")} == {
        "line/door/entering": b"3", "line/door/leaving": b"0",
        "line/door/entering/person": b"2", "line/door/entering/dog": b"1",
        "line/door/leaving/person": b"0", "line/door/leaving/dog": b"0",
    }  # fmt: skip
    # The pipeline restarts (a new scene counts from 0): a frame without a crossing, then one with.
    home.observe_scene(PIPELINE, door_summary(0, 0), [{"type": "new", "object": {"id": 9, "label": "dog"}}])
    assert sorted(link.take()) == sorted(
        (f"edge/box-1/state/shop-cam/line/door/{key}", b"0")
        for key in ("entering", "entering/person", "entering/dog")
    )
    home.observe_scene(PIPELINE, door_summary(1, 0), [cross("entering", "dog", 1)])
    assert sorted(link.take()) == [
        ("edge/box-1/state/shop-cam/line/door/entering", b"1"),
        ("edge/box-1/state/shop-cam/line/door/entering/dog", b"1"),
    ]
    # A restart whose first frame crosses at once: the scene's count says it started again.
    home.observe_scene(PIPELINE, door_summary(1, 0), [cross("entering", "person", 1)])
    assert sorted(link.take()) == [
        ("edge/box-1/state/shop-cam/line/door/entering/dog", b"0"),
        ("edge/box-1/state/shop-cam/line/door/entering/person", b"1"),
    ]


@pytest.mark.parametrize("stays", [[12.0], [10.0, 20.0, 33.3], [float(s) for s in range(1, 26)]])
def test_the_mean_stay_is_over_the_last_20_stays(tmp_path: Path, stays: list[float]) -> None:
    home, link, _, _ = home_for(tmp_path, [shop()], [Holder(PIPELINE)], state_topics={"enabled": True})
    home.tick()
    link.take()
    for i, stayed in enumerate(stays):
        person = {"id": i, "label": "person"}
        exit_ = {"type": "exit", "zone": "counter", "object": person, "stayed_s": stayed, "reason": "left"}
        home.observe_scene(PIPELINE, door_summary(0, 0), [exit_])
    sent = dict(link.take())
    last = stays[-20:]
    assert sent["edge/box-1/state/shop-cam/zone/counter/stayed_s"] == f"{stays[-1]:.1f}".encode()
    assert (
        sent["edge/box-1/state/shop-cam/zone/counter/mean_stayed_s"]
        == f"{sum(last) / len(last):.1f}".encode()
    )
