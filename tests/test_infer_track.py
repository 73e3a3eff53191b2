"""`edge-agent infer MODEL CLIP --track` for real: the real YOLOv8n face detector (nudenet's 320n.onnx)
on a video rendered here (cv2.VideoWriter) of a real photo's face moving left to right across the
frame and then gone, through the CLI in-process with a pipeline of a config that has a zone (the
right third) and a line (down the middle).

- --json: the track starts (`new`), crosses the line eastbound about the frame the face's centre
  passes it, enters the zone about the frame it gets there, and ends (`lost`) a second after the face
  left the picture (leaving the zone as it ends); one id throughout; the summary counts it so.
- --draw OUT.mp4: a video OpenCV decodes, of the clip's frame count, size and rate, with the track's
  box drawn in its colour where the events say the face was; --draw OUT.jpg: the last frame the face
  was tracked in, drawn; people read one line per event as it happens and the summary.
- Mistakes are one `error:` line and exit 1 before anything runs: a model or pipeline without boxes,
  --draw of an unknown type, in a missing folder or somewhere unwritable, --track on a tensor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner, Result

from agent.cli import app
from agent.processing.drawing import track_colour
from tests import media_fixtures
from tests.face_clip import (
    FPS,
    GONE,
    HEIGHT,
    LINE_X,
    MOVING,
    WIDTH,
    ZONE_X,
    face_box,
    faces_pipeline,
    first_frame_past,
    write_clip,
)

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("infer-track")


@pytest.fixture(scope="module")
def clip(folder: Path) -> Path:
    return write_clip(folder / "clip.mp4")


@pytest.fixture(scope="module")
def config(folder: Path, clip: Path, yolo_path: Path, yolo_labels: list[str], cls_model_path: Path) -> Path:
    """`faces`: the detector as the Home Assistant test runs it, with a zone and a line; `signs`: a
    classifier (no boxes to track)."""
    faces = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip)})
    signs = {
        "name": "signs",
        "model": {"path": str(cls_model_path)},
        "source": {"type": "video", "uri": str(clip)},
        "preprocess": {"resize": {"width": 192, "height": 48}, "color": "bgr"},
        "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
    }
    path = folder / "agent.yaml"
    settings = {
        "device": {"id": "track-box"},
        "state_dir": str(folder / "state"),
        "backends": {"benchmark": False},
    }
    path.write_text(yaml.safe_dump({**settings, "pipelines": [faces, signs]}, sort_keys=False))
    return path


def infer(*args: object) -> Result:
    return CliRunner().invoke(app, ["infer", *map(str, args)], env=ENV)


def decoded(path: Path) -> tuple[list[np.ndarray], float]:
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened(), path
    try:
        frames = []
        for _ in range(10 * (MOVING + GONE)):  # bounded: far more than the clip has
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame)
        return frames, float(capture.get(cv2.CAP_PROP_FPS))
    finally:
        capture.release()


def outlined(mask: np.ndarray, box: Any, margin: int = 3) -> float:
    """How much of `box`'s outline `mask` covers: along each edge, the share of positions with a
    `mask` pixel within `margin` across it; the least of the four edges."""
    x1, y1, x2, y2 = (round(float(v)) for v in box)
    x1, x2 = max(x1, margin), min(x2, WIDTH - 1 - margin)
    y1, y2 = max(y1, margin), min(y2, HEIGHT - 1 - margin)
    along_y, along_x = range(y1 + margin + 1, y2 - margin), range(x1 + margin + 1, x2 - margin)
    edges = [
        [mask[y, x1 - margin : x1 + margin + 1].any() for y in along_y],
        [mask[y, x2 - margin : x2 + margin + 1].any() for y in along_y],
        [mask[y1 - margin : y1 + margin + 1, x].any() for x in along_x],
        [mask[y2 - margin : y2 + margin + 1, x].any() for x in along_x],
    ]
    return min(float(np.mean(edge)) for edge in edges)


def in_track_colour(image: np.ndarray, track_id: int) -> np.ndarray:
    """Pixels near the track's colour (lossy video moves colours a little)."""
    return np.asarray(np.abs(image.astype(np.int16) - np.array(track_colour(track_id))).max(axis=2) <= 70)


def assert_boxed(drawn: np.ndarray, source: np.ndarray, box: Any, margin: int = 3) -> None:
    """`box`'s outline is drawn on `drawn` (the pixels along it differ from the source frame's: a
    1-pixel line in a lossy video keeps its place, not its colour), and its caption above it sits on a
    strip of track 1's colour."""
    changed = np.abs(drawn.astype(np.int16) - source).max(axis=2) > 60
    assert outlined(changed, box, margin) >= 0.9, box
    x1, y1 = round(float(box[0])), round(float(box[1]))
    strip = (slice(y1 - 14, y1 - 2), slice(x1 + 2, x1 + 90))
    assert in_track_colour(drawn, 1)[strip].mean() >= 0.4, box
    assert in_track_colour(source, 1)[strip].mean() <= 0.05, box


@pytest.fixture(scope="module")
def tracked(yolo_path: Path, clip: Path, config: Path, folder: Path) -> dict[str, Any]:
    """`infer --track --json --draw out.mp4` on the clip, through the faces pipeline."""
    out = folder / "out.mp4"
    result = infer(yolo_path, clip, "--track", "-c", config, "--pipeline", "faces", "--draw", out, "--json")
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_the_face_is_tracked_across_the_line_into_the_zone_and_ends_once_gone(
    tracked: dict[str, Any], clip: Path, yolo_path: Path
) -> None:
    data = tracked
    assert data["kind"] == "video" and data["pipeline"] == "faces" and data["input"] == str(clip)
    assert data["model"] == str(yolo_path) and data["backend"] and data["artifact"] == "320n.onnx"
    assert data["frames"] == MOVING + GONE and data["fps"] == FPS and data["size"] == [WIDTH, HEIGHT]
    assert set(data["latency_ms"]) == {"preprocess", "inference", "postprocess"}
    events = data["events"]
    said = [e for e in events if e["type"] != "update"]
    assert [e["type"] for e in said] == ["new", "cross", "enter", "exit", "end"], said
    new, cross, enter, exit_, end = said
    # One object, one id, all along: the face, from its second frame (a track needs min_hits 2).
    assert {e["object"]["id"] for e in events} == {1}
    assert {e["object"]["label"] for e in events} == {"FACE_FEMALE"}
    assert new["frame"] == 1 and new["object"]["score"] >= 0.6
    # Eastbound (left to right) where the face's centre passes the line, into the zone where it
    # passes the zone's edge (the detector's box is the face's within a pixel or two: a frame either way).
    assert cross["line"] == "middle" and cross["direction"] == "eastbound" and cross["count"] == 1
    assert abs(cross["frame"] - first_frame_past(LINE_X * WIDTH)) <= 1, cross
    assert enter["zone"] == "right" and abs(enter["frame"] - first_frame_past(ZONE_X * WIDTH)) <= 1, enter
    # Gone after frame MOVING - 1: lost once max_lost_s (1 s) has passed, leaving the zone as it ends.
    assert end["reason"] == "lost" and exit_["zone"] == "right" and exit_["reason"] == "track ended"
    assert exit_["frame"] == end["frame"] and MOVING - 1 + FPS <= end["frame"] <= MOVING + FPS + 1, end
    assert end["object"]["entered_zones"] == ["right"] and end["object"]["crossings_total"] == 1
    assert end["object"]["crossings"][0]["direction"] == "eastbound"
    # The clip's clock: each event at its frame's position, in order.
    for event in events:
        assert event["position_s"] == pytest.approx(event["frame"] / FPS, abs=1e-3)
    assert [e["frame"] for e in events] == sorted(e["frame"] for e in events)
    # The face is where the end says it was last seen: its box at the last frame it was there.
    assert media_fixtures.iou(np.array(end["object"]["box"]), face_box(MOVING - 1)) >= 0.7
    # The summary says the same.
    assert data["tracking"] == {
        "tracks": 1,
        "open_at_end": 0,
        "zones": {
            "right": {
                "entries": 1,
                "exits": 1,
                "dwell": 0,
                "overcrowded": 0,
                "inside_at_end": 0,
                "labels_at_end": {},
            }
        },
        "lines": {"middle": {"eastbound": 1, "westbound": 0}},
    }


def test_draw_mp4_is_the_clip_with_the_tracked_box_zone_and_line_drawn(
    tracked: dict[str, Any], clip: Path, folder: Path
) -> None:
    out = folder / "out.mp4"
    assert tracked["drawn"] == {
        "file": str(out),
        "note": f"{MOVING + GONE} frame(s) with the tracked boxes, zones and lines",
    }
    drawn, fps = decoded(out)
    source, _ = decoded(clip)
    assert len(drawn) == len(source) == MOVING + GONE and fps == FPS
    assert all(frame.shape == (HEIGHT, WIDTH, 3) for frame in drawn)
    # Where the events say the face was (each update carries the object's box at its frame), its
    # outline is drawn, captioned on a strip of track 1's colour.
    updates = [e for e in tracked["events"] if e["type"] == "update"]
    assert updates
    for update in updates:
        index, box = update["frame"], update["object"]["box"]
        assert_boxed(drawn[index], source[index], box)
    # The line is drawn down the middle and the zone's edge where it starts, on every frame.
    for index in (0, MOVING + GONE - 1):
        changed = np.abs(drawn[index].astype(np.int16) - source[index]).max(axis=2) > 40
        rows = slice(HEIGHT // 2 + 40, HEIGHT - 10)  # below the labels
        assert changed[rows, round(LINE_X * WIDTH) - 1 : round(LINE_X * WIDTH) + 2].any(axis=1).mean() > 0.9
        assert changed[rows, round(ZONE_X * WIDTH) - 1 : round(ZONE_X * WIDTH) + 2].any(axis=1).mean() > 0.9
    # Away from the drawings the frames are the clip's (beyond the encoder's noise).
    corner = (slice(HEIGHT - 40, HEIGHT), slice(0, 60))
    assert np.abs(drawn[-1][corner].astype(np.int16) - source[-1][corner]).max() <= 30


def test_people_read_a_line_per_event_and_draw_jpg_is_the_last_frame_with_the_face(
    yolo_path: Path, clip: Path, config: Path, folder: Path
) -> None:
    out = folder / "out.jpg"
    result = infer(yolo_path, clip, "--track", "-c", config, "--pipeline", "faces", "--draw", out)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{yolo_path} on {clip} (pipeline faces): {WIDTH}x{HEIGHT} at {FPS} fps")
    assert lines[1].startswith("backend: ")
    events = [line for line in lines if re.match(r"^\d\d:\d\d\.\d  ", line)]
    patterns = [
        r"00:00\.1  new    FACE_FEMALE #1 \(score 0\.\d\d\)",
        r"00:0\d\.\d  cross  middle  eastbound  FACE_FEMALE #1",
        r"00:0\d\.\d  enter  right  FACE_FEMALE #1",
        r"00:0\d\.\d  exit   right  FACE_FEMALE #1 \(stayed \d\.\d s, track ended\)",
        r"00:0\d\.\d  end    FACE_FEMALE #1 \(lost, seen 2\.[789] s\)",
    ]
    assert len(events) == len(patterns), lines
    for line, pattern in zip(events, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert f"{MOVING + GONE} frame(s); per frame: preprocess " in result.output
    assert "tracks: 1 (0 open at the end of the clip)" in lines
    assert "zone right: entered 1, left 1, inside at the end 0" in lines
    assert "line middle: eastbound 1, westbound 0" in lines
    note = f"frame {MOVING - 1}, 1 tracked object(s): the most in any frame (the latest of equals)"
    assert f"wrote {out}: {note}" in lines
    picture = cv2.imread(str(out))
    assert picture is not None and picture.shape == (HEIGHT, WIDTH, 3)
    source, _ = decoded(clip)
    assert_boxed(picture, source[MOVING - 1], face_box(MOVING - 1), margin=5)


def test_without_a_pipeline_the_models_own_settings_track_with_the_defaults(
    yolo_path: Path, clip: Path, config: Path
) -> None:
    """No zones or lines: tracks only, the model's labels and letterbox from its own metadata."""
    result = infer(yolo_path, clip, "--track", "-c", config, "--json")
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    data = json.loads(result.stdout)
    assert data["pipeline"] is None and "drawn" not in data
    assert [e["type"] for e in data["events"]] == ["new", "end"]
    assert data["events"][1]["reason"] == "lost"
    assert data["tracking"] == {"tracks": 1, "open_at_end": 0, "zones": {}, "lines": {}}


def test_mistakes_are_one_clear_line_and_nothing_is_written(
    yolo_path: Path, clip: Path, config: Path, folder: Path, cls_model_path: Path
) -> None:
    tensor = folder / "input.npy"  # not a picture (an image is one frame: tests/test_source_save.py)
    np.save(tensor, np.zeros((1, 3, 320, 320), np.float32))
    pipeline = ("-c", config, "--pipeline", "faces")
    # The classifier runs its own pipeline (the detector's 18 labels would not fit its 2 names).
    signs = (cls_model_path, clip, "--track", "-c", config, "--pipeline", "signs")
    cases: list[tuple[tuple[object, ...], str]] = [
        (signs, "--track needs boxes, and a classification postprocess gives none"),
        ((yolo_path, clip, "--track", *pipeline, "--draw", folder / "out.txt"), "cannot write '.txt' files"),
        ((yolo_path, clip, "--track", *pipeline, "--draw", folder / "no-such" / "out.mp4"), "does not exist"),
        ((yolo_path, clip, "--track", *pipeline, "--draw", Path("/proc/out.mp4")), "cannot write it"),
        ((yolo_path, clip, "--track", *pipeline, "--draw", folder), "is a folder"),
        ((yolo_path, tensor, "--track", *pipeline), "--track follows objects across a video's frames"),
        (
            (yolo_path, clip, "--track", "--frame", "3", *pipeline),
            "--frame runs one frame, --track runs them all",
        ),
        ((yolo_path, clip, *pipeline, "--draw", folder / "one.mp4"), "a drawn video goes with --track"),
    ]
    for args, message in cases:
        result = infer(*args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert not (folder / "out.txt").exists() and not (folder / "one.mp4").exists()
    # --json: the error as JSON, as every infer error is.
    result = infer(cls_model_path, clip, "--track", "-c", config, "--pipeline", "signs", "--json")
    assert result.exit_code == 1
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and "--track needs boxes" in answer["errors"][0]
