"""Zone and line geometry (agent/processing/zones.py) on hand-computed cases: concave polygons,
points on edges and corners, boxes overlapping or only touching, lines crossed both ways, touched
without crossing, passed beyond their ends and moved along; then a cross-check of the vectorised
area and inside tests against counting a fine grid of points."""

from __future__ import annotations

import numpy as np
import pytest

from agent.config import LineConfig, ZoneConfig
from agent.processing.zones import (
    LineShape,
    ZoneShape,
    anchor_points,
    boxes_in_zone,
    crossings,
    frame_problems,
    line_sides,
    outside_frame,
    overlap_areas,
    points_in_polygon,
    to_pixels,
)

SQUARE = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], dtype=np.float64)
# A U opening downwards in the picture (y grows down): the notch is x 1..2, y 1..3.
U_SHAPE = np.array([[0, 0], [3, 0], [3, 3], [2, 3], [2, 1], [1, 1], [1, 3], [0, 3]], dtype=np.float64)
TRIANGLE = np.array([[0, 0], [4, 0], [0, 4]], dtype=np.float64)


def test_fractions_scale_to_the_frame_and_pixels_stay() -> None:
    points = [(0.0, 0.0), (0.5, 0.25), (1.0, 1.0)]
    assert to_pixels(points, "fraction", 640, 480).tolist() == [[0, 0], [320, 120], [640, 480]]
    assert to_pixels([(3.0, 4.0)], "pixels", 640, 480).tolist() == [[3, 4]]
    assert outside_frame(np.array([[0, 0], [640, 480], [641, 0], [0, -1]], dtype=np.float64), 640, 480) == [
        2,
        3,
    ]


def test_anchor_points_of_boxes() -> None:
    boxes = [[10, 20, 30, 60], [0, 0, 1, 1]]
    assert anchor_points(boxes, "bottom_center").tolist() == [[20, 60], [0.5, 1]]
    assert anchor_points(boxes, "center").tolist() == [[20, 40], [0.5, 0.5]]


def test_points_in_a_concave_polygon_its_edges_and_corners() -> None:
    cases = {
        (0.5, 2.0): True,  # the left arm
        (2.5, 2.0): True,  # the right arm
        (1.5, 0.5): True,  # the bar across the top
        (1.5, 2.0): False,  # in the notch
        (1.5, 3.0): False,  # the notch's open end
        (0.5, 1.0): True,  # the ray to the right runs along the notch's top edge, through two corners
        (-1.0, 1.0): False,  # same height, outside: the ray passes the notch's corners too
        (-1.0, 0.0): False,  # level with the top edge, outside
        (4.0, 0.0): False,  # on the top edge's extension, beyond its end
        (0.0, 0.0): True,  # a corner
        (1.0, 1.0): True,  # a reflex corner
        (2.0, 2.0): True,  # on the notch's right edge
        (3.0, 1.5): True,  # on the outer right edge
        (1.5, 1.0): True,  # on the notch's top edge
        (1.0 + 1e-3, 2.0): False,  # just inside the notch
        (1.0 - 1e-3, 2.0): True,  # just inside the left arm
    }
    inside = points_in_polygon(list(cases), U_SHAPE)
    assert dict(zip(cases, inside.tolist(), strict=True)) == cases


def test_points_on_a_diagonal_edge_scaled_from_fractions() -> None:
    # 0.1 and 0.3 are not exact in binary: the scaled edge point is still on the edge.
    polygon = to_pixels([(0.1, 0.1), (0.3, 0.1), (0.1, 0.3)], "fraction", 1920, 1080)
    on_hypotenuse = to_pixels([(0.2, 0.2)], "fraction", 1920, 1080)
    assert points_in_polygon(on_hypotenuse, polygon).tolist() == [True]
    assert points_in_polygon(on_hypotenuse + 0.01, polygon).tolist() == [False]


@pytest.mark.parametrize(
    ("polygon", "boxes", "areas"),
    [
        (SQUARE, [[0, 0, 10, 10], [5, 5, 15, 15], [-5, -5, 20, 20], [2, 2, 3, 3]], [100, 25, 100, 1]),
        (SQUARE, [[10, 0, 20, 10], [0, 10, 10, 20], [10, 10, 11, 11], [20, 20, 30, 30]], [0, 0, 0, 0]),
        (U_SHAPE, [[0, 0, 3, 3], [1, 1, 2, 3], [0.5, 0.5, 2.5, 2.5], [1.5, 0, 4, 4]], [7, 0, 2.5, 3.5]),
        (TRIANGLE, [[0, 0, 2, 2], [0, 0, 4, 4], [2, 2, 4, 4], [1, 1, 3, 3]], [4, 8, 0, 2]),
    ],
    ids=["square inside and across", "square touching", "concave", "triangle"],
)
def test_overlap_areas_by_hand(polygon: np.ndarray, boxes: list[list[float]], areas: list[float]) -> None:
    assert overlap_areas(boxes, polygon) == pytest.approx(areas, abs=1e-9)
    assert overlap_areas(boxes, polygon[::-1]) == pytest.approx(areas, abs=1e-9)  # either way round


def test_each_anchor_decides_differently_on_the_same_boxes() -> None:
    boxes = np.array(
        [
            [2, -6, 4, 2],  # bottom centre (3, 2) inside, centre (3, -2) outside
            [2, 6, 4, 12],  # bottom centre (3, 12) outside, centre (3, 9) inside
            [-4, 2, 0, 4],  # only touches the left edge: its bottom centre is outside, no area shared
            [-4, 2, 0.5, 4],  # shares 0.5 x 2 with the zone
            [4, 4, 4, 6],  # no area: never in by `box`, but its anchors are
        ],
        dtype=np.float64,
    )
    assert boxes_in_zone(boxes, SQUARE, "bottom_center").tolist() == [True, False, False, False, True]
    assert boxes_in_zone(boxes, SQUARE, "center").tolist() == [False, True, False, False, True]
    assert boxes_in_zone(boxes, SQUARE, "box").tolist() == [True, True, False, True, False]


def test_no_boxes_and_no_points() -> None:
    empty = np.zeros((0, 4))
    assert boxes_in_zone(empty, SQUARE, "box").shape == (0,)
    assert boxes_in_zone(empty, SQUARE, "center").shape == (0,)
    assert crossings(np.zeros((0, 2)), np.zeros((0, 2)), np.array([0.0, 0]), np.array([1.0, 0])).shape == (0,)


# A line across the middle from left to right: walking along it, its left (`in`) is up the picture.
START, END = np.array([0.0, 5.0]), np.array([10.0, 5.0])


def test_line_sides_in_image_coordinates() -> None:
    sides = line_sides([[5, 2], [5, 8], [5, 5], [20, 5], [-3, 4]], START, END)
    assert sides.tolist() == [1, -1, 0, 0, 1]  # above: in side; below: out side; on it (or its extension): 0
    assert line_sides([[5, 2]], END, START).tolist() == [-1]  # the other way round, the sides swap


def test_crossings_both_ways_and_the_cases_that_are_not_crossings() -> None:
    moves = {
        "up: in": ((5, 8), (5, 2), 1),
        "down: out": ((5, 2), (5, 8), -1),
        "diagonal up: in": ((1, 9), (9, 1), 1),
        "to the line, touching": ((5, 8), (5, 5), 0),
        "from the line on (pass the last point off it instead)": ((5, 5), (5, 2), 0),
        "parallel, below": ((1, 8), (9, 8), 0),
        "along the line": ((1, 5), (9, 5), 0),
        "beyond the end": ((12, 8), (12, 2), 0),
        "through the end point": ((9, 6), (11, 4), 1),
        "before the start": ((-1, 8), (-1, 2), 0),
        "standing still": ((5, 8), (5, 8), 0),
    }
    p0 = [m[0] for m in moves.values()]
    p1 = [m[1] for m in moves.values()]
    got = crossings(p0, p1, START, END).tolist()
    assert dict(zip(moves, got, strict=True)) == {name: m[2] for name, m in moves.items()}


def test_stopping_on_the_line_and_going_on_counts_once_from_the_last_point_off_it() -> None:
    path = [(5.0, 8.0), (5.0, 5.0), (5.0, 5.0), (5.0, 2.0)]
    last_off, found = path[0], []
    for point in path[1:]:
        found.append(int(crossings([last_off], [point], START, END)[0]))
        if line_sides([point], START, END)[0] != 0:
            last_off = point
    assert found == [0, 0, 1]


def test_a_line_from_config_names_its_directions() -> None:
    config = LineConfig.model_validate(
        {"name": "gate", "points": [[0.5, 1.0], [0.5, 0.0]], "in": "east", "out": "west"}
    )  # up the middle of the picture: its left is the left half
    gate = LineShape.from_config(config, 640, 480)
    assert gate.start.tolist() == [320, 480] and gate.end.tolist() == [320, 0]
    before = [[400, 100, 440, 200], [100, 100, 140, 200], [100, 100, 140, 200]]
    now = [[200, 110, 240, 210], [500, 110, 540, 210], [150, 110, 190, 210]]
    got = gate.crossings(before, now).tolist()
    assert got == [1, -1, 0]
    assert [gate.direction(c) for c in got[:2]] == ["east", "west"]


def test_a_zone_from_config_in_pixels_of_the_frame() -> None:
    config = ZoneConfig.model_validate({"name": "dock", "points": [[0, 0.5], [0.5, 0.5], [0.5, 1], [0, 1]]})
    dock = ZoneShape.from_config(config, 1280, 720)
    assert dock.polygon.tolist() == [[0, 360], [640, 360], [640, 720], [0, 720]]
    assert dock.contains([[100, 300, 200, 400], [100, 100, 200, 300], [700, 400, 800, 500]]).tolist() == [
        True,
        False,
        False,
    ]


def test_pixel_points_outside_the_frame_are_named() -> None:
    zone = ZoneConfig.model_validate(
        {"name": "dock", "units": "pixels", "points": [[0, 0], [2000, 0], [2000, 500]]}
    )
    line = LineConfig.model_validate({"name": "gate", "points": [[0, 0.5], [1, 0.5]]})
    assert frame_problems([zone], [line], 1920, 1080) == [
        "zones[0] (dock): point 1 (2000, 0) is outside the 1920x1080 frame",
        "zones[0] (dock): point 2 (2000, 500) is outside the 1920x1080 frame",
    ]
    assert frame_problems([zone], [line], 2000, 1080) == []


def test_area_and_inside_agree_with_counting_a_grid_of_points() -> None:
    """The vectorised formulas against brute force: a 400x400 grid of cell centres over a concave
    polygon, counted inside the polygon (and inside each box): equal up to the grid's resolution."""
    polygon = np.array([[1, 1], [9, 2], [6, 5], [9, 9], [2, 8], [4, 5]], dtype=np.float64)
    step = 10 / 400
    xs = np.arange(step / 2, 10, step)
    grid = np.stack(np.meshgrid(xs, xs), axis=-1).reshape(-1, 2)
    inside = points_in_polygon(grid, polygon)
    x, y = polygon[:, 0], polygon[:, 1]
    shoelace = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    assert inside.sum() * step * step == pytest.approx(shoelace, rel=0.01)
    boxes = np.array([[0, 0, 10, 10], [3, 3, 7, 7], [5, 4, 8, 6], [0, 0, 2, 2], [8.5, 8.5, 10, 10]])
    areas = overlap_areas(boxes, polygon)
    for box, area in zip(boxes, areas, strict=True):
        in_box = (grid[:, 0] > box[0]) & (grid[:, 0] < box[2]) & (grid[:, 1] > box[1]) & (grid[:, 1] < box[3])
        assert area == pytest.approx((inside & in_box).sum() * step * step, abs=0.15), box
    assert areas[0] == pytest.approx(shoelace)
