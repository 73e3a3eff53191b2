"""Seeing the camera's frame with the zones before running (issue 34, item 2), for real: a clip rendered
here (tests/face_clip.py: a real photo's face crossing the frame), the real YOLOv8n face detector, and a
real RTSP camera (GStreamer's RTSP server on loopback, tests/rtsp_camera.py) showing the face in the zone.

- `edge-agent source CLIP --save frame.jpg -c CONFIG --pipeline faces` writes a JPEG of the first frame
  with the pipeline's zone and line and a grid of fraction coordinates drawn, and says each zone's points
  in fractions and in this frame's pixels; a pipeline named as the source draws its own zones;
- `infer MODEL rtsp://...` runs on the camera's frame (the URL kept whole), `--track --seconds N` on
  N seconds of it;
- `infer --draw` draws the pipeline's zones and lines without --track too, each zone with its count;
- `--track` on one image runs its one frame: the face is found, tracked and counted in the zone;
- mistakes are one `error:` line, exit 1, nothing written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner, Result

from agent.cli import app
from tests import media_fixtures
from tests.face_clip import HEIGHT, LINE_X, MOVING, WIDTH, ZONE_X, faces_pipeline, write_clip
from tests.media_fixtures import write_wav
from tests.rtsp_camera import RtspServer
from tests.test_draw_explains import probe

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
ZONE_LEFT, LINE_COL = round(ZONE_X * WIDTH), round(LINE_X * WIDTH)


def run(*args: object) -> Result:
    return CliRunner().invoke(app, [*map(str, args)], env=ENV)


def ok_json(*args: object) -> dict[str, Any]:
    result = run(*args, "--json")
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(a.astype(np.int16) - b).max(axis=2))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("source-save")


@pytest.fixture(scope="module")
def clip(folder: Path) -> Path:
    return write_clip(folder / "clip.mp4")


@pytest.fixture(scope="module")
def first_frame(clip: Path) -> np.ndarray:
    capture = cv2.VideoCapture(str(clip))
    ok, frame = capture.read()
    capture.release()
    assert ok
    return np.asarray(frame)


@pytest.fixture(scope="module")
def face_in_zone(clip: Path, folder: Path) -> Path:
    """The clip's last frame with the face: the face right of the line, in the zone."""
    capture = cv2.VideoCapture(str(clip))
    try:
        for _ in range(MOVING):
            ok, frame = capture.read()
            assert ok
    finally:
        capture.release()
    path = folder / "face-in-zone.png"
    assert cv2.imwrite(str(path), frame)
    return path


@pytest.fixture(scope="module")
def config(folder: Path, clip: Path, yolo_path: Path, yolo_labels: list[str]) -> Path:
    faces = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip)})
    path = folder / "agent.yaml"
    settings = {
        "device": {"id": "save-box"},
        "state_dir": str(folder / "state"),
        "backends": {"benchmark": False},
    }
    path.write_text(yaml.safe_dump({**settings, "pipelines": [faces]}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def camera(face_in_zone: Path) -> Iterator[RtspServer]:
    server = RtspServer(face_in_zone)
    server.start()
    yield server
    server.kill()


def assert_zone_and_line_drawn(picture: np.ndarray, frame: np.ndarray) -> None:
    """The zone's left edge and the line (both down the frame) are drawn, all along."""
    diff = changed(picture, frame)
    rows = slice(40, HEIGHT - 10)  # below the labels along the top
    for column in (ZONE_LEFT, LINE_COL):
        assert (diff[rows, column - 2 : column + 3] > 40).any(axis=1).mean() > 0.95, column


def test_save_writes_the_first_frame_with_the_zones_lines_and_a_grid(
    clip: Path, config: Path, folder: Path, first_frame: np.ndarray
) -> None:
    out = folder / "frame.jpg"
    data = ok_json("source", clip, "--save", out, "-c", config, "--pipeline", "faces")
    assert data["ok"] and data["received"] == 1  # it stops at the first frame
    saved = data["saved"]
    assert saved["file"] == str(out) and saved["size"] == [WIDTH, HEIGHT] and saved["pipeline"] == "faces"
    assert saved["grid"] == 0.1 and saved["problems"] == []
    (zone,) = saved["zones"]
    assert zone["name"] == "right" and zone["units"] == "fraction"
    assert zone["pixels"] == [[ZONE_LEFT, 0], [WIDTH, 0], [WIDTH, HEIGHT], [ZONE_LEFT, HEIGHT]]
    (line,) = saved["lines"]
    assert line["name"] == "middle" and line["pixels"] == [[LINE_COL, 0], [LINE_COL, HEIGHT]]
    # A JPEG of the clip's first frame with the zone and the line drawn...
    assert out.read_bytes()[:3] == b"\xff\xd8\xff"
    picture = cv2.imread(str(out))
    assert picture is not None and picture.shape == (HEIGHT, WIDTH, 3)
    assert_zone_and_line_drawn(picture, first_frame)
    # ... and the grid: a lighter line every tenth of the width and height (seen on the grey around
    # the head, which fills the top left of the first frame).
    diff = changed(picture, first_frame)
    for fraction in (0.1, 0.2, 0.3, 0.4):
        x = round(fraction * WIDTH)
        assert (diff[275:315, x - 1 : x + 2] > 25).any(axis=1).mean() > 0.95, fraction
    x = round(0.6 * WIDTH)
    assert (diff[30:310, x - 1 : x + 2] > 25).any(axis=1).mean() > 0.95
    y = round(0.9 * HEIGHT)
    assert (diff[y - 1 : y + 2, 40:230] > 25).any(axis=0).mean() > 0.95
    # Between the grid's lines: the frame itself (JPEG aside).
    assert diff[294:316, 102:138].max() <= 20
    # For people: what was written, and each zone's points as configured and in pixels.
    result = run("source", clip, "--save", out, "-c", config, "--pipeline", "faces")
    assert result.exit_code == 0, result.output
    assert f"saved {out}: the first frame, {WIDTH}x{HEIGHT} with zone right, line middle" in result.output
    assert "a zone's points are [x, y] in these fractions" in result.output
    assert (
        f"right: [0.65, 0], [1, 0], [1, 1], [0.65, 1] (fraction) = pixels [[{ZONE_LEFT}, 0]" in result.output
    )


def test_a_pipeline_named_as_the_source_draws_its_own_zones(
    config: Path, folder: Path, first_frame: np.ndarray
) -> None:
    out = folder / "faces.png"
    data = ok_json("source", "faces", "-c", config, "--save", out, "--no-grid")
    assert data["saved"]["pipeline"] == "faces" and data["saved"]["grid"] is None
    picture = cv2.imread(str(out))
    assert_zone_and_line_drawn(picture, first_frame)
    assert changed(picture, first_frame)[40:300, 40:56].max() == 0  # no grid at 0.1: a PNG, exact


def test_mistakes_are_one_clear_line_and_nothing_is_written(clip: Path, config: Path, folder: Path) -> None:
    write_wav(folder / "tone.wav", np.zeros(16000, np.int16), 16000)
    cases: list[tuple[tuple[object, ...], str]] = [
        (
            ("source", clip, "-c", config, "--pipeline", "faces"),
            "--pipeline names the zones and lines to draw",
        ),
        (("source", clip, "--save", folder / "f.gif"), "not an image type this writes"),
        (("source", clip, "--save", folder / "missing" / "f.jpg"), "does not exist"),
        (
            ("source", clip, "--save", folder / "f.jpg", "-c", config, "--pipeline", "door"),
            "no pipeline named 'door'",
        ),
        (("source", folder / "tone.wav", "--save", folder / "f.jpg"), "--save keeps a video frame"),
        (("infer", "model.onnx", folder / "nope.mp4"), "does not exist"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert not (folder / "f.gif").exists() and not (folder / "f.jpg").exists()


def test_infer_draw_shows_the_pipelines_zones_and_lines_without_track(
    yolo_path: Path, face_in_zone: Path, config: Path, folder: Path
) -> None:
    out = folder / "drawn.jpg"
    data = ok_json("infer", yolo_path, face_in_zone, "-c", config, "--pipeline", "faces", "--draw", out)
    assert data["drawn"]["note"] == "1 detection(s) drawn over 1 zone(s) and 1 line(s)", data["drawn"]
    picture, frame = cv2.imread(str(out)), cv2.imread(str(face_in_zone))
    assert_zone_and_line_drawn(picture, frame)


def test_track_on_one_image_runs_its_one_frame(
    yolo_path: Path, face_in_zone: Path, config: Path, folder: Path
) -> None:
    out = folder / "tracked.jpg"
    data = ok_json(
        "infer", yolo_path, face_in_zone, "--track", "-c", config, "--pipeline", "faces", "--draw", out
    )
    assert data["kind"] == "image" and data["frames"] == 1 and "one image" in data["note"]
    said = [e["type"] for e in data["events"] if e["type"] != "update"]
    assert said[:2] == ["new", "enter"], said
    zone = data["tracking"]["zones"]["right"]
    assert zone["entries"] == 1 and zone["inside_at_end"] == 1
    assert cv2.imread(str(out)).shape == (HEIGHT, WIDTH, 3)
    result = run("infer", yolo_path, face_in_zone, "--track", "-c", config, "--pipeline", "faces")
    assert result.exit_code == 0 and f"{WIDTH}x{HEIGHT}, one image: one frame" in result.output, result.output
    assert "zone right: entered 1" in result.output
    result = run("infer", yolo_path, face_in_zone, "--track", "-c", config, "--pipeline", "faces",
                 "--draw", folder / "one.mp4")  # fmt: skip
    assert result.exit_code == 1 and "the input is one image, so is the picture" in result.output


@pytest.mark.slow  # about 16 s: a real RTSP camera read five times, the model loaded four
def test_a_camera_url_is_saved_inferred_and_tracked(
    camera: RtspServer, yolo_path: Path, config: Path, folder: Path, face_in_zone: Path
) -> None:
    frame = cv2.imread(str(face_in_zone))
    out = folder / "camera.jpg"
    data = ok_json(
        "source", camera.url, "--save", out, "-c", config, "--pipeline", "faces", "--seconds", "10"
    )
    assert data["ok"] and data["kind"] == "url" and data["saved"]["size"] == [WIDTH, HEIGHT]
    assert_zone_and_line_drawn(cv2.imread(str(out)), frame)
    # infer: the URL kept whole (not a file path), the camera's frame run.
    data = ok_json("infer", yolo_path, camera.url, "-c", config, "--pipeline", "faces")
    assert data["input"] == camera.url and data["kind"] == "camera"
    assert [d["label"] for d in data["output"]["detections"]] in (["FACE_FEMALE"], ["FACE_MALE"])
    # --track: its frames for --seconds, the face tracked into the zone.
    data = ok_json(
        "infer", yolo_path, camera.url, "--track", "--seconds", "2", "-c", config, "--pipeline", "faces"
    )
    assert data["kind"] == "camera" and data["frames"] >= 3 and data["size"] == [WIDTH, HEIGHT]
    said = [e["type"] for e in data["events"] if e["type"] != "update"]
    assert said[:2] == ["new", "enter"], said
    # For people, with the drawn video: H.264, the camera's frames at their times on a 10 fps grid.
    video = folder / "camera.mp4"
    faces = ("-c", config, "--pipeline", "faces")
    result = run("infer", yolo_path, camera.url, "--track", "--seconds", "2", *faces, "--draw", video)
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    assert (
        f"on {camera.url} (pipeline faces): {WIDTH}x{HEIGHT}, tracking every frame the camera gives"
        in result.output
    )
    stream = probe(video)
    assert stream["codec_name"] == "h264" and 15 <= int(stream["nb_read_frames"]) <= 25, stream
    # A camera that is not there: its reason, at once.
    camera.kill()
    result = run("infer", yolo_path, camera.url, "-c", config, "--pipeline", "faces")
    assert result.exit_code == 1 and result.output.startswith(f"error: {camera.url}: "), result.output
    assert "Traceback" not in result.output
