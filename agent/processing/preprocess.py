"""Image preprocessing from YAML: resize, colour order, scale/mean/std, layout, dtype.

All steps are whole-array operations (OpenCV and numpy); nothing loops over pixels.
"""

from __future__ import annotations

import cv2
import numpy as np

from agent.config import PreprocessConfig
from agent.errors import ModelError
from providers import TensorSpec


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
        # Fold scale, mean and std into one multiply-add: x * a + b.
        mean = np.asarray(config.mean, dtype=np.float32)
        std = np.asarray(config.std, dtype=np.float32)
        self._mul = (config.scale / std).astype(np.float32)
        self._add = (-mean / std).astype(np.float32)
        self.shape = (
            (1, self.channels, self.height, self.width)
            if config.layout == "nchw"
            else (1, self.height, self.width, self.channels)
        )

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        image = cv2.resize(frame, (self.width, self.height), interpolation=cv2.INTER_LINEAR)
        if self.config.color == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        elif self.config.color == "gray":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[:, :, None]
        if self.dtype == np.uint8:
            tensor = image  # quantised models take raw pixels; scale/mean/std do not apply
        else:
            tensor = image.astype(np.float32) * self._mul + self._add
        if self.config.layout == "nchw":
            tensor = tensor.transpose(2, 0, 1)
        return np.ascontiguousarray(tensor[None], dtype=self.dtype)


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
