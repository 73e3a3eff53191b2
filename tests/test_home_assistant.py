"""State topics and Home Assistant discovery (agent/home_automation/, docs/integrations.md).

- The discovery config, for every entity kind the agent makes (sensor, binary_sensor, image) and for
  removals, checked field by field against Home Assistant's discovery schema (tests/ha_schema.py,
  written from its source); the checker is shown to refuse what Home Assistant refuses.
- The state topics' rules (change only, off delay, counts) and the daemon part (reconnects, removals,
  a restart's leftovers, discovery turned off, Home Assistant's birth message, the image) through the
  same publish interface the daemon uses.
- End to end: a real `edge-agent run` (this worktree's code) with a classifier on a looping video and a
  YOLO detector on a photo, a real mosquitto, plain paho clients as Home Assistant, as Node-RED and
  as Telegraf: the retained config and state, the birth message, reloads that remove a pipeline and
  then discovery, the Node-RED flow and the Telegraf paths of docs/integrations.md run against what
  arrived.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from agent import __version__
from agent.config import AgentConfig, HomeAssistantConfig, StateTopicsConfig
from agent.config_loader import load_config
from agent.home_automation import (
    MEMORY_FILE,
    PipelineState,
    PipelineView,
    annotated_jpeg,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.mqtt.message import Message
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import GOOD, agent_config, pipeline_body, publish_fleet_versions
from tests.ha_fixtures import (
    CONFIG_TOPIC,
    Holder,
    Recorder,
    classifier,
    config_of,
    detector,
    doc_block,
    home_for,
    msg_get,
    run_flow,
    valid_discovery,
)
from tests.ha_schema import check_device_discovery, entity_topics, unique_ids
from tests.media_fixtures import astronaut_bgr
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "agent.example.yaml"


# --- config ----------------------------------------------------------------------------------------


def test_defaults_are_off_and_the_example_documents_them() -> None:
    example = load_config(EXAMPLE, environ={})
    assert example.state_topics == StateTopicsConfig() and not example.state_topics.enabled
    assert example.home_assistant == HomeAssistantConfig() and not example.home_assistant.enabled
    assert not example.state_topics_on
    assert example.pipelines[0].home_automation.model_dump() == {
        "watch": [], "off_delay_s": 0.0, "image": False, "image_interval_s": 10.0
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pipeline", "top", "message"),
    [
        (classifier(watch=["up/right"]), {}, "watched label 'up/right' holds '/'"),
        (classifier(watch=["upright", "upright"]), {}, "label 'upright' is watched twice"),
        (classifier(watch=[" "]), {}, "a watched label must not be empty"),
        (classifier(watch=["sideways"]), {}, "'sideways' is not one of postprocess.labels"),
        (classifier(image=True), {}, "home_automation.image needs a detection postprocess on a video source"),
        (
            {**classifier(watch=["x"]), "postprocess": {"type": "raw"}},
            {},
            "home_automation.watch needs labels",
        ),
        (classifier(), {"home_assistant": {"enabled": True, "discovery_prefix": "ha/+"}}, "'+'"),
        (classifier(), {"home_assistant": {"enabled": True, "discovery_prefix": "ha/"}}, "no empty levels"),
        (classifier(), {"home_assistant": {"object_id": "a.b"}}, "object_id"),
    ],
)
def test_bad_settings_are_refused(
    tmp_path: Path, pipeline: dict[str, Any], top: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        config_of(tmp_path, [pipeline], **top)
    assert message in str(raised.value)


def test_a_dotted_device_id_needs_an_object_id(tmp_path: Path) -> None:
    data = {"device": {"id": "cam.lobby"}, "state_dir": str(tmp_path), "home_assistant": {"enabled": True}}
    with pytest.raises(ValidationError, match=r"set home_assistant\.object_id"):
        AgentConfig.model_validate(data)
    data["home_assistant"] = {"enabled": True, "object_id": "cam-lobby"}
    assert identity_of(AgentConfig.model_validate(data)).object_id == "cam-lobby"


# --- the discovery config against Home Assistant's schema ------------------------------------------------


def test_every_entity_kind_and_a_removal_fit_home_assistants_schema(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        [classifier(watch=["upside-down"]), detector(watch=["person", "dog cat"], image=True)],
        home_assistant={"enabled": True, "support_url": "https://wiki.example.com/edge-agent"},
    )
    views = [v for p in config.pipelines if (v := PipelineView.of(p)) is not None]
    identity = identity_of(config)
    components = discovery_components(views, identity, "edge")
    payload = discovery_payload(identity, components, {"gone__label": "sensor"})
    topic = "homeassistant/device/box-1/config"
    assert check_device_discovery(topic, payload) == []
    platforms = sorted(c["p"] for c in payload["cmps"].values())
    # Per pipeline its labels, counts and image, and its fps and backend; the box's online and outbox.
    assert platforms == ["binary_sensor"] * 4 + ["image"] + ["sensor"] * 10
    assert payload["cmps"]["gone__label"] == {"p": "sensor"}
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids)) == 14
    # Every topic is one the agent publishes: its status and its state topics.
    expected_state = {
        "edge/box-1/state/signs/label",
        "edge/box-1/state/signs/seen/upside-down",
        "edge/box-1/state/yard/count",
        "edge/box-1/state/yard/count/person",
        "edge/box-1/state/yard/count/dog cat",
        "edge/box-1/state/yard/seen/person",
        "edge/box-1/state/yard/seen/dog cat",
        "edge/box-1/state/yard/image",
        *(f"edge/box-1/state/{p}/{key}" for p in ("signs", "yard") for key in ("fps", "backend")),
        "edge/box-1/state/_device/outbox_pending",
        "edge/box-1/status",  # the connectivity sensor's
    }
    assert entity_topics(payload) == {"state": expected_state, "availability": {"edge/box-1/status"}}
    # A label with a space gets a component id Home Assistant can split discovery ids on.
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", cid) for cid in payload["cmps"])
    assert payload["o"] == {
        "name": "edge-agent", "sw_version": __version__, "support_url": "https://wiki.example.com/edge-agent"
    }  # fmt: skip
    assert payload["dev"]["identifiers"] == ["edge-agent__box-1"] and payload["dev"]["name"] == "box-1"


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (lambda p: p.update(expire=5), "root: expire is not an option"),
        (lambda p: p.pop("o"), "root: origin is required"),
        (lambda p: p["dev"].pop("identifiers"), "device: needs identifiers or connections"),
        (lambda p: p["dev"].update(colour="red"), "device: colour is not an option"),
        (lambda p: p["o"].update(support_url="wiki"), "origin: support_url='wiki' has the wrong type"),
        (lambda p: p.update(qos=3), "root: qos=3"),
        (lambda p: p["cmps"]["signs__label"].pop("unique_id"), "needs unique_id"),
        (lambda p: p["cmps"]["signs__label"].pop("state_topic"), "state_topic is required"),
        (lambda p: p["cmps"]["signs__label"].update(options=["a"]), "options needs device_class enum"),
        (lambda p: p["cmps"]["signs__label"].update(p="gauge"), "platform 'gauge' is not supported"),
        (lambda p: p["cmps"]["signs__seen__upside-down"].update(off_delay=1.5), "off_delay=1.5"),
        (lambda p: p["cmps"]["yard__image"].pop("image_topic"), "exactly one of image_topic and url_topic"),
        (lambda p: p["cmps"]["yard__image"].update(state_topic="x/y"), "state_topic is not an option"),
        (lambda p: p["availability"][0].pop("topic"), "is not a list of topic entries"),
    ],
)
def test_the_checker_refuses_what_home_assistant_refuses(tmp_path: Path, edit: Any, complaint: str) -> None:
    """Negative controls: the schema checker is not a rubber stamp."""
    config = config_of(
        tmp_path,
        [classifier(watch=["upside-down"]), detector(image=True)],
        home_assistant={"enabled": True},
    )
    views = [v for p in config.pipelines if (v := PipelineView.of(p)) is not None]
    payload = discovery_payload(
        identity_of(config), discovery_components(views, identity_of(config), "edge"), {}
    )
    edit(payload)
    problems = check_device_discovery("homeassistant/device/box-1/config", payload)
    assert any(complaint in p for p in problems), problems
    assert check_device_discovery("homeassistant/device/box.1/config", {}) != []


# --- the state values ---------------------------------------------------------------------------------


def top(label: str) -> dict[str, Any]:
    return {"top": [{"index": 0, "label": label, "score": 0.9}]}


def boxes(*labels: str) -> dict[str, Any]:
    return {
        "detections": [
            {"index": i, "label": lab, "score": 0.8, "box": [1, 2, 30, 40]} for i, lab in enumerate(labels)
        ]
    }


def test_classification_label_and_a_watched_label_with_an_off_delay() -> None:
    state = PipelineState(PipelineView("signs", "classification", ("upside-down",), 2.0, False, 10.0))
    state.update(top("upright"), now=0.0)
    assert state.values == {("label",): b"upright", ("seen", "upside-down"): b"OFF"}
    state.update(top("upside-down"), now=1.0)
    assert state.values[("seen", "upside-down")] == b"ON"
    state.update(top("upright"), now=2.0)  # missing 1 s of the 2 s delay: still ON
    assert state.values == {("label",): b"upright", ("seen", "upside-down"): b"ON"}
    state.expire(2.9)
    assert state.values[("seen", "upside-down")] == b"ON"
    state.expire(3.0)  # without a new result: the tick turns it OFF
    assert state.values[("seen", "upside-down")] == b"OFF"
    # A label-less model: the class index.
    state.update({"top": [{"index": 3, "label": None, "score": 0.5}]}, now=4.0)
    assert state.values[("label",)] == b"3"


def test_detection_counts_and_watched_labels() -> None:
    state = PipelineState(PipelineView("yard", "detection", ("person", "car"), 0.0, False, 10.0))
    state.update(boxes("person", "person", "dog"), now=0.0)
    assert state.values == {
        ("count",): b"3", ("count", "person"): b"2", ("count", "car"): b"0",
        ("seen", "person"): b"ON", ("seen", "car"): b"OFF",
    }  # fmt: skip
    state.update(boxes(), now=1.0)
    assert state.values[("count",)] == b"0" and state.values[("seen", "person")] == b"OFF"


# --- the daemon part, on the interface it publishes through ---------------------------------------------


def device_level(*pipelines: str) -> set[str]:
    """The component ids of the box's own entities and of these pipelines' fps and backend."""
    per_pipeline = {f"{p}__{key}" for p in pipelines for key in ("fps", "backend")}
    return {"_device__online", "_device__outbox_pending", *per_pipeline}


def test_state_is_published_on_change_only_and_again_after_a_reconnect(tmp_path: Path) -> None:
    home, link, _, _ = home_for(tmp_path, [classifier(watch=["upside-down"])], state_topics={"enabled": True})
    home.tick()
    assert link.take() == []  # no result yet, no discovery (Home Assistant is off)
    home.observe("signs", top("upright"), None)
    home.observe("signs", top("upright"), None)
    home.observe("signs", top("upside-down"), None)
    assert link.take() == [
        ("edge/box-1/state/signs/label", b"upright"),
        ("edge/box-1/state/signs/seen/upside-down", b"OFF"),
        ("edge/box-1/state/signs/label", b"upside-down"),
        ("edge/box-1/state/signs/seen/upside-down", b"ON"),
    ]
    home.tick()
    assert link.take() == []
    # The link drops: what changes meanwhile cannot go; after the reconnect everything goes again.
    link.connected = False
    home.observe("signs", top("upright"), None)
    link.connected, link.connects = True, 2
    home.tick()
    assert sorted(link.take()) == [
        ("edge/box-1/state/signs/label", b"upright"),
        ("edge/box-1/state/signs/seen/upside-down", b"OFF"),
    ]
    # A result on a new connection before the loop noticed it: each value goes once on it.
    link.connects = 3
    home.observe("signs", top("upside-down"), None)
    assert sorted(link.take()) == [
        ("edge/box-1/state/signs/label", b"upside-down"),
        ("edge/box-1/state/signs/seen/upside-down", b"ON"),
    ]
    home.tick()
    assert link.take() == []
    assert json.loads((tmp_path / "state" / MEMORY_FILE).read_text())["state_topics"] == [
        "edge/box-1/state/signs/label", "edge/box-1/state/signs/seen/upside-down"
    ]  # fmt: skip


def test_discovery_births_removals_a_restart_and_turning_it_off(tmp_path: Path) -> None:
    pipelines = [classifier(), detector(watch=["person"])]
    home, link, router, wanted = home_for(tmp_path, pipelines, home_assistant={"enabled": True})
    assert list(router.routes) == ["homeassistant/status"]
    home.observe("signs", top("upright"), None)  # before the first tick: kept, published by it
    home.tick()
    sent = link.take()
    assert sent[0][0] == CONFIG_TOPIC and sent[1:] == [("edge/box-1/state/signs/label", b"upright")]
    config = json.loads(sent[0][1])
    assert check_device_discovery(CONFIG_TOPIC, config) == []
    labels = {"signs__label", "yard__count", "yard__count__person", "yard__seen__person"}
    assert set(config["cmps"]) == labels | device_level("signs", "yard")
    home.tick()
    assert link.take() == []  # unchanged: not again
    router.routes["homeassistant/status"](Message("homeassistant/status", b"offline"))
    home.tick()
    assert link.take() == []
    router.routes["homeassistant/status"](Message("homeassistant/status", b"online"))
    home.tick()
    assert link.take() == [(CONFIG_TOPIC, sent[0][1])]  # Home Assistant restarted: the config again
    home.observe("yard", boxes("person"), None)
    link.take()

    # The detector goes (a reload, the fleet): its components become removals, its state is cleared.
    del wanted[1]
    home.tick()
    sent = link.take()
    config = json.loads(sent[0][1])
    assert check_device_discovery(CONFIG_TOPIC, config) == []
    assert config["cmps"]["yard__count"] == {"p": "sensor"} and config["cmps"]["yard__seen__person"] == {
        "p": "binary_sensor"
    }
    assert sorted(sent[1:]) == [
        ("edge/box-1/state/yard/count", b""),
        ("edge/box-1/state/yard/count/person", b""),
        ("edge/box-1/state/yard/seen/person", b""),
    ]

    # A restart without the classifier either: what the last run left is removed and cleared.
    wanted.clear()
    wanted.append(detector("gate"))
    again, link2, _, _ = home_for(tmp_path, wanted, home_assistant={"enabled": True})
    again.tick()
    sent = link2.take()
    config = json.loads(sent[0][1])
    assert config["cmps"]["signs__label"] == {"p": "sensor"} and "gate__count" in config["cmps"]
    assert config["cmps"]["yard__count"] == {"p": "sensor"}  # removals stay in the retained config
    assert sent[1:] == [("edge/box-1/state/signs/label", b"")]

    # Discovery off (a reload): an empty config removes the device; the state topics go too.
    again.observe("gate", boxes(), None)
    link2.take()
    again.use_config(config_of(tmp_path, wanted))
    again.tick()
    assert link2.take() == [(CONFIG_TOPIC, b""), ("edge/box-1/state/gate/count", b"")]
    assert json.loads((tmp_path / "state" / MEMORY_FILE).read_text()) == {
        "discovery": {"topic": None, "components": {}, "removed": {}}, "state_topics": []
    }  # fmt: skip
    again.tick()
    assert link2.take() == []


def test_the_image_is_the_results_frame_with_its_boxes_and_rate_limited(tmp_path: Path) -> None:
    home, link, _, _ = home_for(
        tmp_path,
        [detector(image=True, image_interval_s=60)],
        [Holder("yard")],
        state_topics={"enabled": True},
    )
    home.tick()
    photo = astronaut_bgr()
    face = {"index": 0, "label": "person", "score": 0.8, "box": [173, 82, 274, 180]}
    home.observe("yard", {"detections": [face]}, None)  # a result without its frame's pixels: no image
    home.tick()
    assert [t for t, _ in link.take()] == ["edge/box-1/state/yard/count"]
    home.observe("yard", {"detections": [face, face]}, photo)
    home.tick()
    sent = dict(link.take())
    image = cv2.imdecode(np.frombuffer(sent["edge/box-1/state/yard/image"], np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == photo.shape
    # The box is drawn along its edges; the photo elsewhere is the photo (JPEG aside).
    diff = np.abs(image.astype(int) - photo.astype(int)).sum(axis=2)
    assert diff[82, 180:270].mean() > 100 and diff[120:170, 274].mean() > 100
    assert diff[300:500, 300:500].mean() < 15
    home.observe("yard", {"detections": [face]}, photo)  # within image_interval_s: no new image
    home.tick()
    assert "edge/box-1/state/yard/image" not in dict(link.take())
    # Too big for the broker: scaled down until it fits.
    small = annotated_jpeg(photo, [face], max_bytes=12_000)
    assert small is not None and len(small) <= 12_000
    assert cv2.imdecode(np.frombuffer(small, np.uint8), cv2.IMREAD_COLOR).shape[0] < 512


# --- end to end --------------------------------------------------------------------------------------------


DEVICE = "ha-box"
CONFIG = f"homeassistant/device/{DEVICE}/config"
STATE = f"edge/{DEVICE}/state"


@pytest.mark.slow
def test_a_real_agent_seen_by_home_assistant_node_red_and_telegraf(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    yolo_path: Path,
    yolo_labels: list[str],
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    assert cv2.imwrite(str(photos / "astronaut.png"), astronaut_bgr())
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    signs = {**pipeline_body(GOOD, video[0], 5.0), "home_automation": {"watch": ["upside-down"]}}
    faces = {
        "model": {"path": str(yolo_path)},
        "source": {"type": "video", "uri": str(photos), "fps": 2, "loop": True},
        "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": yolo_labels},
        "home_automation": {"watch": ["FACE_FEMALE"], "image": True, "image_interval_s": 1},
    }
    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, registry, {"signs": signs, "faces": faces},
        home_assistant={"enabled": True}, telemetry={"interval_s": 1},
    )  # fmt: skip
    state_dir = tmp_path / DEVICE / "state"
    ha = Recorder(mosquitto, "homeassistant/#", f"edge/{DEVICE}/status", f"{STATE}/#")
    nodered = Recorder(mosquitto, "edge/+/results/+", "edge/+/state/+/seen/+", "edge/+/status")
    telegraf = Recorder(mosquitto, "edge/+/telemetry")
    agent = start_agent(config)
    try:
        # 1. Home Assistant reads the retained config: both pipelines, valid, every topic a real one.
        discovery = valid_discovery(ha, CONFIG, agent)
        assert set(discovery["cmps"]) == {
            "signs__label", "signs__seen__upside-down", "faces__count", "faces__count__FACE_FEMALE",
            "faces__seen__FACE_FEMALE", "faces__image", *device_level("signs", "faces"),
        }  # fmt: skip
        ids = unique_ids(discovery)
        assert len(ids) == len(set(ids)) == 12
        # It really is this worktree's code that runs.
        wait_until(lambda: "home_automation" in read_status(state_dir), "status.json with home_automation")

        # 2. The state topics carry what the results carry.
        topics = entity_topics(discovery)
        wait_until(
            lambda: all(ha.on(t) for t in topics["state"]) and len(ha.on(f"{STATE}/signs/label")) >= 4,
            "every entity's state topic and four label changes",
            timeout=90,
            state=lambda: f"{sorted({t for t, _, _ in ha.messages})}\n{agent.log()[-2000:]}",
        )
        assert topics["availability"] == {f"edge/{DEVICE}/status"}
        assert json.loads(ha.on(f"edge/{DEVICE}/status")[-1])["status"] == "online"
        assert ha.on(f"{STATE}/faces/seen/FACE_FEMALE")[-1] == b"ON"
        assert int(ha.on(f"{STATE}/faces/count/FACE_FEMALE")[-1]) >= 1
        image = ha.on(f"{STATE}/faces/image")[-1]
        assert image[:2] == b"\xff\xd8" and cv2.imdecode(np.frombuffer(image, np.uint8), 1).shape == (
            512,
            512,
            3,
        )

        def top_labels() -> list[str]:
            changes: list[str] = []
            for _, payload in nodered.matching(f"edge/{DEVICE}/results/signs"):
                label = json.loads(payload)["output"]["top"][0]["label"]
                if not changes or changes[-1] != label:
                    changes.append(label)
            return changes

        states = [p.decode() for p in ha.on(f"{STATE}/signs/label")]
        assert all(a != b for a, b in itertools.pairwise(states)), states  # on change only
        wait_until(lambda: len(top_labels()) >= len(states), "the results behind the state")
        assert top_labels()[: len(states)] == states
        seen = [p.decode() for p in ha.on(f"{STATE}/signs/seen/upside-down")]
        assert seen and all(a != b for a, b in itertools.pairwise(seen)) and set(seen) == {"ON", "OFF"}
        for retained in (f"{STATE}/signs/label", CONFIG):  # a Home Assistant that starts now gets them
            late = Subscriber(mosquitto.host, mosquitto.port, retained)
            late.wait_until(lambda ms: any(m.retain for m in ms), timeout=10)
            late.close()

        # 3. Home Assistant restarts: its birth message brings the config again.
        wait_until(
            lambda: read_status(state_dir)["mqtt"]["subscriptions"].get("homeassistant/status") == "active",
            "the agent's subscription to Home Assistant's birth message",
        )
        before = len(ha.on(CONFIG))
        publish = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        publish.connect(mosquitto.host, mosquitto.port)
        publish.loop_start()
        publish.publish("homeassistant/status", b"online", qos=1).wait_for_publish(10)
        wait_until(
            lambda: len(ha.on(CONFIG)) > before, "the config again after the birth message", timeout=15
        )
        assert json.loads(ha.on(CONFIG)[-1]) == discovery
        publish.disconnect()
        publish.loop_stop()

        # 4. Telegraf's part, checked at the end: a real telemetry report.
        wait_until(lambda: telegraf.matching("edge/+/telemetry"), "a telemetry report", timeout=30)
        telemetry_topic, report_bytes = telegraf.matching("edge/+/telemetry")[-1]

        # 5. A reload removes the detector: its components become removals, its state is cleared.
        data = yaml.safe_load(config.read_text())
        data["pipelines"] = [p for p in data["pipelines"] if p["name"] != "faces"]
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        agent.send_signal(signal.SIGHUP)

        def faces_removed() -> bool:
            cmps = json.loads(ha.on(CONFIG)[-1] or b"{}").get("cmps", {})
            return bool(cmps.get("faces__count") == {"p": "sensor"})

        wait_until(faces_removed, "the detector's components removed", timeout=30)
        removed = json.loads(ha.on(CONFIG)[-1])
        assert check_device_discovery(CONFIG, removed) == []
        assert {cid: c for cid, c in removed["cmps"].items() if cid.startswith("faces")} == {
            "faces__count": {"p": "sensor"}, "faces__count__FACE_FEMALE": {"p": "sensor"},
            "faces__seen__FACE_FEMALE": {"p": "binary_sensor"}, "faces__image": {"p": "image"},
            "faces__fps": {"p": "sensor"}, "faces__backend": {"p": "sensor"},
        }  # fmt: skip
        assert removed["cmps"]["signs__label"] == discovery["cmps"]["signs__label"]
        faces_topics = [t for t in topics["state"] if t.startswith(f"{STATE}/faces/")]
        wait_until(lambda: all(ha.on(t)[-1] == b"" for t in faces_topics), "the detector's state cleared")

        # 6. Discovery off: the device goes; the state topics too (state_topics is not on).
        data["home_assistant"] = {"enabled": False}
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        agent.send_signal(signal.SIGHUP)
        wait_until(lambda: ha.on(CONFIG)[-1] == b"", "an empty config", timeout=30)
        signs_topics = [t for t in topics["state"] if t.startswith(f"{STATE}/signs/")]
        wait_until(lambda: all(ha.on(t)[-1] == b"" for t in signs_topics), "the classifier's state cleared")
        agent.stop()
    finally:
        for client in (ha, telegraf):
            client.close()
    # Nothing of it is left retained at the broker (control: a live message after the SUBACKs).
    leftover = Recorder(mosquitto, "homeassistant/#", f"{STATE}/#")
    control = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    control.connect(mosquitto.host, mosquitto.port)
    control.loop_start()
    control.publish(f"{STATE}/control", b"x", qos=1).wait_for_publish(10)
    wait_until(lambda: leftover.on(f"{STATE}/control"), "the control message")
    assert [t for t, _, retained in leftover.messages if retained] == []
    control.disconnect()
    control.loop_stop()
    leftover.close()

    # 7. Node-RED: the documented flow over every message it would have got, results as documented.
    statuses = lambda: [json.loads(p)["status"] for _, p in nodered.matching("edge/+/status") if p]  # noqa: E731
    wait_until(lambda: "offline" in statuses(), "the offline status")
    nodered.close()
    # The fields docs/results.md documents, with their types, in every result.
    table = (ROOT / "docs" / "results.md").read_text().split("## Fields", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `(\w+)` \| (\w+)", table, re.M))
    # Only in a pipeline with report.tags, or with a motion gate (none here).
    optional = {"tags", "frames_gated"}
    assert len(documented) == 16 and optional <= set(documented), documented
    types = {"string": str, "integer": int, "object": dict}
    results = nodered.matching("edge/+/results/+")
    assert {json.loads(p)["pipeline"] for _, p in results} == {"signs", "faces"}
    for topic, payload in results:
        result = json.loads(payload)
        assert set(result) == set(documented) - optional, topic
        assert all(isinstance(result[k], types[t]) for k, t in documented.items() if k in result), result
        assert topic == f"edge/{result['device']}/results/{result['pipeline']}" and result["device"] == DEVICE
    flow = json.loads(doc_block("json", '"id": "results-in"'))
    got = run_flow(flow, [(t, p) for t, p, _ in nodered.messages])
    assert set(got["label"]) == {"upright", "upside-down"}
    assert got["detections"] and all(isinstance(n, int) and n >= 1 for n in got["detections"])
    assert got["seen: light on"] and got["gone: light off"]
    assert [m["status"] for m in got["box offline"]] == ["offline"]

    # 8. Telegraf: the documented json_v2 paths exist in the real telemetry report, typed as said.
    check_telegraf_paths(telemetry_topic, json.loads(report_bytes))


def check_telegraf_paths(telemetry_topic: str, report: dict[str, Any]) -> None:
    import tomllib  # (Python 3.11+: the project's Python)

    conf = tomllib.loads(doc_block("toml", "mqtt_consumer"))
    consumer = conf["inputs"]["mqtt_consumer"][0]
    assert any(mqtt.topic_matches_sub(t, telemetry_topic) for t in consumer["topics"])
    parsing = consumer["topic_parsing"][0]
    assert mqtt.topic_matches_sub(parsing["topic"], telemetry_topic)
    assert dict(zip(parsing["tags"].split("/"), telemetry_topic.split("/"), strict=True))["device"] == DEVICE
    kinds = {"float": (int, float), "int": (int,), "bool": (bool,)}
    for block in consumer["json_v2"]:
        assert msg_get(report, block["timestamp_path"]).endswith("Z")
        for field in block.get("field", []):
            value = msg_get(report, field["path"])
            assert isinstance(value, kinds[field["type"]]) and not (
                field["type"] != "bool" and value is True
            ), field
        for obj in block.get("object", []):
            assert set(msg_get(report, obj["path"])) == {"signs", "faces"}
