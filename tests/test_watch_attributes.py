"""`edge-agent watch --events` shows what second models read on the objects (agent/cli/render/watch.py):
the real console script against a real mosquitto, the events made by a real scene
(agent/processing/scene.py) whose object got its attributes as the attributes step puts them, published
as the agent publishes them; --json passes them through untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.config import LineConfig, TrackConfig
from agent.processing.scene import Scene
from tests.mosquitto import Mosquitto
from tests.test_watch import DEVICE, Watching, publish, write_config

GATE = LineConfig(name="gate", units="pixels", points=[(600, 0), (600, 1000)])


def scene_events() -> list[dict[str, Any]]:
    """A plate driving east across the gate, read (text, direction, an embedding) before it crosses."""
    scene = Scene(TrackConfig(min_hits=1), [], [GATE])
    events: list[dict[str, Any]] = []
    for i in range(30):
        x = 450 + 10 * i
        scene.step([{"box": [x - 30, 680, x + 30, 800], "score": 0.9, "label": "plate"}], i / 10, 1000, 1000)
        if i == 3:
            at = "2026-11-29T07:00:00.300Z"
            scene.set_attribute(1, "text", {"value": "KX42 BRT", "score": 0.9712, "at": at, "runs": 1})
            scene.set_attribute(1, "direction", {"value": "180", "score": 0.88, "at": at, "runs": 1})
            scene.set_attribute(1, "face", {"value": [0.6, 0.8], "score": None, "at": at, "runs": 1})
        events += scene.take_events()
    return [{"device": DEVICE, "pipeline": "gate-cam", "seq": n, **e} for n, e in enumerate(events, 1)]


def test_events_lines_carry_the_objects_attributes_and_json_passes_them_through(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    events = scene_events()
    assert [e["type"] for e in events] == ["new", "update", "cross", "update"]
    config = write_config(tmp_path, mosquitto.port)
    lines = Watching(tmp_path, "-c", str(config), "--events", "--count", str(len(events)))
    as_json = Watching(tmp_path, "-c", str(config), "--events", "--json", "--count", str(len(events)))
    lines.subscribed()
    as_json.subscribed()
    for event in events:
        publish(mosquitto, f"edge/{DEVICE}/events/gate-cam", event)
    assert lines.finish() == 0, lines.stderr()
    assert as_json.finish() == 0, as_json.stderr()
    read = "[text=KX42 BRT 0.97, direction=180 0.88, face=<2 values>]"
    assert [text.split(" ", 1)[1] for text in lines.lines] == [
        "event  gate-cam: new plate #1 (score 0.90) [seq 1]",
        f"event  gate-cam: update plate #1 {read} (attributes) [seq 2]",
        f"event  gate-cam: line gate in: cross plate #1 {read} (count 1) [seq 3]",
        f"event  gate-cam: update plate #1 {read} (crossings) [seq 4]",
    ]
    assert [json.loads(text)["payload"] for text in as_json.lines] == events
    assert events[2]["object"]["attributes"]["text"] == {
        "value": "KX42 BRT", "score": 0.9712, "at": "2026-11-29T07:00:00.300Z", "runs": 1
    }  # fmt: skip
