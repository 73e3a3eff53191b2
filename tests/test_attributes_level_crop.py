"""Text at an angle (issue 36's "rotation by the polygon for text regions"): the real PP-OCR detector's
regions carry their rotated rectangle (`polygons: true`), and an attribute's crop is that rectangle
turned level (agent/attribute_models.py `level_crop`), which the real recognizer reads exactly where
the upright box around the same tilted line does not."""

from __future__ import annotations

import cv2
import numpy as np

from agent.attribute_models import level_crop
from agent.config import PreprocessConfig, RegionsPostprocess, ResizeConfig
from agent.processing import build_postprocessor
from agent.processing.postprocess import Regions
from agent.processing.preprocess import Preprocessor
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import cls_artifact
from tests.store_fixtures import rapidocr_models_dir
from tests.text_lines import REC_PREPROCESS, cv2_line, rec_artifact, rec_postprocess

TEXT = "Dock 12"
ANGLE = 18.0  # degrees, counter-clockwise


def tilted_scene() -> np.ndarray:
    """TEXT on a light plate, turned by ANGLE, on a grey 640x360 picture."""
    line = cv2_line(TEXT, 1.3)
    h, w = line.shape[:2]
    canvas = np.full((360, 640, 3), 110, np.uint8)
    side = int(np.hypot(w, h)) + 4
    square = np.full((side, side, 3), 110, np.uint8)
    square[(side - h) // 2 : (side - h) // 2 + h, (side - w) // 2 : (side - w) // 2 + w] = line
    turn = cv2.getRotationMatrix2D((side / 2, side / 2), ANGLE, 1.0)
    turned = cv2.warpAffine(square, turn, (side, side), borderValue=(110, 110, 110))
    canvas[:side, 120 : 120 + side] = turned[:360]
    return canvas


def detect(scene: np.ndarray, polygons: bool = True) -> list[dict]:
    session = OnnxRuntimeBackend().load(cls_artifact(rapidocr_models_dir() / "ch_PP-OCRv4_det_infer.onnx"))
    pre = Preprocessor(
        PreprocessConfig(
            resize=ResizeConfig(width=640, height=352, mode="letterbox"),
            color="bgr",
            scale=1 / 255,
            mean=[0.5],
            std=[0.5],
        ),
        session.inputs,
    )
    feeds, geometry = pre.prepare(scene)
    regions = Regions(
        RegionsPostprocess(type="regions", unclip_ratio=1.5, polygons=polygons), session.outputs
    )
    return list(regions(session.run({pre.input.name: feeds}), geometry)["regions"])


def read(crop: np.ndarray) -> str:
    session = OnnxRuntimeBackend().load(rec_artifact())
    pre = Preprocessor(REC_PREPROCESS, session.inputs)
    post = build_postprocessor(rec_postprocess(), session.outputs)
    return str(post(session.run({pre.input.name: pre(crop)}))["text"])


def test_a_tilted_line_is_read_from_its_polygon_turned_level_not_from_its_box() -> None:
    scene = tilted_scene()
    regions = detect(scene)
    assert len(regions) == 1
    region = regions[0]
    corners = np.asarray(region["polygon"], np.float32)
    assert corners.shape == (4, 2)
    (_, _), (w, h), angle = cv2.minAreaRect(corners)
    tilt = angle if w >= h else angle - 90  # OpenCV's angle is of the side it calls the width
    assert abs(abs(tilt) - ANGLE) < 3, (angle, w, h)
    # Every corner inside the box (the box is the polygon's bounds, both grown alike).
    x1, y1, x2, y2 = region["box"]
    assert (corners[:, 0] >= x1 - 2).all() and (corners[:, 0] <= x2 + 2).all()
    assert (corners[:, 1] >= y1 - 2).all() and (corners[:, 1] <= y2 + 2).all()

    level = level_crop(scene, corners, padding=0.1)
    assert level.shape[1] > 3 * level.shape[0]  # a line, turned level
    assert read(level) == TEXT
    box = scene[int(y1) : int(y2), int(x1) : int(x2)]
    assert read(box) != TEXT  # the same line read from its upright box: the recognizer cannot


def test_polygons_are_off_by_default_and_leave_the_regions_as_they_were() -> None:
    scene = tilted_scene()
    assert RegionsPostprocess(type="regions").polygons is False
    with_polygons, plain = detect(scene), detect(scene, polygons=False)
    assert "polygon" not in plain[0]
    assert [{k: v for k, v in r.items() if k != "polygon"} for r in with_polygons] == plain
