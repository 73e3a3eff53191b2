"""agent/processing/drawing.py on a real photo: boxes and captions land where the boxes are, each
track has its own colour, zones and lines show their sides, and the JPEG is bounded."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from agent.processing.drawing import caption_of, draw_boxes, draw_zones, encode_jpeg, track_colour
from agent.processing.zones import LineShape, ZoneShape, line_sides
from tests.media_fixtures import astronaut_bgr

FACE = [173.0, 82.0, 274.0, 180.0]  # the astronaut's face in the 512x512 photo


def changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pixel: how much the two images differ (summed over the channels)."""
    return np.abs(a.astype(int) - b.astype(int)).sum(axis=2)


def test_a_box_is_drawn_on_its_edges_and_nowhere_else() -> None:
    photo = astronaut_bgr()
    before = photo.copy()
    drawn = draw_boxes(photo, [{"label": "person", "score": 0.87, "box": FACE}])
    assert np.array_equal(photo, before)  # the input is left alone
    diff = changed(drawn, photo)
    x1, y1, x2, y2 = (round(v) for v in FACE)
    # All four edges, all along.
    assert (diff[y1, x1:x2] > 0).mean() > 0.95 and (diff[y2, x1:x2] > 0).mean() > 0.95
    assert (diff[y1:y2, x1] > 0).mean() > 0.95 and (diff[y1:y2, x2] > 0).mean() > 0.95
    # The inside of the box and the photo away from it are the photo, untouched.
    assert diff[y1 + 3 : y2 - 2, x1 + 3 : x2 - 2].max() == 0
    assert diff[250:, :].max() == 0
    # The caption: a strip above the box.
    assert (diff[y1 - 12 : y1 - 2, x1 : x1 + 60] > 0).mean() > 0.8
    assert np.array_equal(drawn[y2, (x1 + x2) // 2], np.array([0, 200, 255], np.uint8))


def test_each_track_has_its_own_stable_colour_in_box_and_caption() -> None:
    photo = astronaut_bgr()
    left, right = [60.0, 300.0, 160.0, 400.0], [300.0, 300.0, 400.0, 400.0]
    entries = [
        {"label": "person", "score": 0.9, "box": left, "track_id": 12},
        {"label": "person", "score": 0.9, "box": right, "track_id": 13},
    ]
    drawn = draw_boxes(photo, entries)
    colours = {tid: np.array(track_colour(tid), np.uint8) for tid in (12, 13)}
    assert not np.array_equal(colours[12], colours[13])
    assert np.array_equal(drawn[400, 110], colours[12]) and np.array_equal(drawn[400, 350], colours[13])
    # The caption's strip is its track's colour (its background, beside the text).
    for tid, box in ((12, left), (13, right)):
        strip = drawn[int(box[1]) - 14 : int(box[1]) - 1, int(box[0]) : int(box[0]) + 80].reshape(-1, 3)
        share = np.all(strip == colours[tid], axis=1).mean()
        assert share > 0.4, f"track {tid}: {share:.2f} of its caption strip in its colour"
    # Stable: the same id, the same colour, on another frame.
    again = draw_boxes(np.zeros_like(photo), [entries[0]])
    assert np.array_equal(again[400, 110], colours[12])
    # Consecutive ids are far apart.
    for tid in range(1, 50):
        a, b = np.array(track_colour(tid), int), np.array(track_colour(tid + 1), int)
        assert np.abs(a - b).sum() > 100, (tid, a, b)


def test_the_caption_names_label_track_and_score() -> None:
    assert caption_of({"label": "person", "score": 0.871, "track_id": 12}) == "person #12 0.87"
    assert caption_of({"index": 3, "score": 0.5}) == "3 0.50"
    assert caption_of({"label": "car"}) == "car"


def test_entries_without_a_usable_box_are_left_out_and_a_bad_image_is_refused() -> None:
    photo = astronaut_bgr()
    drawn = draw_boxes(photo, [{"label": "a"}, {"label": "b", "box": [1, 2, float("nan"), 4]}])
    assert np.array_equal(drawn, photo)
    # A box far outside the frame neither crashes OpenCV nor draws.
    far = draw_boxes(photo, [{"label": "c", "box": [1e12, 1e12, 2e12, 2e12]}])
    assert np.array_equal(far, photo)
    with pytest.raises(ValueError, match="need uint8"):
        draw_boxes(photo.astype(np.float32), [])
    with pytest.raises(ValueError, match="height x width x 3"):
        draw_boxes(photo[:, :, 0], [])


def test_zones_are_filled_and_named_and_lines_point_to_their_in_side() -> None:
    blank = np.zeros((400, 600, 3), np.uint8)
    zone = ZoneShape(
        "door", np.array([[20.0, 20.0], [200.0, 20.0], [200.0, 150.0], [20.0, 150.0]]), "box", None
    )
    # Left to right: `in` is moving up the picture.
    across = LineShape(
        "gate", np.array([250.0, 300.0]), np.array([550.0, 300.0]), ("in", "out"), "center", None
    )
    drawn = draw_zones(blank, [zone], [across])
    # The fill is see-through: tinted, not the outline's full colour.
    inside = drawn[40:60, 150:190].reshape(-1, 3).astype(int)
    assert 0 < inside.max() < 255 and np.ptp(inside, axis=0).max() == 0
    # The arrow goes from the middle towards the `in` side only.
    mid_x, mid_y = 400, 300
    up, down = drawn[mid_y - 15 : mid_y - 3, mid_x], drawn[mid_y + 3 : mid_y + 15, mid_x]
    assert up.any(axis=1).all() and not down.any()
    assert line_sides(np.array([[mid_x, mid_y - 10]]), across.start, across.end)[0] == 1
    # The same line walked the other way: the arrow points down.
    back = LineShape("gate", across.end, across.start, ("in", "out"), "center", None)
    drawn = draw_zones(blank, [], [back])
    up, down = drawn[mid_y - 15 : mid_y - 3, mid_x], drawn[mid_y + 3 : mid_y + 15, mid_x]
    assert down.any(axis=1).all() and not up.any()
    assert not blank.any()  # the input is left alone


def test_jpeg_decodes_at_full_size_and_shrinks_to_fit() -> None:
    photo = astronaut_bgr()
    data = encode_jpeg(photo, 90)
    assert data is not None
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == photo.shape
    assert changed(decoded, photo).mean() < 20  # the photo, JPEG aside
    # Bounded: the half size fits where the full one does not.
    limit = len(data) - 1
    half = encode_jpeg(photo, 90, max_bytes=limit)
    assert half is not None and len(half) <= limit
    assert cv2.imdecode(np.frombuffer(half, np.uint8), cv2.IMREAD_COLOR).shape == (256, 256, 3)
    quarter_size = len(encode_jpeg(cv2.resize(photo, (128, 128), interpolation=cv2.INTER_AREA), 90) or b"")
    quarter = encode_jpeg(photo, 90, max_bytes=quarter_size + 10)
    assert quarter is not None
    assert cv2.imdecode(np.frombuffer(quarter, np.uint8), cv2.IMREAD_COLOR).shape == (128, 128, 3)
    # Not even a quarter fits: None.
    assert encode_jpeg(photo, 90, max_bytes=300) is None
    # Lower quality, fewer bytes.
    low = encode_jpeg(photo, 20)
    assert low is not None and len(low) < len(data) / 2
    with pytest.raises(ValueError, match="quality 0"):
        encode_jpeg(photo, 0)
