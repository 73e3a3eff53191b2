"""Drawn frames explain themselves (agent/processing/drawing.py; issue 34, item 3), measured on the
pixels the real drawing code writes:

- each object's anchor point (the point a zone or a line counts) is marked at that pixel;
- a zone's fill takes its state's colour (empty, occupied, overcrowded) and its label the live count;
- a line says its count per direction on the frame;
- no label covers another, nor a line's arrowhead; a zone's name sits on its top edge, not over the
  people in it;
- `infer --track --draw out.mp4` is H.264 (yuv420p) with every frame (ffprobe decodes it), .webm VP8;
  a .gif, or an .mp4 with no ffmpeg to encode it, is refused before anything runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner, Result

from agent.cli import app
from agent.processing.drawing import (
    ZONE_STATE_COLOURS,
    Labels,
    anchor_radius,
    draw_boxes,
    draw_scene,
    draw_zones,
    track_colour,
    zone_colour,
)
from agent.processing.zones import LineShape, ZoneShape
from tests import media_fixtures
from tests.face_clip import FPS, GONE, HEIGHT, MOVING, WIDTH, faces_pipeline, write_clip

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

GREY = 90
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def blank(width: int = 640, height: int = 480) -> np.ndarray:
    return np.full((height, width, 3), GREY, np.uint8)


def square(name: str, x1: float, y1: float, x2: float, y2: float, anchor: str = "bottom_center") -> ZoneShape:
    return ZoneShape(name, np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float64), anchor, None)  # type: ignore[arg-type]


def overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_anchor_point_is_marked_where_the_zone_counts_it() -> None:
    box = [100.0, 80.0, 201.0, 301.0]
    entry = {"label": "person", "score": 0.9, "box": box, "track_id": 3}
    colour = np.array(track_colour(3), np.uint8)
    plain = draw_boxes(blank(), [entry])
    radius = anchor_radius(plain)
    for anchor, (x, y) in (("bottom_center", (150, 301)), ("center", (150, 190))):
        marked = draw_boxes(blank(), [entry], anchors=[anchor])
        # The dot is the track's colour at the anchor, ringed in black then white (legible anywhere)...
        assert np.array_equal(marked[y, x], colour), anchor
        assert marked[y, x + radius + 1].max() < 80 and marked[y, x + radius + 2].min() > 150, anchor
        # ... and nowhere else: the rest of the picture is as the boxes alone draw it.
        changed = np.abs(marked.astype(int) - plain).sum(axis=2) > 0
        ys, xs = np.nonzero(changed)
        assert ys.size and abs(ys.mean() - y) <= 1 and abs(xs.mean() - x) <= 1, anchor
        assert max(ys.max() - ys.min(), xs.max() - xs.min()) <= 2 * (radius + 3), anchor
    # Without zones or lines nothing is counted: no dot (the Home Assistant image, snapshots).
    assert not np.array_equal(plain[190, 150], colour)


def test_a_zone_is_coloured_by_its_state_and_labelled_with_its_count() -> None:
    zone = square("counter", 300, 150, 600, 450)
    fills = {}
    for state, occupancy in (
        ("empty", {"count": 0, "overcrowded": False}),
        ("occupied", {"count": 2, "overcrowded": False}),
        ("overcrowded", {"count": 4, "overcrowded": True}),
    ):
        labels = Labels()
        drawn = draw_zones(
            blank(), [zone], [], occupancy={"counter": occupancy}, limits={"counter": 3}, labels=labels
        )
        inside = drawn[300:400, 400:500].reshape(-1, 3).astype(float)
        assert np.ptp(inside, axis=0).max() == 0  # evenly tinted, nothing else there
        expected = 0.25 * np.array(ZONE_STATE_COLOURS[state]) + 0.75 * GREY
        assert np.abs(inside[0] - expected).max() <= 1.5, (state, inside[0], expected)
        fills[state] = tuple(inside[0])
        # Its outline is the state's colour too; its label says how many of how many.
        assert np.array_equal(drawn[300, 300], ZONE_STATE_COLOURS[state])
        assert [text for text, _ in labels.placed] == [f"counter {occupancy['count']}/3"]
    assert len(set(fills.values())) == 3
    # Without a state (a saved frame: nobody counted yet) each zone has its own colour and its name.
    labels = Labels()
    drawn = draw_zones(blank(), [zone], [], labels=labels)
    assert np.array_equal(drawn[300, 300], zone_colour(0)) and labels.placed[0][0] == "counter"


def test_a_line_shows_its_counts_per_direction_and_no_label_sits_on_its_arrowhead() -> None:
    line = LineShape("door", np.array([40.0, 300.0]), np.array([600.0, 300.0]), ("entering", "leaving"),
                     "bottom_center", None)  # fmt: skip
    labels = Labels()
    counted = draw_zones(blank(), [], [line], counts={"door": {"entering": 3, "leaving": 1}}, labels=labels)
    placed = dict(labels.placed)
    assert set(placed) == {"entering 3", "leaving 1", "door"}
    colour = np.array(zone_colour(0), np.uint8)
    # Each label is drawn: its rectangle is mostly the line's colour (the text takes the rest).
    for text, (x1, y1, x2, y2) in placed.items():
        share = np.all(counted[y1:y2, x1:x2] == colour, axis=2).mean()
        assert share > 0.4, (text, share)
    # `entering` (the arrow's way: up the picture) above the line, `leaving` below.
    assert placed["entering 3"][3] <= 300 <= placed["leaving 1"][1]
    # A tracked person beside the arrow: its caption, above its box, would lie across the arrowhead.
    # It moves; the arrow stays whole.
    entry = {"label": "person", "score": 0.9, "track_id": 1, "box": [250.0, 280.0, 300.0, 420.0]}
    scene = draw_scene(blank(), [entry], [], [line], counts={"door": {"entering": 3, "leaving": 1}})
    arrow_only = blank()
    cv2.arrowedLine(arrow_only, (320, 300), (320, 268), zone_colour(0), 2, cv2.LINE_AA, tipLength=0.3)
    arrow = np.abs(arrow_only.astype(int) - blank()).sum(axis=2) > 0
    arrow[296:, :] = False  # the arrow above the line (the line runs across below)
    assert arrow.sum() > 50
    assert np.array_equal(scene[arrow], arrow_only[arrow]), "a label covers the arrowhead"
    caption = draw_boxes(blank(), [entry])  # alone, the caption would have been there
    assert not np.array_equal(caption[arrow], arrow_only[arrow])


def test_labels_never_cover_each_other_and_a_zones_name_sits_on_its_edge() -> None:
    zone = square("counter", 200, 100, 600, 460)
    people = [
        {"label": "person", "score": 0.91, "track_id": 1, "box": [300.0, 200.0, 380.0, 400.0]},
        {"label": "person", "score": 0.88, "track_id": 2, "box": [310.0, 205.0, 390.0, 405.0]},
        {"label": "person", "score": 0.87, "track_id": 3, "box": [318.0, 198.0, 400.0, 398.0]},
    ]
    occupancy = {"counter": {"count": 3, "overcrowded": False}}
    labels = Labels()
    canvas = draw_zones(blank(), [zone], [], occupancy=occupancy, labels=labels)
    drawn = draw_boxes(canvas, people, anchors=["bottom_center"], labels=labels)
    rects = [rect for _, rect in labels.placed]
    assert len(rects) == 4
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            assert not overlaps(a, b), (labels.placed, a, b)
    # On the pixels: each caption's strip is its own track's colour, not covered by another's.
    for (_, (x1, y1, x2, y2)), person in zip(labels.placed[1:], people, strict=True):
        share = np.all(drawn[y1:y2, x1:x2] == track_colour(person["track_id"]), axis=2).mean()
        assert share > 0.4, (person["track_id"], share)
    # The zone's name on its top edge (its top-left corner), not in its middle over the people.
    _, name = labels.placed[0]
    assert abs(name[3] - 100) <= 3 and abs(name[0] - 200) <= 3
    for person in people:
        assert not overlaps(name, tuple(round(v) for v in person["box"])), person  # type: ignore[arg-type]
    middle = drawn[420:450, 210:280]  # inside the zone, away from the people: the tint alone
    assert np.ptp(middle.reshape(-1, 3), axis=0).max() == 0


# --- the drawn video --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("draw-explains")


@pytest.fixture(scope="module")
def clip_and_config(folder: Path, yolo_path: Path, yolo_labels: list[str]) -> tuple[Path, Path]:
    clip = write_clip(folder / "clip.mp4")
    faces = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip)})
    config = folder / "agent.yaml"
    settings = {
        "device": {"id": "draw-box"},
        "state_dir": str(folder / "state"),
        "backends": {"benchmark": False},
    }
    config.write_text(yaml.safe_dump({**settings, "pipelines": [faces]}, sort_keys=False))
    return clip, config


def infer(*args: object, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, ["infer", *map(str, args)], env={**ENV, **(env or {})})


def probe(path: Path) -> dict[str, str]:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=codec_name,pix_fmt,width,height,nb_read_frames", "-of", "json", str(path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    stream: dict[str, str] = json.loads(done.stdout)["streams"][0]
    return stream


def test_draw_mp4_is_h264_a_browser_plays_and_webm_is_vp8(
    clip_and_config: tuple[Path, Path], yolo_path: Path, folder: Path
) -> None:
    clip, config = clip_and_config
    for name, codec in (("tracked.mp4", "h264"), ("tracked.webm", "vp8")):
        out = folder / name
        result = infer(
            yolo_path, clip, "--track", "-c", config, "--pipeline", "faces", "--draw", out, "--json"
        )
        assert result.exit_code == 0, (result.output[-3000:], result.exception)
        stream = probe(out)
        assert stream["codec_name"] == codec and stream["pix_fmt"] == "yuv420p", stream
        assert int(stream["nb_read_frames"]) == MOVING + GONE, stream
        assert (int(stream["width"]), int(stream["height"])) == (WIDTH, HEIGHT)
        # OpenCV reads it back too, at the clip's rate.
        capture = cv2.VideoCapture(str(out))
        try:
            assert capture.isOpened() and capture.get(cv2.CAP_PROP_FPS) == pytest.approx(FPS, rel=0.01)
        finally:
            capture.release()
    mp4 = out.with_name("tracked.mp4").read_bytes()
    assert mp4[4:8] == b"ftyp" and mp4.find(b"moov") < mp4.find(b"mdat")  # the index first: streams


def test_a_gif_and_an_mp4_without_ffmpeg_are_refused_before_anything_runs(
    clip_and_config: tuple[Path, Path], yolo_path: Path, folder: Path
) -> None:
    clip, config = clip_and_config
    pipeline = ("-c", config, "--pipeline", "faces")
    result = infer(yolo_path, clip, "--track", *pipeline, "--draw", folder / "out.gif")
    assert result.exit_code == 1 and result.output.startswith("error: "), result.output
    assert "a GIF would hold one still frame" in result.output and ".mp4" in result.output
    assert not (folder / "out.gif").exists()
    # No ffmpeg on PATH: H.264 cannot be written here; the message says what would be.
    empty = folder / "no-programs"
    empty.mkdir()
    result = infer(
        yolo_path, clip, "--track", *pipeline, "--draw", folder / "nope.mp4", env={"PATH": str(empty)}
    )
    assert result.exit_code == 1 and result.output.startswith("error: "), result.output
    assert "H.264 needs ffmpeg with libx264" in result.output and ".webm" in result.output
    assert "Traceback" not in result.output and not (folder / "nope.mp4").exists()
