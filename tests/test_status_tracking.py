"""`edge-agent status` for a tracking pipeline: under the pipelines' table, one line per tracking
pipeline with its tracks now, each zone's occupancy (per label; dwelling and overcrowded only when
so) and each line's crossings per direction (agent/cli/render/status.py, from the pipeline status's
`tracking`, which is `Scene.summary()`).

The renderer on status documents written here, then a real `edge-agent run` (the real YOLOv8n face
detector on a looping rendered clip of a real photo's face crossing a line into a zone, a real
mosquitto): `status --json` carries the scene as the pipeline reports it, and `status` shows it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli.render.status import render
from tests import media_fixtures
from tests.agent_process import EDGE_AGENT, StartAgent
from tests.face_clip import faces_pipeline, write_clip
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels


def rendered(status: dict[str, Any]) -> list[str]:
    from rich.console import Console

    console = Console(width=300, record=True, color_system=None)
    with console.capture() as capture:
        console.print(render(status))
    return [line.rstrip() for line in capture.get().splitlines()]


def pipeline(**extra: Any) -> dict[str, Any]:
    return {"state": "running", "phase": "running", "model": "det@3", "backend": "onnxruntime/CPU", **extra}


def test_a_tracking_pipeline_shows_its_tracks_zone_occupancy_and_line_counts() -> None:
    tracking = {
        "tracks": 4,
        "started": 19,
        "ended": 15,
        "zones": {
            "loading-bay": {
                "count": 3,
                "labels": {"car": 1, "person": 2},
                "dwelling": 1,
                "overcrowded": True,
            },
            "door": {"count": 0, "labels": {}, "dwelling": 0, "overcrowded": False},
        },
        "lines": {"gate": {"in": 12, "out": 9}, "street": {"northbound": 0, "southbound": 2}},
    }
    lines = rendered({"pipelines": {"yard": pipeline(tracking=tracking), "signs": pipeline()}})
    assert (
        "yard: 4 tracks; zone loading-bay 3 inside (car 1, person 2), 1 dwelling, overcrowded; "
        "zone door 0 inside; line gate in 12, out 9; line street northbound 0, southbound 2"
    ) in lines
    # A pipeline that does not track has no such line; the table still lists both.
    assert not [line for line in lines if line.startswith("signs:")]
    assert any(re.match(r"^\s*yard\s+running", line) for line in lines)
    assert any(re.match(r"^\s*signs\s+running", line) for line in lines)


def test_tracking_without_zones_or_lines_is_the_tracks_alone() -> None:
    tracking = {"tracks": 1, "started": 1, "ended": 0, "zones": {}, "lines": {}}
    assert "cam: 1 track" in rendered({"pipelines": {"cam": pipeline(tracking=tracking)}})
    empty = {"tracks": 0, "started": 0, "ended": 0, "zones": {}, "lines": {}}
    assert "cam: 0 tracks" in rendered({"pipelines": {"cam": pipeline(tracking=empty)}})


@pytest.mark.slow
def test_a_running_agents_status_carries_and_shows_its_scene(
    tmp_path: Path,
    mosquitto: Mosquitto,
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
) -> None:
    clip = write_clip(tmp_path / "clip.mp4")  # 3 s of the face crossing, 1.5 s without it, looped
    source = {"type": "video", "uri": str(clip), "loop": True}
    config = tmp_path / "agent.yaml"
    settings = {
        "device": {"id": "tracking-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {
            "host": mosquitto.host,
            "port": mosquitto.port,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
        },
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [faces_pipeline(yolo_path, yolo_labels, source)],
    }
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    agent = start_agent(config)

    def status(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EDGE_AGENT, "status", "-c", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def scene() -> dict[str, Any] | None:
        done = status("--json")
        if done.returncode != 0:
            return None
        tracking: dict[str, Any] | None = json.loads(done.stdout)["pipelines"]["faces"].get("tracking")
        return tracking

    def crossed() -> bool:
        found = scene()
        # (before the first frame the scene has no frame size to place its zones and lines in)
        return bool(found and found["lines"].get("middle", {}).get("eastbound", 0) >= 1)

    wait_until(crossed, "the face crossing the line, in status --json", timeout=180)
    tracking = scene()
    assert tracking is not None
    assert set(tracking) == {"tracks", "started", "ended", "zones", "lines"}
    assert tracking["started"] >= 1 and tracking["lines"]["middle"]["westbound"] == 0
    assert set(tracking["zones"]["right"]) == {"count", "labels", "dwelling", "overcrowded"}
    assert tracking["zones"]["right"]["overcrowded"] is False

    table = status()
    assert table.returncode == 0, table.stderr
    line = next((text for text in table.stdout.splitlines() if text.startswith("faces: ")), None)
    assert line is not None, table.stdout
    zone = r"zone right [01] inside( \(FACE_FEMALE 1\))?"
    assert re.fullmatch(rf"faces: \d+ tracks?; {zone}; line middle eastbound \d+, westbound 0", line), line
    agent.stop()
