"""Motion regions' rules (agent/processing/motion_regions.py) on hand-made areas and detections: where
the crops go, when they merge, how many run, when the whole frame runs instead, and how the crops'
detections become one frame's. The real detector on crops of a rendered clip: test_motion_regions_clip.py."""

from __future__ import annotations

from typing import Any

import pytest

from agent.processing.motion_regions import merge_detections, plan_regions

FRAME = (1280, 720)
INPUT = (320, 320)


def size(box: tuple[int, int, int, int]) -> tuple[int, int]:
    return box[2] - box[0], box[3] - box[1]


def inside(box: tuple[int, int, int, int], crop: tuple[int, int, int, int]) -> bool:
    return crop[0] <= box[0] and crop[1] <= box[1] and box[2] <= crop[2] and box[3] <= crop[3]


def test_a_small_area_gets_one_crop_of_the_inputs_size_centred_on_it() -> None:
    crops = plan_regions([(600, 300, 640, 340)], FRAME, INPUT)
    assert crops == [(460, 160, 780, 480)]


def test_a_crop_near_the_frames_edge_stays_inside_the_frame() -> None:
    crops = plan_regions([(0, 690, 30, 720), (1260, 0, 1280, 20)], FRAME, INPUT)
    assert crops is not None and sorted(crops) == [(0, 400, 320, 720), (960, 0, 1280, 320)]


def test_an_area_larger_than_the_input_gets_a_larger_crop_of_its_shape_around_it() -> None:
    area = (100, 100, 500, 300)  # 400 wide: 10 % more, 440 square, scaled down to 320 by the model
    crops = plan_regions([area], FRAME, INPUT)
    assert crops is not None and len(crops) == 1
    assert size(crops[0]) == (440, 440) and inside(area, crops[0])
    wide = plan_regions([(0, 0, 200, 50)], FRAME, (320, 160))  # a 2:1 input: crops are 2:1 too
    assert wide == [(0, 0, 320, 160)]


def test_areas_one_crop_can_see_at_full_resolution_are_merged_far_ones_are_not() -> None:
    near = plan_regions([(400, 300, 440, 340), (600, 320, 640, 360)], FRAME, INPUT)
    assert near is not None and len(near) == 1 and size(near[0]) == INPUT
    far = plan_regions([(100, 300, 140, 340), (900, 300, 940, 340)], FRAME, INPUT)
    assert far is not None and len(far) == 2 and all(size(c) == INPUT for c in far)


def test_crops_that_overlap_much_are_merged_into_one_a_little_larger() -> None:
    # Each 300 wide: together 420, more than one input; their crops overlap by 2/3 of one.
    crops = plan_regions([(100, 300, 400, 340), (220, 300, 520, 340)], FRAME, INPUT)
    assert crops is not None and len(crops) == 1
    assert inside((100, 300, 520, 340), crops[0]) and size(crops[0])[0] == round(420 * 1.1)


def test_at_most_max_regions_run_the_ones_with_most_motion_first() -> None:
    areas = [(x, 300, x + 10 + x // 40, 340) for x in (0, 330, 660, 990)] + [(500, 10, 560, 60)]
    crops = plan_regions(areas, FRAME, INPUT, max_regions=3)
    assert crops is not None and len(crops) == 3
    biggest = sorted(areas, key=lambda a: -(a[2] - a[0]) * (a[3] - a[1]))[:3]
    assert all(inside(a, c) for a, c in zip(biggest, crops, strict=True))


def test_a_tracked_object_that_stopped_moving_is_still_looked_at() -> None:
    crops = plan_regions([(100, 100, 130, 130)], FRAME, INPUT, tracked=[(1000, 500, 1040, 540)])
    assert crops is not None and len(crops) == 2
    assert any(inside((1000, 500, 1040, 540), c) for c in crops)
    alone = plan_regions([], FRAME, INPUT, tracked=[(1000, 500, 1040, 540)])
    assert alone is not None and len(alone) == 1


@pytest.mark.parametrize(
    ("areas", "frame", "why"),
    [
        ([(0, 0, 1000, 400)], FRAME, "motion over more than half of the frame"),
        ([(0, 0, 700, 200), (600, 100, 1280, 380)], FRAME, "together (overlap once) over half"),
        ([], FRAME, "nothing moved and nothing is tracked"),
        ([(100, 100, 200, 200)], (320, 320), "the frame is the input's size"),
        ([(100, 100, 200, 200)], (640, 240), "a crop of the input's shape does not fit the frame"),
        ([(0, 0, 690, 690)], FRAME, "an area needs a crop taller than the frame"),
        ([(-50, -50, -1, -1)], FRAME, "the area lies outside the frame"),
    ],
)
def test_the_whole_frame_runs_when(areas: list[Any], frame: tuple[int, int], why: str) -> None:
    assert plan_regions(areas, frame, INPUT, full_frame_above=0.5) is None, why


def test_full_frame_above_sets_how_much_motion_is_too_much() -> None:
    area = [(0, 0, 640, 400)]  # 28 % of the frame
    assert plan_regions(area, FRAME, INPUT, full_frame_above=0.25) is None
    assert plan_regions(area, FRAME, INPUT, full_frame_above=0.5) is not None


def det(box: list[float], score: float, index: int = 1) -> dict[str, Any]:
    return {"index": index, "label": f"class-{index}", "score": score, "box": box}


def test_one_object_in_two_crops_is_one_detection_the_best_scored() -> None:
    left, right = (300, 200, 620, 520), (500, 200, 820, 520)
    found = merge_detections(
        [(left, [det([540, 300, 580, 340], 0.7)]), (right, [det([541, 301, 580, 341], 0.8)])],
        FRAME,
        iou_threshold=0.45,
        limit=100,
    )
    assert found == [det([541, 301, 580, 341], 0.8)]


def test_a_box_a_crops_border_cut_loses_to_the_whole_one_from_the_next_crop() -> None:
    left, right = (0, 200, 320, 520), (250, 200, 570, 520)
    cut = det([290, 300, 319.5, 340], 0.9)  # the left crop sees the object's left half, sure of it
    whole = det([290, 300, 350, 340], 0.6)  # the right crop sees it whole (IoU with the cut: 0.49)
    found = merge_detections([(left, [cut]), (right, [whole])], FRAME, iou_threshold=0.6, limit=100)
    assert found == [whole]


def test_boxes_at_the_frames_own_edge_are_not_cut_and_other_labels_are_kept() -> None:
    crop = (0, 0, 320, 320)  # its left and top edges are the frame's
    at_edge = det([0, 0, 40, 40], 0.5)
    other_label = det([0, 0, 40, 40], 0.4, index=2)
    found = merge_detections([(crop, [at_edge, other_label])], FRAME, iou_threshold=0.45, limit=100)
    assert found == [at_edge, other_label]
    assert merge_detections([(crop, [at_edge, other_label])], FRAME, 0.45, limit=1) == [at_edge]
