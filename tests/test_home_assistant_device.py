"""The box's own entities in Home Assistant (agent/home_automation/, docs/integrations.md): its
connectivity (a binary_sensor on the retained status), and sensors for each pipeline's frame rate and
serving backend and for the outbox backlog, on state topics the agent publishes.

- Their discovery config against Home Assistant's schema (tests/ha_schema.py).
- The values, on the interface the daemon publishes through: taken from the daemon's health every
  HEALTH_EVERY_S (and on a new connection), published on change, cleared when turned off.
- End to end: a real `edge-agent run`, a real mosquitto and a plain paho client as Home Assistant:
  every new entity's state topic carries a value once the agent runs a pipeline, and the connectivity
  sensor reads off when the agent stops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.home_automation import (
    DEVICE,
    HomeAutomation,
    PipelineView,
    discovery_components,
    discovery_payload,
    identity_of,
)
from agent.status import PipelineStatus
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import GOOD, agent_config, pipeline_body, publish_fleet_versions
from tests.ha_fixtures import Link, Recorder, Router, classifier, config_of, valid_discovery
from tests.ha_schema import check_device_discovery, entity_topics, unique_ids
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

CPU = "onnxruntime/CPUExecutionProvider"


def raw_pipeline(name: str) -> dict[str, Any]:
    return {**classifier(name), "postprocess": {"type": "raw"}}


def test_the_box_entities_fit_home_assistants_schema(tmp_path: Path) -> None:
    config = config_of(tmp_path, [classifier(), raw_pipeline("levels")], home_assistant={"enabled": True})
    views = [PipelineView.of(p) for p in config.pipelines]
    identity = identity_of(config)
    payload = discovery_payload(identity, discovery_components(views, identity, "edge"), {})
    assert check_device_discovery("homeassistant/device/box-1/config", payload) == []
    cmps = payload["cmps"]
    assert set(cmps) == {
        "signs__label", "signs__fps", "signs__backend", "levels__fps", "levels__backend",
        "_device__online", "_device__outbox_pending",
    }  # fmt: skip
    ids = unique_ids(payload)
    assert len(ids) == len(set(ids)) == 7
    # Connectivity: the retained status itself; no availability of its own, so offline reads "off".
    assert cmps["_device__online"] == {
        "p": "binary_sensor",
        "unique_id": "edge-agent__box-1___device__online",
        "name": "online",
        "state_topic": "edge/box-1/status",
        "qos": 1,
        "device_class": "connectivity",
        "entity_category": "diagnostic",
        "value_template": "{{ value_json.status }}",
        "payload_on": "online",
        "payload_off": "offline",
        "availability": [],
    }
    assert cmps["_device__outbox_pending"]["state_topic"] == "edge/box-1/state/_device/outbox_pending"
    assert cmps["_device__outbox_pending"]["state_class"] == "measurement"
    assert cmps["signs__fps"]["unit_of_measurement"] == "fps"
    assert cmps["levels__backend"]["state_topic"] == "edge/box-1/state/levels/backend"
    assert entity_topics(payload)["availability"] == {"edge/box-1/status"}


def _status(fps: float | None, backend: str | None) -> PipelineStatus:
    """A pipeline's status as the daemon knows it: running at `fps` on `backend`, or (no backend)
    being built, nothing running yet."""
    if backend is None:
        return PipelineStatus.from_json({"state": "starting", "phase": "building"})
    return PipelineStatus.from_json({"state": "running", "model": "m@1", "fps": fps, "backend": backend})


def test_fps_backend_and_the_backlog_follow_the_daemons_health(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    pipelines = [classifier(), raw_pipeline("levels")]
    config = config_of(tmp_path, pipelines, state_topics={"enabled": True})
    health: dict[str, Any] = {
        "pipelines": {"signs": _status(4.96, CPU), "levels": _status(None, None)},
        "pending": 3,
    }
    asked: list[int] = []

    def daemon_health() -> tuple[dict[str, Any], int]:
        asked.append(1)
        return health["pipelines"], health["pending"]

    link = Link()
    home = HomeAutomation(
        config, link, wanted=lambda: config.pipelines, running=lambda: [], health=daemon_health
    )
    home.start(Router())
    home.tick()
    assert sorted(link.take()) == [
        (f"edge/box-1/state/{DEVICE}/outbox_pending", b"3"),
        ("edge/box-1/state/signs/backend", CPU.encode()),
        ("edge/box-1/state/signs/fps", b"5.0"),
    ]
    # Within HEALTH_EVERY_S the daemon is not asked again; nothing changed is sent again.
    health["pending"] = 7
    home.tick()
    assert link.take() == [] and len(asked) == 1
    # A new connection: asked at once, and everything goes again (the broker may have lost it).
    health["pipelines"]["levels"] = _status(0.0, CPU)
    link.connects = 2
    home.tick()
    assert len(asked) == 2
    assert sorted(link.take()) == [
        (f"edge/box-1/state/{DEVICE}/outbox_pending", b"7"),
        ("edge/box-1/state/levels/backend", CPU.encode()),
        ("edge/box-1/state/levels/fps", b"0.0"),
        ("edge/box-1/state/signs/backend", CPU.encode()),
        ("edge/box-1/state/signs/fps", b"5.0"),
    ]
    # State topics off (a reload): the daemon is not asked any more and every value is cleared.
    home.use_config(config_of(tmp_path, pipelines))
    home.tick()
    assert len(asked) == 2
    assert sorted(link.take()) == [
        (f"edge/box-1/state/{DEVICE}/outbox_pending", b""),
        ("edge/box-1/state/levels/backend", b""),
        ("edge/box-1/state/levels/fps", b""),
        ("edge/box-1/state/signs/backend", b""),
        ("edge/box-1/state/signs/fps", b""),
    ]
    home.tick()
    assert link.take() == []


DEVICE_ID = "ha-box-2"
CONFIG = f"homeassistant/device/{DEVICE_ID}/config"
NEW = ("_device__online", "_device__outbox_pending", "signs__fps", "signs__backend")


@pytest.mark.slow
def test_a_real_agent_publishes_the_box_entities(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    signs = {**pipeline_body(GOOD, video[0], 5.0), "backend": {"prefer": [CPU]}}
    config = agent_config(
        tmp_path, DEVICE_ID, mosquitto.port, registry, {"signs": signs}, home_assistant={"enabled": True}
    )
    state_dir = tmp_path / DEVICE_ID / "state"
    ha = Recorder(mosquitto, "homeassistant/#", f"edge/{DEVICE_ID}/#")
    agent = start_agent(config)
    try:
        cmps = valid_discovery(ha, CONFIG, agent)["cmps"]
        assert set(NEW) <= set(cmps), sorted(cmps)
        topic = {cid: cmps[cid]["state_topic"] for cid in NEW}

        def last(cid: str) -> bytes:
            values = ha.on(topic[cid])
            return values[-1] if values else b""

        # Each new entity's state topic carries a value once the pipeline runs.
        wait_until(
            lambda: all(last(cid) for cid in NEW) and float(last("signs__fps")) > 0,
            "a value on every new entity's state topic, a frame rate above 0",
            timeout=90,
            state=lambda: f"{ {cid: last(cid)[:80] for cid in NEW} }\n{agent.log()[-2000:]}",
        )
        online = cmps["_device__online"]
        assert json.loads(last("_device__online"))["status"] == online["payload_on"]  # its value_template
        assert int(last("_device__outbox_pending")) >= 0
        served = read_status(state_dir)["pipelines"]["signs"]["backend"]
        assert last("signs__backend").decode() == served == CPU
        agent.stop()
        # The agent gone: its status says offline, which the connectivity sensor reads as off.
        wait_until(
            lambda: json.loads(last("_device__online"))["status"] == online["payload_off"],
            "the offline status",
            timeout=30,
        )
    finally:
        ha.close()
