"""Object filters and masks (agent/processing/object_filter.py, agent/config/filters.py,
agent/steps/filter.py): each rule on boxes in a frame's pixels, fractions and pixels, a label's rule
over the default, masks by anchor and label; the step's edit of the frame and its counts; and the
config's mistakes, each at its file:line, against postprocess.labels and against the model's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import FiltersConfig
from agent.config_loader import load_config
from agent.label_check import check_config
from agent.processing.object_filter import ObjectFilter
from agent.steps.base import FrameRecord
from agent.steps.filter import FilterStep
from tests.config_cases import assert_both_accept, assert_both_reject, problems_of

W, H = 200, 100  # the frame: 20000 square pixels


def verdicts(filters: dict[str, Any], boxes: list[tuple[str, float, list[float]]], size=(W, H)) -> list[str]:
    """The rule that drops each (label, score, box), or 'kept'."""
    output = {"detections": [{"label": label, "score": score, "box": box} for label, score, box in boxes]}
    kept, dropped = ObjectFilter(FiltersConfig.model_validate(filters)).apply(output, *size)
    reasons = iter(rule for _, rule in dropped)
    return ["kept" if entry in kept["detections"] else next(reasons) for entry in output["detections"]]


def test_min_score_drops_below_and_keeps_at_the_threshold() -> None:
    boxes = [("a", 0.49, [0, 0, 10, 10]), ("a", 0.5, [0, 0, 10, 10]), ("a", 0.9, [0, 0, 10, 10])]
    assert verdicts({"default": {"min_score": 0.5}}, boxes) == ["min_score", "kept", "kept"]


def test_areas_in_fractions_of_the_frame_and_in_square_pixels() -> None:
    small, medium, large = [0, 0, 10, 10], [0, 0, 20, 50], [0, 0, 100, 100]  # 100, 1000, 10000 px²
    boxes = [("a", 0.9, small), ("a", 0.9, medium), ("a", 0.9, large)]
    fraction = {"default": {"min_area": 0.01, "max_area": 0.25}}  # 200 and 5000 px² of 200x100
    assert verdicts(fraction, boxes) == ["min_area", "kept", "max_area"]
    # The same fractions of a frame 16 times larger (3200 and 80000 px²): the medium box is too small.
    assert verdicts(fraction, boxes, size=(800, 400)) == ["min_area", "min_area", "kept"]
    pixels = {"default": {"units": "pixels", "min_area": 1000, "max_area": 9999}}
    assert verdicts(pixels, boxes) == ["min_area", "kept", "max_area"]


def test_ratio_is_width_over_height() -> None:
    tall, square, wide = [0, 0, 10, 40], [0, 0, 20, 20], [0, 0, 40, 10]
    boxes = [("a", 0.9, tall), ("a", 0.9, square), ("a", 0.9, wide), ("a", 0.9, [0, 5, 10, 5])]
    rule = {"default": {"min_ratio": 0.5, "max_ratio": 2}}
    assert verdicts(rule, boxes) == ["min_ratio", "kept", "max_ratio", "max_ratio"]  # no height: infinite


def test_a_label_s_rule_overrides_the_default_key_by_key() -> None:
    filters = {
        "default": {"min_score": 0.6, "min_area": 0.01},
        "labels": {"car": {"min_area": 0.1}, "cat": {"units": "pixels", "max_area": 300}},
    }
    box = [0, 0, 50, 50]  # 2500 px²: 0.125 of the frame
    boxes = [
        ("person", 0.9, [0, 0, 10, 10]),  # 100 px² < the default's 200
        ("car", 0.9, [0, 0, 40, 40]),  # 1600 px² < car's 2000
        ("car", 0.9, box),
        ("car", 0.5, box),  # car keeps the default's min_score
        ("cat", 0.9, [0, 0, 10, 10]),  # 100 px² < the default's 200: cat keeps its min_area
        ("cat", 0.9, [0, 0, 20, 20]),  # 400 px² > cat's own max_area in pixels
        ("cat", 0.9, [0, 0, 15, 15]),
    ]
    assert verdicts(filters, boxes) == [
        "min_area",
        "min_area",
        "kept",
        "min_score",
        "min_area",
        "max_area",
        "kept",
    ]


def test_the_first_rule_that_drops_a_box_is_the_one_counted() -> None:
    rules = {"default": {"min_score": 0.5, "min_area": 0.5}, "masks": [{"points": [[0, 0], [1, 0], [1, 1]]}]}
    assert verdicts(rules, [("a", 0.1, [0, 0, 10, 10])]) == ["min_score"]


def test_masks_drop_by_the_anchor_point_in_fractions_or_pixels() -> None:
    left_half = [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]
    # Bottom centre (60, 60) is in the right half, the centre (60, 30)... both right: 0.5 of 200 is 100.
    boxes = [
        ("a", 0.9, [20, 20, 40, 60]),  # anchor (30, 60): inside
        ("a", 0.9, [90, 20, 150, 60]),  # anchor (120, 60): outside, though the box overlaps the mask
        ("a", 0.9, [80, 10, 120, 60]),  # anchor (100, 60): on the edge, which is inside
    ]
    assert verdicts({"masks": [{"points": left_half}]}, boxes) == ["mask", "kept", "mask"]
    in_pixels = {"masks": [{"units": "pixels", "points": [[0, 0], [100, 0], [100, 100], [0, 100]]}]}
    assert verdicts(in_pixels, boxes) == ["mask", "kept", "mask"]
    # A mask over the top band: the bottom centre of a box hanging into it is below it, its centre in it.
    top = [[0, 0], [1, 0], [1, 0.3], [0, 0.3]]
    hanging = [("a", 0.9, [0, 0, 20, 50])]  # centre (10, 25), bottom centre (10, 50); band to y 30
    assert verdicts({"masks": [{"points": top}]}, hanging) == ["kept"]
    assert verdicts({"masks": [{"points": top, "anchor": "center"}]}, hanging) == ["mask"]


def test_a_mask_with_labels_drops_only_those() -> None:
    mask = {"points": [[0, 0], [1, 0], [1, 1], [0, 1]], "labels": ["car"]}
    boxes = [("car", 0.9, [10, 10, 20, 20]), ("person", 0.9, [10, 10, 20, 20])]
    assert verdicts({"masks": [mask]}, boxes) == ["mask", "kept"]


def test_an_unknown_frame_size_applies_only_what_is_in_pixels() -> None:
    filters = {
        "default": {"min_area": 0.5},
        "labels": {"b": {"units": "pixels", "min_area": 1000}},
        "masks": [{"points": [[0, 0], [1, 0], [1, 1], [0, 1]]}],
    }
    boxes = [("a", 0.9, [0, 0, 10, 10]), ("b", 0.9, [0, 0, 10, 10])]
    assert verdicts(filters, boxes, size=(0, 0)) == ["kept", "min_area"]


def test_regions_are_filtered_by_the_default_and_other_output_is_left_alone() -> None:
    step = FilterStep(FiltersConfig.model_validate({"default": {"units": "pixels", "min_area": 50}}))
    record = FrameRecord(0, 0.0, None, False, None)
    record.output = {"regions": [{"score": 0.9, "area": 3, "box": [0, 0, 5, 5]}, {"box": [0, 0, 10, 10]}]}
    assert step.run(record)
    assert record.output == {"regions": [{"box": [0, 0, 10, 10]}]}  # no score: min_score cannot drop it
    record.output = {"outputs": {"x": 1}}  # a plugin's frame without boxes
    assert step.run(record) and record.output == {"outputs": {"x": 1}}
    assert step.status() == {"dropped": {"min_area": 1}, "by_label": {"object": {"min_area": 1}}, "kept": 1}


def test_the_step_drops_from_the_frame_s_output_and_counts_per_rule_and_label() -> None:
    from agent.processing import Geometry

    filters = {"default": {"min_score": 0.5}, "masks": [{"points": [[0, 0], [0.2, 0], [0.2, 1], [0, 1]]}]}
    step = FilterStep(FiltersConfig.model_validate(filters))
    record = FrameRecord(0, 0.0, None, False, None)
    record.geometry = Geometry(1, 1, 0, 0, W, H, W, H)  # the frame's size, with its pixels let go
    record.output = {
        "detections": [
            {"label": "person", "score": 0.9, "box": [10, 10, 20, 20]},  # masked (x < 40)
            {"label": "person", "score": 0.3, "box": [100, 10, 120, 20]},
            {"label": "car", "score": 0.2, "box": [100, 10, 120, 20]},
            {"label": "car", "score": 0.8, "box": [100, 10, 120, 20]},
        ],
        "labels": ["person", "car"],
    }
    assert step.run(record)
    assert record.output == {
        "detections": [{"label": "car", "score": 0.8, "box": [100, 10, 120, 20]}],
        "labels": ["person", "car"],
    }
    assert step.status() == {
        "dropped": {"mask": 1, "min_score": 2},
        "by_label": {"person": {"mask": 1, "min_score": 1}, "car": {"min_score": 1}},
        "kept": 1,
    }


# --- the config's mistakes, at their file:line -----------------------------------------------------

PIPELINE = """\
device: {id: box}
registry: {url: "file:///srv/registry"}
pipelines:
  - name: cam
    model: {name: m, version: "1"}
    source: {type: video, uri: "0"}
    postprocess: {type: detection, labels: [person, car]}
    filters:
"""


def problems(tmp_path: Path, filters: str, pipeline: str = PIPELINE) -> list[str]:
    path = tmp_path / "agent.yaml"
    path.write_text(pipeline + "".join(f"      {line}\n" for line in filters.splitlines()))
    return [p.replace(f"{path}:", "LINE ") for p in problems_of(path)]


BAD_FILTERS = {
    "min_above_max": (
        "default: {min_area: 0.3, max_area: 0.1}",
        "LINE 9: pipelines[0].filters.default: min_area (0.3) is above max_area (0.1): no object could "
        "be kept",
    ),
    "ratios": (
        "labels:\n  car: {min_ratio: 3, max_ratio: 2}",
        "LINE 10: pipelines[0].filters.labels.car: min_ratio (3) is above max_ratio (2): no object could "
        "be kept",
    ),
    "label_min_over_default_max": (
        "default: {max_area: 0.1}\nlabels:\n  car:\n    min_area: 0.2",
        "LINE 12: pipelines[0].filters.labels.car.min_area: min_area (0.2) is above default.max_area (0.1): "
        "no object could be kept",
    ),
    "default_min_over_label_max": (
        "default: {min_area: 0.2}\nlabels:\n  car:\n    max_area: 0.1",
        "LINE 12: pipelines[0].filters.labels.car.max_area: default.min_area (0.2) is above max_area (0.1): "
        "no object could be kept",
    ),
    "fraction_above_1": (
        "labels:\n  car: {min_area: 400}",
        "LINE 10: pipelines[0].filters.labels.car: min_area 400 is more than the whole frame: with units: "
        "fraction (the default) areas are 0..1 of the frame's area; write units: pixels for square pixels",
    ),
    "unknown_label": (
        "labels:\n  cra: {min_score: 0.5}",
        "LINE 10: pipelines[0].filters.labels.cra: 'cra' is not one of postprocess.labels (person, car); "
        "did you mean 'car'?",
    ),
    "unknown_mask_label": (
        "masks:\n  - points: [[0, 0], [1, 0], [1, 1]]\n    labels:\n      - dog",
        "LINE 12: pipelines[0].filters.masks[0].labels[0]: 'dog' is not one of postprocess.labels "
        "(person, car)",
    ),
    "mask_outside": (
        "masks:\n  - points: [[0, 0], [2, 0], [1, 1]]",
        "LINE 10: pipelines[0].filters.masks[0].points: point 1 (2, 0) is outside the frame: with units: "
        "fraction (the default) coordinates are 0..1 of the frame's width and height; write units: pixels "
        "for pixels",
    ),
    "mask_crossing": (
        "masks:\n  - points: [[0, 0], [1, 1], [1, 0], [0, 1]]",
        "LINE 10: pipelines[0].filters.masks[0].points: edge 0-1 meets edge 2-3: a mask's edges must not "
        "cross or touch (list the corners in order around the mask)",
    ),
    "unknown_key": (
        "default: {min_areas: 0.1}",
        "LINE 9: pipelines[0].filters.default.min_areas: unknown key; did you mean 'min_area'? (allowed "
        "here: max_area, max_ratio, min_area, min_ratio, min_score, units)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILTERS))
def test_a_bad_filter_is_refused_at_its_line(tmp_path: Path, case: str) -> None:
    filters, wanted = BAD_FILTERS[case]
    assert problems(tmp_path, filters) == [wanted]


def test_the_json_schema_refuses_an_area_fraction_above_1_and_takes_pixels() -> None:
    def text(rule: str) -> str:
        return PIPELINE + f"      default: {rule}\n"

    assert_both_reject(text("{min_area: 400}"), "fraction.yaml")
    assert_both_reject(text("{max_area: 1.5}"), "fraction.yaml")
    assert_both_accept(text("{units: pixels, min_area: 400, max_area: null}"), "pixels.yaml")
    assert_both_accept(text("{min_area: 0.01, max_area: 1}"), "fractions.yaml")


def test_filters_need_boxes_and_regions_have_no_labels(tmp_path: Path) -> None:
    raw = PIPELINE.replace("{type: detection, labels: [person, car]}", "{type: raw}")
    assert problems(tmp_path, "default: {min_score: 0.5}", raw) == [
        "LINE 8: pipelines[0].filters: object filters need boxes: use a detection or regions postprocess, "
        "not raw"
    ]
    regions = PIPELINE.replace("{type: detection, labels: [person, car]}", "{type: regions}")
    assert problems(tmp_path, "labels:\n  car: {min_score: 0.5}", regions) == [
        "LINE 10: pipelines[0].filters.labels.car: a regions postprocess gives no labels to filter on"
    ]
    fine = tmp_path / "fine.yaml"
    fine.write_text(regions + "      default: {min_area: 0.01}\n")
    assert load_config(fine, environ={}).pipelines[0].filters is not None


def test_labels_are_checked_against_the_model_s_own(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    """A pipeline without postprocess.labels names the model's: `config validate` and `doctor` check
    the filters' labels against the model file's own metadata (agent/label_check.py)."""
    config = {
        "device": {"id": "box"},
        "pipelines": [
            {
                "name": "cam",
                "model": {"path": str(yolo_path)},
                "source": {"type": "video", "uri": "0"},
                "postprocess": {"type": "detection"},
                "filters": {
                    "labels": {"FACE_FEMALE": {"min_area": 0.01}, "person": {"min_area": 0.01}},
                    "masks": [{"points": [[0, 0], [1, 0], [1, 1]], "labels": ["FACE_MALE", "FACE_FEMAL"]}],
                },
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    lines = path.read_text().splitlines()
    person = next(i for i, line in enumerate(lines, 1) if "person:" in line)
    mask_label = next(
        i for i, line in enumerate(lines, 1) if "- FACE_FEMAL" in line and "FACE_FEMALE" not in line
    )
    found = check_config(load_config(path, environ={}))
    names = ", ".join(yolo_labels)
    assert found.problems == [
        f"{path}:{person}: pipelines[0].filters.labels.person: 'person' is not one of the model's labels "
        f"({names})",
        f"{path}:{mask_label}: pipelines[0].filters.masks[0].labels[1]: 'FACE_FEMAL' is not one of the "
        f"model's labels ({names}); did you mean 'FACE_FEMALE'?",
    ]
