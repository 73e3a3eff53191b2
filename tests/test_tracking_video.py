"""Tracking end to end (issue 27's acceptance test): a rendered video with known ground truth, the real
YOLOv8n face detector (nudenet's 320n.onnx), the real daemon (`edge-agent run`), a real mosquitto;
the events read off the broker and counted exactly.

The video (640x480, 10 fps, 16 s, MJPG): copies of the astronaut's face (FACE_FEMALE, ~0.8) walk
across a plain background on known paths (`WALKS`, in seconds and pixels of each face's centre). The
source plays it at its own 10 fps, so the pipeline's times (dwell_s, max_lost_s) are the video's.

    A   appears top right, walks down-left and crosses the gate downwards (`down`);
    B   appears bottom middle, walks up-left, faster, and crosses the gate upwards (`up`). The two
        paths cross (an X below the gate): B goes through the crossing point first, A 1.5 s later;
        they pass each other (the same height at t = 2.56 s) side by side, their faces touching;
    C   appears top middle, walks down across the gate into the bench, leaves the picture at its
        bottom edge, is out of it for ~2 s (longer than max_lost_s: its track ends, `lost`), comes
        back from the bottom edge as a new track and walks up across the gate (`up`) to where it began;
    D   appears in the bench and stands still there for 7.5 s (longer than dwell_s: a `dwell`).

Zones and line (`ZONES`, `LINES`; anchors: the bottom centre of each face's box):

    gate      y = 0.5, drawn left to right: `up` (in) is moving up the picture, `down` (out) down;
    entrance  the top band (x <= 0.8, y <= 0.45): A, B, C and C again are in it once each;
    bench     the bottom right (x >= 0.625, y >= 0.6), dwell_s 4.5, max_objects 1: D stands in it,
              C walks through it twice while D is there (overcrowded twice), C's first visit ends
              with its track (the face left the picture while in the bench).

The tests: the ground truth checked with the detector on every decoded frame; the whole video through
the daemon, every event, the status's tracking counts and the snapshots checked; and an agent killed
(SIGKILL) with tracks open and events still in its outbox, then restarted: nothing lost, the open
tracks ended as `restarted`, no id used twice.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from agent.config import DetectionPostprocess, PreprocessConfig, ResizeConfig, TrackConfig
from agent.processing import Preprocessor, build_postprocessor
from providers import ModelArtifact, get_backend
from tests.agent_process import EDGE_AGENT, AgentProcess, StartAgent, read_status
from tests.media_fixtures import SCRIPTS_DIR, iou
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

if str(SCRIPTS_DIR) not in sys.path:  # scripts/ is not a package
    sys.path.insert(0, str(SCRIPTS_DIR))
import make_tracking_video  # the walker clips' renderer and their geometric truth
from make_tracking_video import Truth

DEVICE = "track-cam"
PIPELINE = "hall"
EVENTS_TOPIC = f"edge/{DEVICE}/events/{PIPELINE}"
FPS = 10
WIDTH, HEIGHT = 640, 480
DURATION_S = 16.0
LABEL = "FACE_FEMALE"
TRACK_DEFAULTS = TrackConfig()  # the pipelines' `track:` keeps the defaults (max_lost_s 1 s, ...)

# --- the video and its ground truth ------------------------------------------------------------------

# Each face's centre: (t seconds, x, y) key points, straight lines between them. A face is drawn
# from its first key point's time until its last one's; a centre beyond the frame's edge is drawn cut
# (C leaves at the bottom: its centre at y 570 is wholly out of the picture).
WALKS: dict[str, list[tuple[float, float, float]]] = {
    "A": [(0.5, 470, 70), (1.0, 470, 70), (4.0, 270, 400), (4.5, 270, 400)],
    "B": [(1.0, 350, 410), (1.5, 350, 410), (3.5, 150, 90), (4.0, 150, 90)],
    "C": [
        (4.5, 430, 90),
        (5.0, 430, 90),
        (8.2, 430, 570),
        (10.0, 430, 570),
        (13.2, 430, 90),
        (13.6, 430, 90),
    ],
    "D": [(5.0, 578, 390), (12.5, 578, 390)],
}
GATE: dict[str, Any] = {"name": "gate", "points": [[0.0, 0.5], [1.0, 0.5]], "in": "up", "out": "down"}
ENTRANCE: dict[str, Any] = {
    "name": "entrance",
    "points": [[0, 0], [0.8, 0], [0.8, 0.45], [0, 0.45]],
    "min_frames": 2,
}
BENCH: dict[str, Any] = {
    "name": "bench",
    "points": [[0.625, 0.6], [1, 0.6], [1, 1], [0.625, 1]],
    "min_frames": 2,
    "dwell_s": 4.5,
    "max_objects": 1,
}
ZONES = [ENTRANCE, BENCH]
LINES = [GATE]

# What each track did, as its `end` event tells (entered_zones in order, crossings as line/direction).
# C is two tracks: it left the picture for longer than max_lost_s.
EXPECTED_TRACKS = {
    "A": (("entrance",), (("gate", "down"),)),
    "B": (("entrance",), (("gate", "up"),)),
    "C, first visit": (("entrance", "bench"), (("gate", "down"),)),
    "C, second visit": (("bench", "entrance"), (("gate", "up"),)),
    "D": (("bench",), ()),
}


CLIP = make_tracking_video.Clip(WALKS, DURATION_S, WIDTH, HEIGHT, FPS)


def background() -> np.ndarray:
    return make_tracking_video.background(WIDTH, HEIGHT)


def render(path: Path) -> list[Truth]:
    """Write the video (scripts/make_tracking_video.py: MJPG in AVI, the astronaut's face on each
    walk) and return each frame's ground truth."""
    return make_tracking_video.render(path, CLIP)


def decoded_frames(path: Path) -> list[np.ndarray]:
    """Every frame as the daemon's source reads it (OpenCV's FFmpeg backend)."""
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    assert capture.isOpened(), path
    try:
        assert capture.get(cv2.CAP_PROP_FPS) == pytest.approx(FPS)
        frames = []
        for _ in range(round(DURATION_S * FPS) + 10):  # bounded: the file has DURATION_S * FPS
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame)
        return frames
    finally:
        capture.release()


@pytest.fixture(scope="module")
def walking_faces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Truth]]:
    path = tmp_path_factory.mktemp("video") / "walking-faces.avi"
    return path, render(path)


# --- the ground truth, checked with the detector -------------------------------------------------------


def ground_truth_tracks(truth: list[Truth]) -> dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]]:
    """What each face's anchor (its box's bottom centre, the part in the picture) did on each visit (a
    face out of the picture for a while comes back as another visit): the zones it was in, in order
    of entering, and its gate crossings. Plain geometry (make_tracking_video.visits): the zones are
    rectangles, the gate a straight line."""
    found = make_tracking_video.visits(truth, CLIP, ZONES, LINES)
    visits_of, tracks = Counter(v.name for v in found), {}
    for i, visit in enumerate(found):
        nth = sum(v.name == visit.name for v in found[:i])  # its earlier visits
        key = visit.name if visits_of[visit.name] == 1 else f"{visit.name}, {('first', 'second')[nth]} visit"
        tracks[key] = (tuple(visit.entered), tuple(visit.crossings))
    return tracks


def test_the_ground_truth_makes_the_expected_tracks(walking_faces: tuple[Path, list[Truth]]) -> None:
    path, truth = walking_faces
    frames = decoded_frames(path)
    assert len(frames) == len(truth) == DURATION_S * FPS
    assert all(frame.shape == (HEIGHT, WIDTH, 3) for frame in frames)
    assert ground_truth_tracks(truth) == EXPECTED_TRACKS
    # The faces come close but never cover each other: at most a sliver where A and B pass.
    for t in truth:
        boxes = [np.array(b) for b in t.faces.values()]
        assert all(iou(a, b) < 0.02 for i, a in enumerate(boxes) for b in boxes[i + 1 :]), t
    # A and B pass each other between frames 25 and 26 (t = 2.56 s), side by side: B's face's right
    # edge within 2 px of A's face's left edge.
    (a25, b25), (a26, b26) = ((t.faces["A"], t.faces["B"]) for t in truth[25:27])
    assert a25[1] < b25[1] and a26[1] > b26[1], (a25, b25, a26, b26)
    assert abs(a25[0] - b25[2]) < 2 and abs(a26[0] - b26[2]) < 2, (a25, b25, a26, b26)


def test_the_detector_sees_every_face_of_the_video(
    walking_faces: tuple[Path, list[Truth]], yolo_path: Path, yolo_labels: list[str]
) -> None:
    """On every decoded frame, in-process (the pipeline's own preprocessing and postprocessing): each
    face wholly in the picture is found as FACE_FEMALE scoring at least new_track_score (0.6) on its
    true box, and nothing else is found anywhere (not even at score 0.1)."""
    path, truth = walking_faces
    frames = decoded_frames(path)
    session = get_backend("onnxruntime/CPUExecutionProvider").load(ModelArtifact(yolo_path, "onnx", "0" * 64))
    try:
        resize = ResizeConfig(width=320, height=320, mode="letterbox")
        preprocess = Preprocessor(PreprocessConfig(resize=resize, color="rgb"), session.inputs)
        postprocess = build_postprocessor(
            DetectionPostprocess(type="detection", score_threshold=0.1, labels=yolo_labels), session.outputs
        )

        def detect(frame: np.ndarray) -> list[dict[str, Any]]:
            tensor, geometry = preprocess.prepare(frame)
            found: list[dict[str, Any]] = postprocess(session.run({"images": tensor}), geometry)["detections"]
            return found

        assert detect(background()) == []
        missed, strays = [], []
        for t, frame in zip(truth, frames, strict=True):
            found = detect(frame)
            for name, box in t.faces.items():
                hits = [d for d in found if iou(np.array(d["box"]), np.array(box)) >= 0.6]
                if t.whole[name] and not any(d["label"] == LABEL and d["score"] >= 0.6 for d in hits):
                    missed.append((t.index, name, [round(v) for v in box], found))
            for d in found:
                if all(iou(np.array(d["box"]), np.array(box)) < 0.3 for box in t.faces.values()):
                    strays.append((t.index, d))
    finally:
        session.close()
    assert missed == [] and strays == []


# --- the daemon ------------------------------------------------------------------------------------------


def write_config(
    tmp_path: Path, port: int, video: Path, yolo_path: Path, labels: list[str], track: dict[str, Any]
) -> Path:
    pipeline = {
        "name": PIPELINE,
        "model": {"path": str(yolo_path)},
        "source": {"type": "video", "uri": str(video), "loop": False},  # at its own 10 fps
        "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        # 0.1: the low-score detections reach the tracker (ByteTrack's second matching stage).
        "postprocess": {"type": "detection", "score_threshold": 0.1, "labels": labels},
        "report": {"results": False},  # events only
        "track": track,
        "zones": ZONES,
        "lines": LINES,
    }
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "telemetry": {"interval_s": 0},
        "pipelines": [pipeline],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Events:
    """The pipeline's events as subscribers got them: each event once (QoS 1 may deliver one twice:
    the same `id`, which must then be the same message), in `seq` order. `resubscribe` adds a fresh
    subscriber (after a broker restart) to those whose messages count."""

    def __init__(self, broker: Mosquitto) -> None:
        self.subscribers = [Subscriber(broker.host, broker.port, EVENTS_TOPIC)]

    def resubscribe(self, broker: Mosquitto) -> None:
        self.subscribers.append(Subscriber(broker.host, broker.port, EVENTS_TOPIC))

    def all(self) -> list[dict[str, Any]]:
        by_id: dict[str, dict[str, Any]] = {}
        for message in (m for subscriber in self.subscribers for m in subscriber.messages):
            assert message.topic == EVENTS_TOPIC and not message.retain
            event = json.loads(message.payload)
            assert by_id.setdefault(event["id"], event) == event, event
        return sorted(by_id.values(), key=lambda e: int(e["seq"]))

    def close(self) -> None:
        for subscriber in self.subscribers:
            subscriber.close()


@pytest.fixture
def events(mosquitto: Mosquitto) -> Iterator[Events]:
    subscriber = Events(mosquitto)
    yield subscriber
    subscriber.close()


def stored_events(state_dir: Path) -> list[dict[str, Any]]:
    """The events the outbox holds (stored, not yet acknowledged by the broker), read-only."""
    with sqlite3.connect(f"file:{state_dir / 'outbox.sqlite'}?mode=ro", uri=True, timeout=30) as db:
        table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages'")
        if table.fetchone() is None:  # the daemon has not created it yet
            return []
        rows = db.execute("SELECT payload FROM messages WHERE topic = ? ORDER BY id", (EVENTS_TOPIC,))
        return [json.loads(payload) for (payload,) in rows]


def check_sequence(events: list[dict[str, Any]]) -> None:
    """One sequence per pipeline from 1, no gap and no number twice; every event of this device and
    pipeline, of a known type."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = {"new", "update", "end", "enter", "exit", "dwell", "overcrowded", "cross"}
    assert all(e["device"] == DEVICE and e["pipeline"] == PIPELINE and e["type"] in kinds for e in events)


def track_ids(events: list[dict[str, Any]], kind: str) -> list[int]:
    return [int(e["object"]["id"]) for e in events if e["type"] == kind]


def check_every_track_ends_once(events: list[dict[str, Any]]) -> None:
    """Each track: one `new`, its events after it, one `end` last; the label never changes."""
    news, ends = track_ids(events, "new"), track_ids(events, "end")
    assert len(set(news)) == len(news) and sorted(news) == sorted(ends), (news, ends)
    for track in news:
        mine = [e for e in events if e.get("object", {}).get("id") == track]
        assert mine[0]["type"] == "new" and mine[-1]["type"] == "end", [e["type"] for e in mine]
        assert {e["object"]["label"] for e in mine} == {LABEL}


def summary(event: dict[str, Any]) -> tuple[Any, ...]:
    """An event without its times and ids: what it says happened."""
    kind = event["type"]
    if kind == "cross":
        return (kind, event["line"], event["direction"])
    if kind == "exit":
        return (kind, event["zone"], event["reason"])
    if kind == "overcrowded":
        return (kind, event["zone"], event["state"], event["count"], event["max_objects"])
    if kind in ("enter", "dwell"):
        return (kind, event["zone"])
    return (kind, event.get("reason"))


def seconds(at: str) -> float:
    """An event's UTC time (ISO 8601 with Z) as seconds since the epoch."""
    assert at.endswith("Z"), at
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def signature(end: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """A track's zones entered and lines crossed, in order, as its `end` event tells."""
    described = end["object"]
    crossings = tuple((c["line"], c["direction"]) for c in described["crossings"])
    assert described["crossings_total"] == len(crossings)
    return tuple(described["entered_zones"]), crossings


# Everything the video makes happen, each event as `summary` gives it (new and end: one per track).
EXPECTED_EVENTS = Counter(
    {
        ("cross", "gate", "down"): 2,  # A, C's first visit
        ("cross", "gate", "up"): 2,  # B, C's second visit
        ("enter", "entrance"): 4,  # A, B, C twice
        ("exit", "entrance", "left"): 2,  # A and C walk out of it
        ("exit", "entrance", "track ended"): 2,  # B and C (second visit) vanish in it
        ("enter", "bench"): 3,  # D, C twice
        ("exit", "bench", "left"): 1,  # C's second visit walks out of it
        ("exit", "bench", "track ended"): 2,  # C left the picture from it; D vanishes in it
        ("dwell", "bench"): 1,  # D: 7.5 s on the bench; C's visits are shorter than dwell_s
        ("overcrowded", "bench", "start", 2, 1): 2,  # C with D on the bench, twice
        ("overcrowded", "bench", "end", 1, 1): 2,
    }
)
QUIET_ZONE = {"count": 0, "labels": {}, "dwelling": 0, "overcrowded": False}


@pytest.mark.slow
def test_a_video_s_tracks_zones_and_lines_are_counted_exactly(
    tmp_path: Path,
    mosquitto: Mosquitto,
    events: Events,
    walking_faces: tuple[Path, list[Truth]],
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
) -> None:
    """The whole video through the daemon: every event off the broker, counted (EXPECTED_EVENTS) and
    per track (EXPECTED_TRACKS); the status's zone occupancy and line counts as the video went and at
    its end (over the control socket and `edge-agent status --json`); each track's snapshot."""
    video, truth = walking_faces
    config = write_config(
        tmp_path, mosquitto.port, video, yolo_path, yolo_labels, {"snapshots": {"enabled": True}}
    )
    state_dir = tmp_path / "state"
    results = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/#")
    agent = start_agent(config)
    scenes: list[dict[str, Any]] = []  # the pipeline's tracking status, as often as we could ask

    def played_through() -> bool:
        status = read_status(state_dir).get("pipelines", {}).get(PIPELINE, {})
        if "tracking" in status and (not scenes or scenes[-1] != status["tracking"]):
            scenes.append(status["tracking"])
        got = events.all()
        news, ends = track_ids(got, "new"), track_ids(got, "end")
        finished = status.get("state") == "finished"
        return finished and len(news) >= len(EXPECTED_TRACKS) and news == sorted(ends)

    try:
        wait_until(
            played_through,
            "the video played through and every track's end",
            timeout=180,
            interval=0.2,
            state=lambda: f"{[summary(e) for e in events.all()]}\n{agent.log()[-3000:]}",
        )
        final = read_status(state_dir)["pipelines"][PIPELINE]["tracking"]
        cli = subprocess.run(
            [EDGE_AGENT, "status", "--json", "-c", str(config)], capture_output=True, timeout=60, check=True
        )
        assert json.loads(cli.stdout)["pipelines"][PIPELINE]["tracking"] == final
        agent.stop()
    finally:
        results.close()
    got = events.all()
    check_sequence(got)
    check_every_track_ends_once(got)

    # Five tracks (C is two: it was away longer than max_lost_s), ids 1.. in order of appearance; the
    # issue allows one id switch where A and B pass each other: one track more, nothing else changes.
    tracks = track_ids(got, "new")
    assert len(EXPECTED_TRACKS) <= len(tracks) <= len(EXPECTED_TRACKS) + 1
    assert tracks == list(range(1, len(tracks) + 1))
    said = Counter(summary(e) for e in got if e["type"] != "update")
    assert said == EXPECTED_EVENTS + Counter({("new", None): len(tracks), ("end", "lost"): len(tracks)})
    # Each direction counted on: A down, B up, C down, C (back) up.
    assert [(e["direction"], e["count"]) for e in got if e["type"] == "cross"] == [
        ("down", 1), ("up", 1), ("down", 2), ("up", 2)
    ]  # fmt: skip
    assert [e["state"] for e in got if e["type"] == "overcrowded"] == ["start", "end", "start", "end"]

    # Per track, as its `end` tells: C's visits and D exactly; A and B so too unless their ids switched.
    ends = {int(e["object"]["id"]): e for e in got if e["type"] == "end"}
    signatures = Counter(signature(end) for end in ends.values())
    for name in ("C, first visit", "C, second visit", "D"):
        assert signatures[EXPECTED_TRACKS[name]] == 1, (name, signatures)
    if len(tracks) == len(EXPECTED_TRACKS):  # (A and B swapping ids would be two switches: refused)
        assert signatures == Counter(EXPECTED_TRACKS.values())
    # Every track ends out of every zone; lost: unseen for max_lost_s, ended at a frame soon after.
    for end in ends.values():
        assert end["object"]["zones"] == [] and end["object"]["dwell_s"] == {}, end
        unseen_s = round(seconds(end["at"]) - seconds(end["object"]["last_seen"]), 3)  # (times in ms)
        assert TRACK_DEFAULTS.max_lost_s <= unseen_s < TRACK_DEFAULTS.max_lost_s + 1.0, end
    # An object's zone and line events come with its `update` (or its `end`) of the same frame.
    changes = {"enter": "zones", "exit": "zones", "cross": "crossings"}
    for event in (e for e in got if e["type"] in changes):
        same = event["object"]["id"]
        follow = next(e for e in got if e["seq"] > event["seq"] and e.get("object", {}).get("id") == same)
        assert follow["at"] == event["at"] and follow["type"] in ("update", "end"), (event, follow)
        assert follow["type"] == "end" or changes[event["type"]] in follow["changed"], (event, follow)
    # The dwell is D's, once it had been on the bench dwell_s; D's stay ends with its track.
    (dwell,) = [e for e in got if e["type"] == "dwell"]
    d = int(dwell["object"]["id"])
    assert signature(ends[d]) == EXPECTED_TRACKS["D"] and dwell["stayed_s"] >= BENCH["dwell_s"]
    (d_exit,) = [e for e in got if e["type"] == "exit" and e["object"]["id"] == d]
    assert d_exit["reason"] == "track ended" and d_exit["stayed_s"] > dwell["stayed_s"]

    # The status: occupancy and counts as they went, and at the end.
    # (Before its first frame the pipeline knows no zone: its frame size is not known yet.)
    bench_seen = [s["zones"].get("bench") for s in scenes]
    assert {"count": 2, "labels": {LABEL: 2}, "dwelling": 0, "overcrowded": True} in bench_seen  # C, D
    assert {"count": 1, "labels": {LABEL: 1}, "dwelling": 1, "overcrowded": False} in bench_seen  # D
    assert {"count": 2, "labels": {LABEL: 2}, "dwelling": 1, "overcrowded": True} in bench_seen  # C back
    assert final == {
        "tracks": 0,
        "started": len(tracks),
        "ended": len(tracks),
        "zones": {"entrance": QUIET_ZONE, "bench": QUIET_ZONE},
        "lines": {"gate": {"up": 2, "down": 2}},
    }
    assert results.messages == []  # report.results: false: events only
    assert events.all() == got  # the stop had no track left to end

    # Each track's snapshot: the frame it was taken from, with the object's box drawn on it.
    frames = decoded_frames(video)
    for track, end in ends.items():
        snapshot = end["object"]["snapshot"]
        assert isinstance(snapshot, str) and snapshot.startswith(f"{track}-"), end
        check_snapshot(state_dir / "snapshots" / PIPELINE / f"{snapshot}.jpg", frames, truth)


def check_snapshot(path: Path, frames: list[np.ndarray], truth: list[Truth]) -> None:
    """`path` is one of the video's frames with a box drawn around one of its faces: along each side
    of that face's box (those inside the picture) the pixels differ from the frame, inside it they
    do not (the face is shown as it was; the caption sits above the box or inside its top)."""
    picture = cv2.imread(str(path))
    assert picture is not None and picture.shape == (HEIGHT, WIDTH, 3), path

    def small(image: np.ndarray) -> np.ndarray:
        return cv2.resize(image, (WIDTH // 4, HEIGHT // 4), interpolation=cv2.INTER_AREA).astype(np.int16)

    index = int(np.argmin([np.abs(small(picture) - small(frame)).mean() for frame in frames]))
    diff = np.abs(picture.astype(np.int16) - frames[index].astype(np.int16)).sum(axis=2)  # 0..765

    def sides(box: tuple[float, float, float, float]) -> list[float]:
        """How strongly each side (inside the picture) is drawn: the mean difference along the best
        row or column within 8 px of the face's true edge."""
        x1, y1, x2, y2 = (round(v) for v in box)
        strengths = []
        for y in (y1, y2):
            if 3 <= y <= HEIGHT - 4:
                rows = range(max(0, y - 8), min(HEIGHT, y + 9))
                strengths.append(max(float(diff[r, x1 + 15 : x2 - 15].mean()) for r in rows))
        for x in (x1, x2):
            if 3 <= x <= WIDTH - 4:
                columns = range(max(0, x - 8), min(WIDTH, x + 9))
                strengths.append(max(float(diff[y1 + 15 : y2 - 15, c].mean()) for c in columns))
        return strengths

    faces = truth[index].faces
    name = max(faces, key=lambda n: min(sides(faces[n])))
    x1, y1, x2, y2 = (round(v) for v in faces[name])
    assert min(sides(faces[name])) > 60, (path, index, name, sides(faces[name]))
    assert diff[y1 + 30 : y2 - 12, x1 + 12 : x2 - 12].mean() < 15, (path, index, name)


@pytest.mark.slow
def test_a_killed_agent_loses_no_event_and_ends_its_open_tracks_when_restarted(
    tmp_path: Path,
    mosquitto: Mosquitto,
    events: Events,
    walking_faces: tuple[Path, list[Truth]],
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
) -> None:
    """A and B in view (their `new`s arrived, their tracks open), the broker goes away, A's next
    events are stored in the outbox, then SIGKILL; the broker back, a restart on the same state dir:
    every event stored before the kill arrives (one `seq` without a gap across the two runs), the
    restart ends A's and B's tracks (reason `restarted`, their ids), and the tracks the restarted
    run sees get ids never used before."""
    video, _ = walking_faces
    config = write_config(tmp_path, mosquitto.port, video, yolo_path, yolo_labels, {})
    state_dir = tmp_path / "state"

    def log_of(agent: AgentProcess) -> Any:
        return lambda: f"{[summary(e) for e in events.all()]}\n{agent.log()[-3000:]}"

    first = start_agent(config)
    wait_until(
        lambda: len(track_ids(events.all(), "new")) >= 2,
        "A's and B's tracks",
        timeout=120,
        state=log_of(first),
    )
    mosquitto.stop()
    wait_until(  # A leaves the entrance (t = 1.8 s) and crosses the gate (2.0 s): stored, not sent
        lambda: any(e["type"] == "cross" for e in stored_events(state_dir)),
        "A's crossing stored in the outbox",
        timeout=60,
        state=log_of(first),
    )
    first.kill()  # SIGKILL: no stop, no `stopped` ends, no outbox flush
    assert first.poll() == -signal.SIGKILL
    before_kill, stored = events.all(), stored_events(state_dir)
    assert track_ids(before_kill, "end") == [] and track_ids(stored, "end") == []  # A and B: still open
    undelivered = [e for e in stored if e not in before_kill]
    assert any(e["type"] == "cross" for e in undelivered), undelivered

    mosquitto.start()  # the same port
    events.resubscribe(mosquitto)
    second = start_agent(config)

    def restarted_and_tracking_again() -> bool:
        got = events.all()
        restarted = [e for e in got if e["type"] == "end" and e["reason"] == "restarted"]
        return len(restarted) >= 2 and len(track_ids(got, "new")) >= 3

    wait_until(
        restarted_and_tracking_again,
        "A's and B's tracks ended as restarted and a track of the new run",
        timeout=120,
        state=log_of(second),
    )
    second.stop()  # SIGTERM: the tracks open now end as `stopped`
    wait_until(
        lambda: sorted(track_ids(events.all(), "new")) == sorted(track_ids(events.all(), "end")),
        "the end of every track",
        timeout=30,
        state=log_of(second),
    )
    got = events.all()
    check_sequence(got)
    check_every_track_ends_once(got)
    assert all(event in got for event in before_kill + stored)

    # The first run's events are those before the restart's `restarted` ends (they come first: the
    # restarted pipeline ends the journal's open tracks before it reads a frame).
    first_restarted = min(e["seq"] for e in got if e["type"] == "end" and e["reason"] == "restarted")
    first_run, second_run = got[: first_restarted - 1], got[first_restarted - 1 :]
    assert first_run == sorted(before_kill + undelivered, key=lambda e: int(e["seq"]))
    opened = track_ids(first_run, "new")
    restarted = [e for e in second_run if e["type"] == "end" and e["reason"] == "restarted"]
    assert sorted(track_ids(restarted, "end")) == sorted(opened) and len(opened) == 2
    news = {int(e["object"]["id"]): e["object"] for e in first_run if e["type"] == "new"}
    for end in restarted:
        began = news[int(end["object"]["id"])]
        assert end["object"]["label"] == began["label"] and end["object"]["first_seen"] == began["first_seen"]
    assert second_run[: len(restarted)] == restarted
    later = track_ids(second_run, "new")
    assert later and min(later) > max(opened), (opened, later)
    reasons = Counter(e["reason"] for e in second_run[len(restarted) :] if e["type"] == "end")
    assert set(reasons) <= {"stopped", "lost"} and reasons["stopped"] >= 1, reasons
