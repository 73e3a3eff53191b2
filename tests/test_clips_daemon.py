"""Event clips from outside a running agent (`edge-agent run`: the real YOLOv8n face detector on a looping
rendered clip of the astronaut's face crossing the frame, then the empty scene; a real mosquitto): the
events on MQTT name a clip, the clip is an H.264 MP4 under <state_dir>/clips/<pipeline>, beside the
snapshots, and `status --json` counts it under `steps.clips`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.clips import clip_path
from tests import media_fixtures
from tests.agent_process import EDGE_AGENT, StartAgent
from tests.face_clip import faces_pipeline, write_clip
from tests.mosquitto import Mosquitto, Received, Subscriber
from tests.waits import wait_until

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

EVENTS = "edge/clip-box/events/faces"


def ends_with_clips(messages: list[Received]) -> list[dict[str, Any]]:
    events = [json.loads(m.payload) for m in messages if m.topic == EVENTS]
    return [e for e in events if e["type"] == "end" and "clip" in e]


@pytest.mark.slow
def test_a_running_agents_events_name_their_clip_and_the_clip_is_on_disk(
    tmp_path: Path, mosquitto: Mosquitto, yolo_path: Path, yolo_labels: list[str], start_agent: StartAgent
) -> None:
    clip = write_clip(tmp_path / "clip.mp4")  # 3 s of the face crossing, 1.5 s without it, looped
    pipeline = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip), "loop": True})
    # The track ends 1 s after the face left; 0.3 s later the clip closes, before the face is back.
    pipeline["clips"] = {"enabled": True, "pre_s": 1, "post_s": 0.3}
    config = tmp_path / "agent.yaml"
    state = tmp_path / "state"
    settings = {
        "device": {"id": "clip-box"},
        "state_dir": str(state),
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "reconnect_min_s": 0.2},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [pipeline],
    }
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    subscriber = Subscriber(mosquitto.host, mosquitto.port, "#")
    try:
        start_agent(config)
        subscriber.wait_until(lambda got: bool(ends_with_clips(got)), timeout=120)
        end = ends_with_clips(subscriber.messages)[0]
        events = [json.loads(m.payload) for m in subscriber.messages if m.topic == EVENTS]
        new = next(e for e in events if e["type"] == "new" and e["object"]["id"] == end["object"]["id"])
        assert new["clip"] == end["clip"]
        path = clip_path(state / "clips" / "faces", end["clip"])
        assert path is not None
        wait_until(path.is_file, f"the clip {path}", timeout=30)  # (ffmpeg finishes it after post_s)
        probe = subprocess.run(
            ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=codec_name,pix_fmt",
             "-of", "json", str(path)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert json.loads(probe.stdout)["streams"][0] == {"codec_name": "h264", "pix_fmt": "yuv420p"}

        def clips_status() -> dict[str, Any]:
            done = subprocess.run(
                [EDGE_AGENT, "status", "-c", str(config), "--json"],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            shown: dict[str, Any] = json.loads(done.stdout)["pipelines"]["faces"]["steps"]["clips"]
            return shown

        wait_until(lambda: clips_status()["clips"] >= 1, "the clip counted in the status", timeout=30)
        assert clips_status()["encoder"] == "libx264"
    finally:
        subscriber.close()
