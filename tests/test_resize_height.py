"""`preprocess.resize.mode: height`, as CTC text recognizers want their input: the image scaled to
the input's height with its aspect kept, at the left, the rest of the width padded, a wider image
squeezed to the width. Checked on its geometry, and on the real PP-OCR recognizer from the rapidocr
wheel reading lines rendered in several fonts and sizes exactly."""

from __future__ import annotations

from collections.abc import Iterator

import cv2
import numpy as np
import pytest

from agent.config import PreprocessConfig, ResizeConfig
from agent.processing import Preprocessor
from agent.processing.postprocess import Ctc
from providers import Session, TensorSpec, get_backend
from tests.text_lines import REC_PREPROCESS, cv2_line, pillow_line, rec_artifact, rec_postprocess

INPUT = [TensorSpec("x", ("n", 3, 48, "w"), "float32")]  # PP-OCR rec's: height fixed, width open
PAD = (128 / 255 - 0.5) / 0.5  # the pad value after the normalisation


def test_a_narrow_image_keeps_its_aspect_at_the_left_and_the_rest_is_padded() -> None:
    preprocess = Preprocessor(REC_PREPROCESS, INPUT)
    crop = np.zeros((20, 60, 3), np.uint8)  # black: -1 after the normalisation
    tensor, geometry = preprocess.prepare(crop)
    assert tensor.shape == (1, 3, 48, 320)
    # Scaled 2.4x both ways: 144 x 48 at the left, then 176 columns of padding.
    assert (geometry.scale_x, geometry.scale_y, geometry.offset_x, geometry.offset_y) == (2.4, 2.4, 0, 0)
    assert np.all(tensor[..., :144] == -1.0) and np.allclose(tensor[..., 144:], PAD, atol=1e-6)
    # The geometry maps input pixels back to the crop's.
    assert geometry.to_source(np.array([[0.0, 0.0, 144.0, 48.0]])).tolist() == [[0.0, 0.0, 60.0, 20.0]]


def test_a_wide_image_is_squeezed_to_the_width() -> None:
    preprocess = Preprocessor(REC_PREPROCESS, INPUT)
    tensor, geometry = preprocess.prepare(np.zeros((20, 400, 3), np.uint8))
    assert (geometry.scale_x, geometry.scale_y) == (0.8, 2.4)  # 960 wide at height 48: squeezed to 320
    assert np.all(tensor == -1.0)  # no padding
    assert geometry.to_source(np.array([[0.0, 0.0, 320.0, 48.0]])).tolist() == [[0.0, 0.0, 400.0, 20.0]]
    # A tall image: its height, at least one column.
    resize = ResizeConfig(width=32, height=8, mode="height", pad=0)  # type: ignore[call-arg]
    tall = Preprocessor(
        PreprocessConfig(resize=resize, color="gray"), [TensorSpec("x", (1, 1, 8, 32), "float32")]
    )
    tensor, geometry = tall.prepare(np.full((400, 10, 3), 255, np.uint8))
    assert geometry.scale_y == 8 / 400 and geometry.scale_x == 1 / 10
    assert tensor[0, 0, :, 0].tolist() == [1.0] * 8 and not tensor[0, 0, :, 1:].any()


@pytest.fixture(scope="module")
def rec_session() -> Iterator[Session]:
    session = get_backend("onnxruntime/CPUExecutionProvider").load(rec_artifact())
    yield session
    session.close()


LINES = [  # (text, its picture): OpenCV's Hershey fonts and Pillow's own, 20 to 160 pixels high
    ("EDGE CAMERA 42", cv2_line("EDGE CAMERA 42", 1.0)),
    ("Gate B", cv2_line("Gate B", 0.6, thickness=1)),
    ("Hello World 2026", cv2_line("Hello World 2026", 1.8, cv2.FONT_HERSHEY_DUPLEX, 3)),
    ("PLATE KA-7321", cv2_line("PLATE KA-7321", 0.9, cv2.FONT_HERSHEY_COMPLEX)),
    ("Exit", cv2_line("Exit", 3.0, thickness=5)),
    ("Parking", pillow_line("Parking", 40)),
    ("bay 7 FULL", pillow_line("bay 7 FULL", 24)),
    ("Dock 12", pillow_line("Dock 12", 64)),
    ("Loading zone", pillow_line("Loading zone", 18)),
]


def test_the_real_recognizer_reads_rendered_lines_exactly(rec_session: Session) -> None:
    preprocess = Preprocessor(REC_PREPROCESS, rec_session.inputs)
    post = Ctc(rec_postprocess(), rec_session.outputs)
    heights = {picture.shape[0] for _, picture in LINES}
    assert min(heights) < 48 < max(heights)  # some are enlarged, some shrunk
    batch = np.concatenate([preprocess(picture) for _, picture in LINES])
    read = post.rows(rec_session.run({"x": batch}))
    assert [r["text"] for r in read] == [text for text, _ in LINES]
    assert all(r["score"] > 0.9 for r in read), read
    # Stretched to 320 x 48 instead, the short lines are no longer read right.
    stretch = PreprocessConfig.model_validate(
        {**REC_PREPROCESS.model_dump(), "resize": {"width": 320, "height": 48}}
    )
    stretched = Preprocessor(stretch, rec_session.inputs)
    batch = np.concatenate([stretched(picture) for _, picture in LINES])
    wrong = [r["text"] for r in post.rows(rec_session.run({"x": batch}))]
    assert wrong != [text for text, _ in LINES]
