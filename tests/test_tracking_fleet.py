"""Zones from the fleet (issue 27): a zone added by a desired-state document applies to the running
pipeline without ending its tracks: the real agent, a real broker, the real YOLOv8n face detector on
a still photo, the events read off the broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest

from agent.registry.file_registry import FileRegistry
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import agent_config, document, publish
from tests.media_fixtures import astronaut_bgr
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

DEVICE = "track-box"
# The astronaut's face, about [173, 82, 274, 180] in the 512x512 photo: its bottom centre (224, 180)
# is inside this zone (pixels), and outside the line's reach.
AROUND_FACE = {
    "name": "face-zone",
    "units": "pixels",
    "points": [[150, 60], [300, 60], [300, 220], [150, 220]],
}


def faces_pipeline(photos: Path, labels: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "model": {"name": "faces", "version": "1"},  # desired state names registry models
        "source": {"type": "video", "uri": str(photos), "fps": 4, "loop": True},
        "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        "postprocess": {"type": "detection", "score_threshold": 0.1, "labels": labels},
        "report": {"results": False},
        "track": {"max_lost_s": 5.0},
        **extra,
    }


def open_tracks(state_dir: Path) -> int:
    """The open tracks the running agent's status shows for `faces` (0 when not there yet)."""
    tracking = read_status(state_dir).get("pipelines", {}).get("faces", {}).get("tracking") or {}
    return int(tracking.get("tracks", 0))


def inferences(state_dir: Path) -> int:
    return int(read_status(state_dir).get("pipelines", {}).get("faces", {}).get("inferences", 0))


def events_of(subscriber: Subscriber) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in list(subscriber.messages)]


@pytest.mark.slow
def test_a_zone_from_the_fleet_applies_without_ending_the_tracks(
    tmp_path: Path, mosquitto: Mosquitto, yolo_path: Path, yolo_labels: list[str], start_agent: StartAgent
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    assert cv2.imwrite(str(photos / "astronaut.png"), astronaut_bgr())
    registry = tmp_path / "registry"
    FileRegistry(registry).publish(yolo_path, "faces", "1")
    body = faces_pipeline(photos, yolo_labels)
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry, {"faces": body})
    events = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/events/faces")
    state_dir = tmp_path / DEVICE / "state"
    agent = start_agent(config)
    try:
        wait_until(
            lambda: any(e["type"] == "new" for e in events_of(events)),
            "the face's track",
            timeout=120,
            state=lambda: agent.log()[-2000:],
        )
        face = next(e for e in events_of(events) if e["type"] == "new")["object"]
        assert face["label"] == "FACE_FEMALE" and face["zones"] == []

        with_zone = {"faces": faces_pipeline(photos, yolo_labels, zones=[AROUND_FACE])}
        publish(mosquitto, f"edge/{DEVICE}/desired", document(f"device:{DEVICE}", 1, with_zone))
        wait_until(
            # The enter and the zones update are two messages: wait for both, they may arrive apart.
            lambda: {"enter", "update"} <= {e["type"] for e in events_of(events)},
            "the face entering the zone the fleet added, and its update",
            timeout=120,
            state=lambda: agent.log()[-2000:],
        )
        seen = events_of(events)
        enter = next(e for e in seen if e["type"] == "enter")
        assert enter["zone"] == "face-zone" and enter["object"]["id"] == face["id"]
        # The same track all along: no end, no second `new`, seq without a gap.
        assert [e["type"] for e in seen if e["type"] in ("new", "end")] == ["new"]
        assert [e["seq"] for e in seen] == list(range(seen[0]["seq"], seen[0]["seq"] + len(seen)))
        update = next(e for e in seen if e["type"] == "update")
        assert update["object"]["zones"] == ["face-zone"] and update["changed"] == ["zones"]
        # Only reporting settings changed: the same session took them, nothing pulled, proven or
        # loaded again; once the change is committed (the old stage closed) the model runs on.
        wait_until(lambda: "pipeline faces: now running" in agent.log(), "the change committed", timeout=60)
        assert agent.log().count("loading 320n.onnx") == 1 and agent.log().count("proving backends") == 1
        done = inferences(state_dir)
        wait_until(lambda: inferences(state_dir) > done + 2, "frames after the commit", timeout=30)

        # A bad zone (its edges cross) is refused with where and why; the pipeline serves on as it was.
        crossed = {**AROUND_FACE, "points": [[150, 60], [300, 220], [300, 60], [150, 220]]}
        bad = {"faces": faces_pipeline(photos, yolo_labels, zones=[crossed])}
        publish(mosquitto, f"edge/{DEVICE}/desired", document(f"device:{DEVICE}", 2, bad))
        wait_until(
            lambda: (
                "desired state refused" in agent.log()
                and "zones[0].points: edge 0-1 meets edge 2-3" in agent.log()
            ),
            "the bad zone refused",
            timeout=60,
            state=lambda: agent.log()[-2000:],
        )
        count = len(events_of(events))
        wait_until(lambda: open_tracks(state_dir) >= 1, "the status still tracking the face", timeout=30)
        assert [e["type"] for e in events_of(events)[count:] if e["type"] in ("new", "end")] == []

        # A clean stop ends the open track, saying so (and leaves the zone first).
        agent.stop()
        wait_until(lambda: any(e["type"] == "end" for e in events_of(events)), "the track's end", timeout=30)
        tail = [(e["type"], e.get("reason")) for e in events_of(events)][-2:]
        assert tail == [("exit", "track ended"), ("end", "stopped")]
        assert events_of(events)[-1]["object"]["id"] == face["id"]
    finally:
        events.close()
