"""Image preprocessing from YAML: resize (stretch, letterbox, crop, height), colour order, scale/mean/std,
layout, dtype (int8/uint8 quantised with the model's scale and zero point).

All steps are whole-array operations (OpenCV and numpy); nothing loops over pixels. `prepare`
also returns the Geometry of the resize, so that postprocessing maps boxes back to the source.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from agent.config import PreprocessConfig
from agent.errors import ModelError
from providers import TensorSpec


@dataclass(frozen=True)
class Geometry:
    """How a source frame was fitted into the model input: input = source * scale + offset.

    A letterbox has offsets >= 0 (the padding), a centre crop offsets <= 0 (the cut-off part).
    """

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    source_width: int
    source_height: int
    input_width: int  # the model input's size, which a probability map's pixels scale to
    input_height: int

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """[N, 4] boxes (x1, y1, x2, y2) in model-input pixels -> source pixels, clipped to the frame."""
        out = np.empty_like(boxes, dtype=np.float64)
        out[:, 0::2] = (boxes[:, 0::2] - self.offset_x) / self.scale_x
        out[:, 1::2] = (boxes[:, 1::2] - self.offset_y) / self.scale_y
        out[:, 0::2] = out[:, 0::2].clip(0, self.source_width)
        out[:, 1::2] = out[:, 1::2].clip(0, self.source_height)
        return out

    def of_crop(self, left: int, top: int, frame_width: int, frame_height: int) -> Geometry:
        """This geometry of a crop whose top-left corner is at (left, top) of a larger frame, as the
        frame's: a crop is one more offset, so boxes map back to (and are clipped to) the frame."""
        return Geometry(
            self.scale_x,
            self.scale_y,
            self.offset_x - left * self.scale_x,
            self.offset_y - top * self.scale_y,
            frame_width,
            frame_height,
            self.input_width,
            self.input_height,
        )

    @classmethod
    def identity(cls, width: int, height: int) -> Geometry:
        """A frame's own pixels (boxes already in frame pixels: the motion regions' merged ones)."""
        return cls(1.0, 1.0, 0, 0, width, height, width, height)


class Preprocessor:
    """Turns one BGR uint8 frame (as OpenCV decodes it) into the model's input tensor."""

    def __init__(self, config: PreprocessConfig, inputs: list[TensorSpec]) -> None:
        self.config = config
        self.input = _pick_input(config.input, inputs)
        channels_axis, height_axis, width_axis = (1, 2, 3) if config.layout == "nchw" else (3, 1, 2)
        if len(self.input.shape) != 4:
            raise ModelError(
                f"model input {self.input.name!r} has shape {list(self.input.shape)}; "
                "image preprocessing needs a 4-D input (N,C,H,W or N,H,W,C)"
            )
        self.channels = 1 if config.color == "gray" else 3
        model_channels = self.input.fixed_dim(channels_axis)
        if model_channels is not None and model_channels != self.channels:
            raise ModelError(
                f"model input {self.input.name!r} has {model_channels} channels on axis {channels_axis} "
                f"({config.layout}), but preprocess.color {config.color!r} gives {self.channels}; "
                "check preprocess.layout and preprocess.color"
            )
        model_h, model_w = self.input.fixed_dim(height_axis), self.input.fixed_dim(width_axis)
        if config.resize is not None:
            if (model_h and model_h != config.resize.height) or (model_w and model_w != config.resize.width):
                raise ModelError(
                    f"preprocess.resize {config.resize.width}x{config.resize.height} does not match the "
                    f"model input {self.input.name!r} size {model_w}x{model_h}"
                )
            self.width, self.height = config.resize.width, config.resize.height
        elif model_h and model_w:
            self.width, self.height = model_w, model_h
        else:
            raise ModelError(
                f"model input {self.input.name!r} has an open size {list(self.input.shape)}; "
                "set preprocess.resize to the width and height the model expects"
            )
        if config.dtype != self.input.dtype:
            raise ModelError(
                f"preprocess.dtype is {config.dtype}, "
                f"but model input {self.input.name!r} takes {self.input.dtype}"
            )
        self.dtype = np.dtype(config.dtype)
        self.quantization: tuple[float, int] | None = (
            (config.quantization.scale, config.quantization.zero_point)
            if config.quantization is not None
            else self.input.quantization
        )
        if self.dtype == np.int8 and self.quantization is None:
            raise ModelError(
                f"model input {self.input.name!r} takes int8 and the model does not say how it is "
                "quantised: set preprocess.quantization {scale, zero_point}"
            )
        if self.quantization is not None and self.dtype.kind not in "iu":
            raise ModelError(f"preprocess.quantization applies to int8 and uint8 inputs, not {config.dtype}")
        # Fold scale, mean and std into one multiply-add: x * a + b.
        mean = np.asarray(config.mean, dtype=np.float32)
        std = np.asarray(config.std, dtype=np.float32)
        self._mul = (config.scale / std).astype(np.float32)
        self._add = (-mean / std).astype(np.float32)
        self._mul_chw = self._mul.reshape(-1, 1, 1)  # the same, broadcast over a channels-first image
        self._add_chw = self._add.reshape(-1, 1, 1)
        self.shape = (
            (1, self.channels, self.height, self.width)
            if config.layout == "nchw"
            else (1, self.height, self.width, self.channels)
        )

    def geometry(self, source_height: int, source_width: int) -> Geometry:
        """Where a frame of this size lands in the model input (resize.mode and resize.anchor)."""
        resize = self.config.resize
        mode = resize.mode if resize is not None else "stretch"
        if mode == "stretch":
            return Geometry(
                self.width / source_width,
                self.height / source_height,
                0,
                0,
                source_width,
                source_height,
                self.width,
                self.height,
            )
        if mode == "height":  # text lines: the input's height, the aspect kept up to the input's width
            width = min(max(1, round(source_width * self.height / source_height)), self.width)
            return Geometry(
                width / source_width,
                self.height / source_height,
                0,
                0,
                source_width,
                source_height,
                self.width,
                self.height,
            )
        fit = min if mode == "letterbox" else max
        scale = fit(self.width / source_width, self.height / source_height)
        width, height = max(1, round(source_width * scale)), max(1, round(source_height * scale))
        centred = resize is None or resize.anchor == "center"
        offset_x = (self.width - width) // 2 if centred else 0
        offset_y = (self.height - height) // 2 if centred else 0
        return Geometry(
            width / source_width,
            height / source_height,
            offset_x,
            offset_y,
            source_width,
            source_height,
            self.width,
            self.height,
        )

    def prepare(self, frame: np.ndarray) -> tuple[np.ndarray, Geometry]:
        """The input tensor, and how the frame was fitted into it."""
        geometry = self.geometry(frame.shape[0], frame.shape[1])
        width = round(geometry.scale_x * geometry.source_width)
        height = round(geometry.scale_y * geometry.source_height)
        image = cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR)
        if (width, height) != (self.width, self.height):  # letterbox, crop, height: one copy into the input
            x, y = int(geometry.offset_x), int(geometry.offset_y)
            pad = self.config.resize.pad if self.config.resize is not None else 0
            canvas = np.full((self.height, self.width, image.shape[2]), pad, dtype=image.dtype)
            # The overlap of the resized image (placed at x, y) with the canvas.
            top, left = max(y, 0), max(x, 0)
            bottom, right = min(y + height, self.height), min(x + width, self.width)
            canvas[top:bottom, left:right] = image[top - y : bottom - y, left - x : right - x]
            image = canvas
        return self._to_tensor(image), geometry

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        return self.prepare(frame)[0]

    def _to_tensor(self, image: np.ndarray) -> np.ndarray:
        if self.config.color == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        elif self.config.color == "gray":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None]
        if self.quantization is not None:  # the real values the float model wanted, quantised
            scale, zero_point = self.quantization
            limits = np.iinfo(self.dtype)
            real = image.astype(np.float32) * self._mul + self._add
            tensor = np.clip(np.rint(real / scale + zero_point), limits.min, limits.max)
        elif self.dtype == np.uint8:
            tensor = image  # quantised models without parameters take raw pixels; scale/mean/std do not apply
        else:
            return self._normalised(image)
        if self.config.layout == "nchw":
            tensor = tensor.transpose(2, 0, 1)
        return np.ascontiguousarray(tensor[None], dtype=self.dtype)

    def _normalised(self, image: np.ndarray) -> np.ndarray:
        """x * a + b into a new float input in two passes, channels-first read straight from the
        pixels (a per-channel multiply over HWC runs numpy's loops 3 values at a time: PP-OCR det's
        640x256 input took 2.5 ms that way, 0.3 ms this way)."""
        nchw = self.config.layout == "nchw"
        pixels = image.transpose(2, 0, 1) if nchw else image
        mul, add = (self._mul_chw, self._add_chw) if nchw else (self._mul, self._add)
        tensor = np.empty((1, *pixels.shape), dtype=np.float32)
        np.multiply(pixels, mul, out=tensor[0])
        np.add(tensor[0], add, out=tensor[0])
        return tensor if self.dtype == np.float32 else tensor.astype(self.dtype)


def keep_opencv_serial() -> None:
    """One OpenCV thread for the process: its own pool would spread each resize over every core,
    the cores inference is using (and wait actively between frames), while a pipeline already
    prepares frames on a thread of its own beside inference. The daemon calls it once."""
    cv2.setNumThreads(1)


def _pick_input(name: str | None, inputs: list[TensorSpec]) -> TensorSpec:
    if name is not None:
        for spec in inputs:
            if spec.name == name:
                return spec
        raise ModelError(
            f"preprocess.input {name!r} is not a model input; inputs: {[i.name for i in inputs]}"
        )
    if len(inputs) != 1:
        raise ModelError(
            f"the model has {len(inputs)} inputs {[i.name for i in inputs]}; "
            "set preprocess.input to the image one"
        )
    return inputs[0]
