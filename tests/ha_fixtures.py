"""The Home Assistant tests' harness (tests/test_home_assistant*.py): agent configs with a classifier or a
detector pipeline; the daemon part on the interface it publishes through (a recording link, a router,
running pipelines); a plain MQTT client that records what Home Assistant would get, its discovery checked
against Home Assistant's schema; and docs/integrations.md's automations and Node-RED flow run over
real messages."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import AgentConfig, SnapshotRetentionConfig
from agent.events import EventWriter, TrackJournal
from agent.home_automation import HomeAutomation
from agent.mqtt import MqttConnection, Outbox
from agent.mqtt.router import Router as AgentRouter
from agent.results import ResultWriter
from agent.snapshots import SnapshotStore
from tests.agent_process import AgentProcess
from tests.ha_schema import check_device_discovery
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"

CONFIG_TOPIC = "homeassistant/device/box-1/config"


# --- configs ---------------------------------------------------------------------------------------


def config_of(tmp_path: Path, pipelines: list[dict[str, Any]], **top: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {"device": {"id": "box-1"}, "state_dir": str(tmp_path / "state"), "pipelines": pipelines, **top}
    )


def classifier(name: str = "signs", **home: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "/m.onnx"},
        "source": {"type": "video", "uri": "/v.mp4"},
        "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
        "home_automation": home,
    }


def detector(name: str = "yard", **home: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "/y.onnx"},
        "source": {"type": "video", "uri": "/cam.mp4"},
        "postprocess": {"type": "detection", "labels": ["person", "car", "dog cat"]},
        "home_automation": home,
    }


# --- the daemon part, on the interface it publishes through ---------------------------------------


class Link:
    """The MQTT connection's publish side, recording what is published (retained, QoS)."""

    def __init__(self) -> None:
        self.connected = True
        self.connects = 1
        self.sent: list[tuple[str, bytes, int, bool]] = []

    def publish_snapshot(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool:
        if not self.connected:
            return False
        self.sent.append((topic, payload, qos, retain))
        return True

    def stats(self) -> dict[str, Any]:
        return {"connects": self.connects}

    def take(self) -> list[tuple[str, bytes]]:
        assert all(qos == 1 and retain for _, _, qos, retain in self.sent), self.sent
        sent, self.sent = [(t, p) for t, p, _, _ in self.sent], []
        return sent


class Router:
    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}

    def route(self, topic_filter: str, handler: Any, qos: int = 1) -> Any:
        self.routes[topic_filter] = handler
        return lambda: self.routes.pop(topic_filter)


@dataclass
class Holder:
    """A running pipeline, as the state topics see it: its name."""

    name: str


def home_for(tmp_path: Path, pipelines: list[dict[str, Any]], holders: list[Holder] | None = None,
             **top: Any) -> tuple[HomeAutomation, Link, Router, list[dict[str, Any]]]:  # fmt: skip
    wanted = list(pipelines)
    (tmp_path / "state").mkdir(exist_ok=True)  # the daemon makes it first
    link, router = Link(), Router()
    config = config_of(tmp_path, wanted, **top)
    home = HomeAutomation(
        config,
        link,
        wanted=lambda: config_of(tmp_path, wanted, **top).pipelines,
        running=lambda: holders or [],
    )
    home.start(router)
    return home, link, router, wanted


# --- what Home Assistant, Node-RED and Telegraf get -----------------------------------------------


def doc_block(language: str, marker: str) -> str:
    """The fenced `language` block of docs/integrations.md that contains `marker`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{len(found)} {language} blocks with {marker!r} in {DOC}"
    return found[0]


def msg_get(msg: Mapping[str, Any], path: str) -> Any:
    """Node-RED's msg property path (`payload.output.top[0].label`, `.length` of arrays); KeyError."""
    value: Any = msg
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])]
        elif part == "length" and isinstance(value, list):
            value = len(value)
        else:
            value = value[part]
    return value


def run_flow(flow: list[dict[str, Any]], received: list[tuple[str, bytes]]) -> dict[str, list[Any]]:
    """The flow's mqtt-in, switch, change and debug nodes over real messages; returns what each debug
    node got. A change rule whose path is not in the message fails the test."""
    nodes = {n["id"]: n for n in flow}
    debug: dict[str, list[Any]] = {n["id"]: [] for n in flow if n["type"] == "debug"}

    def send(node_id: str, msg: dict[str, Any]) -> None:
        node = nodes[node_id]
        if node["type"] == "debug":
            debug[node_id].append(msg["payload"])
            return
        outputs: list[list[str]] = []
        if node["type"] == "switch":
            value = msg_get(msg, node["property"])
            for rule, wires in zip(node["rules"], node["wires"], strict=True):
                if rule["t"] == "hask":
                    hit = isinstance(value, dict) and rule["v"] in value
                else:
                    assert rule["t"] == "eq", rule
                    hit = value == rule["v"]
                if hit:
                    outputs.append(wires)
                    if node.get("checkall") == "false":
                        break
        elif node["type"] == "change":
            msg = dict(msg)
            for rule in node["rules"]:
                assert rule["t"] == "set" and rule["pt"] == rule["tot"] == "msg", rule
                try:
                    msg[rule["p"]] = msg_get(msg, rule["to"])
                except (KeyError, IndexError, TypeError):
                    raise AssertionError(f"{node['name']}: msg.{rule['to']} is not in {msg}") from None
            outputs = node["wires"]
        for wires in outputs:
            for target in wires:
                send(target, msg)

    for node in flow:
        if node["type"] != "mqtt in":
            continue
        matching = [(t, p) for t, p in received if mqtt.topic_matches_sub(node["topic"], t) and p]
        assert matching, f"no message on {node['topic']}"
        for topic, payload in matching:
            value: Any = json.loads(payload) if node["datatype"] == "json" else payload.decode()
            for wires in node["wires"]:
                for target in wires:
                    send(target, {"topic": topic, "payload": value})
    return {nodes[k]["name"]: v for k, v in debug.items()}


class Recorder:
    """A plain paho client subscribed to `filters` (returns once the broker acknowledged them),
    recording (topic, payload, retain) in order of arrival."""

    def __init__(self, broker: Mosquitto, *filters: str) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.subacks: list[int] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = lambda c, u, m: self.messages.append(
            (m.topic, bytes(m.payload), bool(m.retain))
        )
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.append(mid)
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()
        mids = []
        for topic_filter in filters:
            result, mid = self.client.subscribe(topic_filter, qos=1)
            assert result == mqtt.MQTT_ERR_SUCCESS
            mids.append(mid)
        wait_until(lambda: set(mids) <= set(self.subacks), f"SUBACKs for {filters}")

    def on(self, topic: str) -> list[bytes]:
        return [p for t, p, _ in list(self.messages) if t == topic]

    def matching(self, topic_filter: str) -> list[tuple[str, bytes]]:
        return [(t, p) for t, p, _ in list(self.messages) if mqtt.topic_matches_sub(topic_filter, t)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def valid_discovery(ha: Recorder, topic: str, agent: AgentProcess) -> dict[str, Any]:
    """The discovery config `ha` got on `topic` (waited for), checked against Home Assistant's schema."""
    wait_until(lambda: ha.on(topic), "the discovery config", timeout=60, state=lambda: agent.log()[-2000:])
    discovery: dict[str, Any] = json.loads(ha.on(topic)[-1])
    assert check_device_discovery(topic, discovery) == []
    return discovery


@dataclass
class HomeRig:
    """The daemon's Home Assistant wiring without its pipelines: a real connection to `mosquitto`, the
    outbox, HomeAutomation and the ResultWriter that feeds it (events journal, snapshots), as
    agent/daemon.py wires them; a test steps a Scene and hands the writer its results and snapshots."""

    config: AgentConfig
    outbox: Outbox
    conn: MqttConnection
    home: HomeAutomation
    snapshots: SnapshotStore
    writer: ResultWriter

    def close(self) -> None:
        self.conn.stop()
        self.outbox.close()


def home_rig(tmp_path: Path, mosquitto: Mosquitto, device: str, pipelines: list[dict[str, Any]]) -> HomeRig:
    """A HomeRig for `device` with `pipelines` (the first one is `Holder`'s running pipeline); not
    connected yet (`rig.conn.start()`)."""
    config = AgentConfig.model_validate(
        {
            "device": {"id": device},
            "state_dir": str(tmp_path / "state"),
            "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "reconnect_min_s": 0.1},
            "home_assistant": {"enabled": True},
            "pipelines": pipelines,
        }
    )
    (tmp_path / "state").mkdir()
    outbox = Outbox(tmp_path / "outbox.db")
    conn = MqttConnection(
        config.mqtt, device, outbox, lambda: b'{"status": "online"}', lambda: b'{"status": "offline"}'
    )
    running = [Holder(config.pipelines[0].name)]
    home = HomeAutomation(config, conn, wanted=lambda: config.pipelines, running=lambda: running)
    home.start(AgentRouter(conn))
    snapshots = SnapshotStore(tmp_path / "state" / "snapshots", SnapshotRetentionConfig())
    writer = ResultWriter(
        device,
        "edge",
        config.mqtt.max_payload_bytes,
        outbox,
        conn.notify_new_message,
        events=EventWriter(device, "edge", outbox, TrackJournal(tmp_path / "state" / "tracks")),
        snapshots=snapshots,
        observer=home.observe,  # as the daemon wires them
        scene_observer=home.observe_scene,
        snapshot_observer=home.observe_snapshot,
    )
    return HomeRig(config, outbox, conn, home, snapshots, writer)
