"""Text lines for the CTC tests: the real PP-OCR recognizer from the rapidocr wheel, its own
preprocessing (BGR, height 48 keeping the aspect up to 320 wide, (img/255 - 0.5) / 0.5) and lines
of known text rendered with OpenCV's and Pillow's fonts."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from agent.config import PreprocessConfig, ResizeConfig
from agent.config.processing import CtcPostprocess
from agent.model_hints import embedded_hints
from providers import ModelArtifact
from tests.store_fixtures import rapidocr_models_dir

REC_MODEL_FILE = "ch_PP-OCRv4_rec_infer.onnx"
REC_OUTPUT = "softmax_11.tmp_0"  # [N, T, 6625]: the blank, 6623 dictionary lines, ' '
# PP-OCR rec's own preprocessing; pad 128 is the 0 rapidocr pads its normalised input with.
REC_PREPROCESS = PreprocessConfig(
    color="bgr",
    scale=1 / 255,
    mean=[0.5],
    std=[0.5],
    resize=ResizeConfig(width=320, height=48, mode="height", pad=128),  # type: ignore[call-arg]
)


def rec_model() -> Path:
    return rapidocr_models_dir() / REC_MODEL_FILE


def rec_artifact() -> ModelArtifact:
    return ModelArtifact(rec_model(), "onnx", "c" * 64, name=REC_MODEL_FILE)


def rec_postprocess() -> CtcPostprocess:
    """The ctc postprocess with the characters the model's own metadata gives (the hints)."""
    characters = embedded_hints([rec_artifact()])["characters"]
    return CtcPostprocess(type="ctc", characters=characters)


def cv2_line(text: str, scale: float, font: int = cv2.FONT_HERSHEY_SIMPLEX, thickness: int = 2) -> np.ndarray:
    """Black `text` on white (BGR), with a margin of about half the text's height around it."""
    (width, height), baseline = cv2.getTextSize(text, font, scale, thickness)
    margin = max(2, height // 2)
    image = np.full((height + baseline + 2 * margin, width + 2 * margin, 3), 255, np.uint8)
    cv2.putText(image, text, (margin, margin + height), font, scale, (0, 0, 0), thickness, cv2.LINE_AA)
    return image


def pillow_line(text: str, size: int, ink: tuple[int, int, int] = (20, 20, 120)) -> np.ndarray:
    """`text` in Pillow's own font (FreeType, `size` pixels), `ink` (RGB) on a light background (BGR)."""
    font = ImageFont.load_default(size=size)
    left, top, right, bottom = font.getbbox(text)
    margin = size // 4
    image = Image.new("RGB", (right - left + 2 * margin, bottom - top + 2 * margin), (235, 235, 225))
    ImageDraw.Draw(image).text((margin - left, margin - top), text, font=font, fill=ink)
    return cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR)
