"""The motion gate seen from outside a running agent (`edge-agent run`: the real YOLOv8n face detector on
a looping rendered clip of the astronaut's face crossing the frame, then the empty scene; a real
mosquitto): `status --json` carries the gate's counters under `steps.motion`, `edge-agent status` shows
them in a line, the retained state topic `state/<pipeline>/motion` goes ON while the face moves and OFF
once the scene is still, Home Assistant gets a motion binary sensor for it, and the published results
carry `frames_gated`."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli.render.status import motion_line
from tests import media_fixtures
from tests.agent_process import EDGE_AGENT, StartAgent, cli_step_status
from tests.face_clip import faces_pipeline, write_clip
from tests.ha_schema import check_device_discovery
from tests.mosquitto import Mosquitto, Received, Subscriber
from tests.waits import wait_until

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

MOTION_TOPIC = "edge/gate-box/state/faces/motion"
CONFIG_TOPIC = "homeassistant/device/gate-box/config"


def test_the_motion_line_of_edge_agent_status() -> None:
    shown = {"motion": True, "frames_gated": 1520, "relearned": 2, "last_motion_at": 1000.0}
    line = motion_line("door", shown, now=1012.5).plain
    assert line == "door: motion ON, 1520 frames gated, 2 relearned (brightness jumps), last motion 12s ago"
    still = {"motion": False, "frames_gated": 7, "relearned": 0, "last_motion_at": None}
    assert motion_line("door", still).plain == "door: motion OFF, 7 frames gated"


def motion_payloads(messages: list[Received]) -> list[bytes]:
    return [m.payload for m in messages if m.topic == MOTION_TOPIC]


def gated_result(message: Received) -> bool:
    """A result that followed frames the gate skipped."""
    return message.topic == "edge/gate-box/results/faces" and json.loads(message.payload)["frames_gated"] > 0


@pytest.mark.slow
def test_a_running_agent_shows_its_motion_on_status_state_topic_and_home_assistant(
    tmp_path: Path,
    mosquitto: Mosquitto,
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
) -> None:
    clip = write_clip(tmp_path / "clip.mp4")  # 3 s of the face crossing, 1.5 s without it, looped
    pipeline = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip), "loop": True})
    # A background that forgets the face within ~0.7 s of it leaving: the 1.5 s without it are still.
    pipeline["motion"] = {"keepalive_s": 30, "learning_rate": 0.2}
    config = tmp_path / "agent.yaml"
    settings = {
        "device": {"id": "gate-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {
            "host": mosquitto.host,
            "port": mosquitto.port,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
        },
        "home_assistant": {"enabled": True},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [pipeline],
    }
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    subscriber = Subscriber(mosquitto.host, mosquitto.port, "#")
    try:
        agent = start_agent(config)
        # ON while the face crosses, OFF once its track ended and the grey scene is still (each loop).
        subscriber.wait_until(lambda got: b"OFF" in motion_payloads(got)[motion_payloads(got).index(b"ON") :]
                              if b"ON" in motion_payloads(got) else False, timeout=120)  # fmt: skip
        messages = subscriber.messages
        changes = [m for m in messages if m.topic == MOTION_TOPIC]
        assert all(m.payload in (b"ON", b"OFF") for m in changes)
        payloads = [m.payload for m in changes]
        assert all(a != b for a, b in itertools.pairwise(payloads)), "sent on a change only"

        configs = [m for m in messages if m.topic == CONFIG_TOPIC and m.payload]
        assert configs, "no discovery config"
        discovery = json.loads(configs[-1].payload)
        assert check_device_discovery(CONFIG_TOPIC, discovery) == []
        sensors = [
            c for c in discovery["cmps"].values() if c.get("stat_t", c.get("state_topic")) == MOTION_TOPIC
        ]
        assert len(sensors) == 1 and sensors[0]["p"] == "binary_sensor"
        assert sensors[0].get("dev_cla", sensors[0].get("device_class")) == "motion"

        subscriber.wait_until(lambda got: any(gated_result(m) for m in got), timeout=60)
        messages = subscriber.messages
        results = [json.loads(m.payload) for m in messages if m.topic == "edge/gate-box/results/faces"]
        assert results and all("frames_gated" in r for r in results)
        assert any(r["frames_gated"] > 0 for r in results), "a result after the still scene counts its skips"

        def gate() -> dict[str, Any] | None:
            return cli_step_status(config, "faces", "motion")

        wait_until(
            lambda: (gate() or {}).get("frames_gated", 0) > 0, "frames gated in status --json", timeout=60
        )
        shown = gate()
        assert shown is not None and set(shown) == {
            "motion",
            "frames_gated",
            "relearned",
            "last_motion_at",
            "mean_ms",
        }
        assert shown["last_motion_at"] is not None and shown["relearned"] == 0
        assert 0 < shown["mean_ms"] < 50  # the gate's own cost a frame (~0.1 ms here; a loaded box)

        table = subprocess.run(
            [EDGE_AGENT, "status", "-c", str(config)], capture_output=True, text=True, timeout=60, check=False
        )
        assert table.returncode == 0, table.stderr
        line = next((t for t in table.stdout.splitlines() if t.startswith("faces: motion")), None)
        assert line is not None, table.stdout
        assert re.fullmatch(r"faces: motion (ON|OFF), \d+ frames gated, last motion \d+s ago", line), line
        agent.stop()
    finally:
        subscriber.close()
