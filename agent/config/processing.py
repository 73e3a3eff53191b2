"""A pipeline's processing around the model: preprocess, recurrent state and postprocess."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from agent.config.base import StrictModel


class ResizeConfig(StrictModel):
    width: int = Field(ge=1, le=8192)
    height: int = Field(ge=1, le=8192)
    mode: Literal["stretch", "letterbox", "crop", "height"] = Field(
        "stretch",
        description="stretch: to width x height, aspect ratio lost; letterbox: fit inside, aspect kept, "
        "the rest padded (detectors); crop: fill, aspect kept, the overhang cut off (classifiers); "
        "height: scaled to the height, aspect kept, at the left, the rest of the width padded, a wider "
        "image squeezed to the width (CTC text recognizers: PP-OCR rec 48 x up to 320).",
    )
    anchor: Literal["center", "top-left"] = Field(
        "center",
        description="Where the image sits in a letterbox (or which part a crop keeps); height: always left.",
    )
    pad: int = Field(
        114, ge=0, le=255, description="Letterbox and height fill value (Ultralytics pads with 114)."
    )


class QuantizationConfig(StrictModel):
    """How a quantised integer input encodes real values: real = scale * (q - zero_point)."""

    scale: float = Field(gt=0)
    zero_point: int = Field(ge=-128, le=255)


class PreprocessConfig(StrictModel):
    input: str | None = Field(None, description="Model input to feed; defaults to the model's only input.")
    resize: ResizeConfig | None = Field(None, description="Defaults to the model's fixed input size.")
    color: Literal["rgb", "bgr", "gray"] = "rgb"
    scale: float = Field(1 / 255, description="Pixel values are multiplied by this first.")
    # One value applies to every channel, so the defaults fit gray as well as rgb/bgr.
    mean: list[float] = Field(default_factory=lambda: [0.0])
    std: list[float] = Field(
        default_factory=lambda: [1.0], json_schema_extra={"items": {"type": "number", "not": {"const": 0}}}
    )
    layout: Literal["nchw", "nhwc"] = "nchw"
    dtype: Literal["float32", "float16", "uint8", "int8"] = "float32"
    quantization: QuantizationConfig | None = Field(
        None,
        description="Integer inputs: the values after scale/mean/std are quantised, q = round(x / scale + "
        "zero_point). Default: the model's own parameters (TFLite stores them); uint8 without any are raw "
        "pixels; int8 needs them.",
    )

    @model_validator(mode="after")
    def _check(self) -> PreprocessConfig:
        channels = 1 if self.color == "gray" else 3
        for key in ("mean", "std"):
            values = getattr(self, key)
            if len(values) not in (1, channels):
                raise ValueError(
                    f"{key} needs {'1 value' if channels == 1 else f'1 or {channels} values'} "
                    f"for color {self.color}, got {len(values)}"
                )
        if any(s == 0 for s in self.std):
            raise ValueError("std values must not be 0")
        return self


class AudioPreprocessConfig(StrictModel):
    """Windows of a 1-D signal (audio samples, sensor values) into the model's inputs: the values
    (with context from the previous window) and constant inputs (e.g. a sample-rate input)."""

    type: Literal["audio", "series"]
    input: str | None = Field(None, description="Input for the samples; default: the model's first input.")
    context: int = Field(
        0, ge=0, le=1_000_000, description="Samples of the previous window put before each window."
    )
    constants: dict[str, float] = Field(
        default_factory=dict, description="Inputs fed the same value every run, e.g. {sr: 16000}."
    )


def _preprocess_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "audio" if value.get("type") in ("audio", "series") else "image"
    return "audio" if isinstance(value, AudioPreprocessConfig) else "image"


AnyPreprocessConfig = Annotated[
    Annotated[PreprocessConfig, Tag("image")] | Annotated[AudioPreprocessConfig, Tag("audio")],
    Discriminator(_preprocess_kind),
]


class StateLink(StrictModel):
    """A recurrent model's state: `output` of one run is fed back as `input` on the next."""

    input: str
    output: str


class ClassificationPostprocess(StrictModel):
    type: Literal["classification"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    softmax: bool = Field(True, description="Apply softmax (turn off when the model outputs probabilities).")
    top_k: int = Field(1, ge=1, le=100)
    labels: list[str] | None = Field(None, description="Class names by index.")


class DetectionPostprocess(StrictModel):
    """Boxes from a YOLO-style detector, mapped back to source-image pixels."""

    type: Literal["detection"]
    format: Literal["yolov8", "yolov5", "ssd", "tensors"] = Field(
        "yolov8",
        description="yolov8: [1, 4+classes, boxes] (cx, cy, w, h, class scores); "
        "yolov5: [1, boxes, 5+classes] (cx, cy, w, h, objectness, class scores); "
        "ssd: [1, 1, boxes, 7] (image id, class, score, x1, y1, x2, y2 in 0..1; "
        "Caffe/OpenVINO DetectionOutput); tensors: separate outputs for boxes [1, N, 4], scores [1, N], "
        "classes [1, N] and a count [1] (TensorFlow Object Detection API, TFLite SSD post-processing).",
    )
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    boxes: str | None = Field(
        None, description="tensors: the boxes output; default: the output whose name has 'box' in it."
    )
    scores: str | None = Field(None, description="tensors: the scores output; default: named '*score*'.")
    classes: str | None = Field(
        None,
        description="tensors: the class ids output; default: named '*class*' or '*label*' (else class 0).",
    )
    count: str | None = Field(
        None, description="tensors: how many rows are valid; default: named 'num*' or '*count*' (else all)."
    )
    box_order: Literal["yxyx", "xyxy"] = Field(
        "yxyx", description="tensors: corner order in each box row (TensorFlow: ymin, xmin, ymax, xmax)."
    )
    normalized: bool = Field(True, description="tensors: box coordinates are in 0..1 of the model input.")
    score_threshold: float = Field(0.25, ge=0, le=1)
    iou_threshold: float = Field(0.45, ge=0, le=1, description="Non-maximum suppression, per class.")
    max_detections: int = Field(100, ge=1, le=10_000)
    labels: list[str] | None = Field(None, description="Class names by index.")


class RegionsPostprocess(StrictModel):
    """A probability map (segmentation, a text detector's map) -> regions with boxes in source pixels."""

    type: Literal["regions"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    threshold: float = Field(0.3, ge=0, le=1, description="Map values above this belong to a region.")
    min_area: int = Field(16, ge=1, description="Smaller regions (in map pixels) are noise.")
    min_score: float = Field(0.0, ge=0, le=1, description="Regions whose mean value is lower are dropped.")
    unclip_ratio: float = Field(
        0.0,
        ge=0,
        le=10,
        description="Grow each box by area x ratio / perimeter on every side: DB text detectors shrink "
        "their regions and want 1.5; 0 keeps the boxes as found.",
    )
    max_regions: int = Field(100, ge=1, le=10_000)
    polygons: bool = Field(
        False,
        description="Also give each region's rotated rectangle (`polygon`: 4 corners in source pixels, grown "
        "as its box): text at an angle, which an attribute with crop.align reads turned level.",
    )


class ThresholdPostprocess(StrictModel):
    """One score per run (speech probability, anomaly score) -> active or not, with hysteresis, and
    the start/end events where that changes."""

    type: Literal["threshold"]
    output: str | None = Field(None, description="Model output to read (its first value); default: first.")
    on_score: float = Field(0.5, description="Becomes active when the score reaches this.")
    off_score: float | None = Field(
        None, description="Becomes inactive when the score falls below this; default on_score - 0.15."
    )

    @model_validator(mode="after")
    def _off_below_on(self) -> ThresholdPostprocess:
        if self.off_score is not None and self.off_score > self.on_score:
            raise ValueError(f"off_score ({self.off_score}) must not be above on_score ({self.on_score})")
        return self


class PluginPostprocess(StrictModel):
    """A postprocessor from an installed package, found by name in the `edge_agent.postprocessors`
    entry-point group (docs/plugins.md)."""

    type: Literal["plugin"]
    name: str = Field(min_length=1, description="The entry point's name.")
    options: dict[str, Any] = Field(default_factory=dict, description="Handed to the plugin's factory.")


class CtcPostprocess(StrictModel):
    """A CTC text recognizer's per-step class probabilities [N, T, C] (or [T, C]) -> its text, greedy:
    the best class per step, repeats merged, blanks dropped (PP-OCR rec, CRNN)."""

    type: Literal["ctc"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    softmax: bool = Field(
        False, description="Apply softmax per step (PP-OCR rec already outputs probabilities)."
    )
    blank: int = Field(0, ge=0, description="The blank class's index (PP-OCR: 0).")
    characters: list[str] | None = Field(
        None,
        min_length=1,
        description="The characters by class index, the blank left out: C classes = len + 1. Default: "
        "the model's own (ONNX metadata `character`, PaddleOCR's dictionary, plus its ' ').",
    )

    @model_validator(mode="after")
    def _blank_is_a_class(self) -> CtcPostprocess:
        if self.characters is not None and self.blank > len(self.characters):
            raise ValueError(
                f"blank ({self.blank}) must be a class index: 0..{len(self.characters)} "
                f"for {len(self.characters)} characters"
            )
        return self


class EmbeddingPostprocess(StrictModel):
    """An embedding vector [1, D] (or [D]) -> the vector and its length (face, person or image
    embeddings, to compare by cosine similarity)."""

    type: Literal["embedding"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    normalize: bool = Field(True, description="Scale the vector to length 1 (L2).")


class RawPostprocess(StrictModel):
    type: Literal["raw"]
    max_values: int = Field(1000, ge=1, le=1_000_000, description="Larger outputs are cut (and flagged).")


PostprocessConfig = Annotated[
    ClassificationPostprocess
    | DetectionPostprocess
    | RegionsPostprocess
    | ThresholdPostprocess
    | PluginPostprocess
    | CtcPostprocess
    | EmbeddingPostprocess
    | RawPostprocess,
    Field(discriminator="type"),
]


def gives_boxes(postprocess: object) -> bool:
    """Whether a postprocess gives boxes (detection, regions; a plugin may): what tracking, zones and
    lines need."""
    return isinstance(postprocess, DetectionPostprocess | RegionsPostprocess | PluginPostprocess)
