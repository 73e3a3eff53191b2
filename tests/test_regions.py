"""Probability maps to regions: the real PP-OCRv4 text detector (DB) on rendered text, on every ONNX
backend here, gives one box per line of text where the text is, in source-image pixels, through a
plain resize and through a letterbox. Plus the rules of the map decoding on hand-made maps."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from agent.config import PreprocessConfig, RegionsPostprocess, ResizeConfig
from agent.errors import ModelError
from agent.processing import Geometry, Preprocessor, build_postprocessor
from providers import ModelArtifact, TensorSpec, get_backend
from tests.cpu_precision import exact_options
from tests.store_fixtures import rapidocr_models_dir

ONNX_BACKENDS = ("onnxruntime/CPUExecutionProvider", "openvino/CPU", "openvino/AUTO")
LINES = ("EDGE CAMERA 42", "Hello World 2026")


def _iou(a: list[float], b: list[float]) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _text_frame(
    height: int, width: int, scale: float, left: int, tops: tuple[int, int]
) -> tuple[np.ndarray, list[list[float]]]:
    """A white frame with LINES in black; the tight box of each line's ink, in frame pixels."""
    frame = np.full((height, width, 3), 255, np.uint8)
    boxes = []
    for text, top in zip(LINES, tops, strict=True):
        thickness = round(3 * scale / 1.2)
        (_, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
        cv2.putText(frame, text, (left, top + h), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thickness)
        ink = np.argwhere(frame[top - 5 : top + h + base + 5, :, 0] < 128)
        boxes.append(
            [
                float(ink[:, 1].min()),
                float(top - 5 + ink[:, 0].min()),
                float(ink[:, 1].max() + 1),
                float(top - 5 + ink[:, 0].max() + 1),
            ]
        )
    return frame, boxes


def _regions(backend: str, frame: np.ndarray, mode: str) -> list[dict[str, object]]:
    artifact = ModelArtifact(rapidocr_models_dir() / "ch_PP-OCRv4_det_infer.onnx", "onnx", "0" * 64)
    session = get_backend(backend).load(artifact, exact_options(backend))  # f32 on any CPU
    try:
        resize = ResizeConfig(width=640, height=256, mode=mode, pad=255)  # type: ignore[arg-type]
        config = PreprocessConfig(resize=resize, color="bgr", mean=[0.5], std=[0.5])
        preprocess = Preprocessor(config, session.inputs)
        postprocess = build_postprocessor(
            RegionsPostprocess(type="regions", threshold=0.3, unclip_ratio=1.5), session.outputs
        )
        tensor, geometry = preprocess.prepare(frame)
        regions: list[dict[str, object]] = postprocess(session.run({"x": tensor}), geometry)["regions"]
    finally:
        session.close()
    return regions


@pytest.mark.parametrize("backend", ONNX_BACKENDS)
def test_text_detector_boxes_every_line_where_it_is(backend: str) -> None:
    # Same aspect as the model input (2.5:1), twice its size: a plain resize.
    frame, truth = _text_frame(512, 1280, 2.4, 60, (80, 280))
    regions = _regions(backend, frame, "stretch")
    assert len(regions) == 2, regions  # one per line, in reading order
    for region, box in zip(regions, truth, strict=True):
        assert _iou(region["box"], box) >= 0.7, (region, box)  # type: ignore[arg-type]
        assert float(region["score"]) > 0.8 and int(region["area"]) > 500  # type: ignore[arg-type]

    # Another shape (5:3): letterboxed into the input, white bars; boxes still in frame pixels.
    frame, truth = _text_frame(600, 1000, 2.4, 40, (150, 400))
    regions = _regions(backend, frame, "letterbox")
    assert len(regions) == 2, regions
    for region, box in zip(regions, truth, strict=True):
        assert _iou(region["box"], box) >= 0.6, (region, box)  # type: ignore[arg-type]


def test_a_blank_frame_has_no_regions() -> None:
    assert _regions(ONNX_BACKENDS[0], np.full((256, 640, 3), 255, np.uint8), "stretch") == []


# --- decoding rules on hand-made maps ------------------------------------------------------------------


def _map(height: int, width: int, *blobs: tuple[int, int, int, int, float]) -> np.ndarray:
    probability = np.zeros((1, 1, height, width), np.float32)
    for x1, y1, x2, y2, value in blobs:
        probability[0, 0, y1:y2, x1:x2] = value
    return probability


def test_regions_in_reading_order_with_noise_and_weak_ones_dropped() -> None:
    spec = [TensorSpec("map", (1, 1, None, None), "float32")]
    config = RegionsPostprocess(type="regions", min_area=10, min_score=0.5)
    probability = _map(
        100, 200,
        (120, 10, 180, 20, 0.9),  # top right
        (10, 10, 60, 20, 0.8),  # top left: first in reading order
        (10, 50, 60, 60, 0.4),  # above threshold, below min_score
        (100, 80, 102, 82, 0.99),  # 4 pixels: noise
    )  # fmt: skip
    regions = build_postprocessor(config, spec)({"map": probability})["regions"]
    assert regions == [
        {"score": 0.8, "area": 500, "box": [10.0, 10.0, 60.0, 20.0]},
        {"score": 0.9, "area": 600, "box": [120.0, 10.0, 180.0, 20.0]},
    ]
    best_only = RegionsPostprocess(type="regions", min_area=10, max_regions=1)
    assert [r["score"] for r in build_postprocessor(best_only, spec)({"map": probability})["regions"]] == [
        0.9
    ]


def test_a_map_smaller_than_the_input_scales_up_and_unclip_grows_boxes() -> None:
    spec = [TensorSpec("map", (1, 1, 64, 160), "float32")]
    geometry = Geometry(1.0, 1.0, 0, 0, 640, 256, 640, 256)  # the input is 4x the map
    plain = build_postprocessor(RegionsPostprocess(type="regions"), spec)
    probability = _map(64, 160, (10, 10, 30, 20, 0.9))
    assert plain({"map": probability}, geometry)["regions"][0]["box"] == [40.0, 40.0, 120.0, 80.0]
    grown = build_postprocessor(RegionsPostprocess(type="regions", unclip_ratio=1.5), spec)
    # 20 x 10 map pixels: area 200 x 1.5 / perimeter 60 = 5 map pixels on every side.
    assert grown({"map": probability}, geometry)["regions"][0]["box"] == [20.0, 20.0, 140.0, 100.0]


def test_bad_maps_and_shapes_are_clear_errors() -> None:
    with pytest.raises(ModelError, match=r"a probability map is \[1, 1, H, W\], \[1, H, W\] or \[H, W\]"):
        build_postprocessor(
            RegionsPostprocess(type="regions"), [TensorSpec("map", (1, 3, 64, 64), "float32")]
        )
    with pytest.raises(ModelError, match=r"has shape \[10\]"):
        build_postprocessor(RegionsPostprocess(type="regions"), [TensorSpec("map", (10,), "float32")])
    post = build_postprocessor(
        RegionsPostprocess(type="regions"), [TensorSpec("map", (None, 1, None, None), "float32")]
    )
    with pytest.raises(ModelError, match=r"has shape \[2, 1, 8, 8\], not one map"):
        post({"map": np.zeros((2, 1, 8, 8), np.float32)})
    broken = _map(8, 8, (0, 0, 4, 4, 0.9))
    broken[0, 0, 7, 7] = np.nan
    with pytest.raises(ModelError, match="NaN or infinite values"):
        post({"map": broken})
