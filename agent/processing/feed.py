"""Frames -> the model's inputs, run after run: images through the Preprocessor; audio windows with
context from the previous window and constant inputs; and recurrent state (an output of one run
fed back as an input of the next), reset when the stream restarts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from agent.config import AudioPreprocessConfig, PipelineConfig, PreprocessConfig, StateLink
from agent.errors import ModelError
from agent.processing.preprocess import Geometry, Preprocessor
from providers import TensorSpec


class Feeder(Protocol):
    # True when a run's inputs need the previous run's outputs (state links): such a feeder prepares
    # each frame after the run before it, never ahead of it on another thread.
    recurrent: bool
    # The (width, height) an image takes in the model's input (a motion region's crop is cut to its
    # shape, agent/processing/motion_regions.py); None: not images.
    input_size: tuple[int, int] | None

    def feeds(self, data: np.ndarray, gap: bool = False) -> tuple[dict[str, np.ndarray], Geometry | None]:
        """The inputs for one run on `data`; `gap`: the stream restarted, forget what came before."""

    def seen(self, outputs: Mapping[str, np.ndarray]) -> None:
        """The run's outputs, to carry state to the next run."""

    def warm_up_feeds(self) -> dict[str, np.ndarray]:
        """Inputs for a first run before live data: real shapes, constants and the initial state
        (zeros would not do: a sample-rate input of 0 takes a model down another branch)."""


class RecurrentState:
    """The `state` links of a pipeline: zeros at first and after a gap, then the last outputs."""

    def __init__(self, links: list[StateLink], inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        by_input = {spec.name: spec for spec in inputs}
        output_names = {spec.name for spec in outputs}
        self.links = links
        self._initial: dict[str, np.ndarray] = {}
        for link in links:
            if link.input not in by_input:
                raise ModelError(
                    f"state input {link.input!r} is not a model input; inputs: {sorted(by_input)}"
                )
            if link.output not in output_names:
                raise ModelError(
                    f"state output {link.output!r} is not a model output; outputs: {sorted(output_names)}"
                )
            spec = by_input[link.input]
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
            self._initial[link.input] = np.zeros(shape, dtype=spec.dtype)
        self.values = dict(self._initial)

    def reset(self) -> None:
        self.values = dict(self._initial)

    def initial(self) -> dict[str, np.ndarray]:
        return dict(self._initial)

    def carry(self, outputs: Mapping[str, np.ndarray]) -> None:
        for link in self.links:
            value = np.asarray(outputs[link.output])
            if value.shape != self._initial[link.input].shape:
                raise ModelError(
                    f"state output {link.output!r} has shape {list(value.shape)}, but input {link.input!r} "
                    f"takes {list(self._initial[link.input].shape)}"
                )
            self.values[link.input] = value.astype(self._initial[link.input].dtype, copy=False)


class ImageFeeder:
    def __init__(self, preprocess: Preprocessor, state: RecurrentState) -> None:
        self.preprocess = preprocess
        self.state = state
        self.recurrent = bool(state.links)
        self.input_size: tuple[int, int] | None = (preprocess.width, preprocess.height)

    def feeds(self, data: np.ndarray, gap: bool = False) -> tuple[dict[str, np.ndarray], Geometry | None]:
        if gap:
            self.state.reset()
        tensor, geometry = self.preprocess.prepare(data)
        return {self.preprocess.input.name: tensor, **self.state.values}, geometry

    def seen(self, outputs: Mapping[str, np.ndarray]) -> None:
        self.state.carry(outputs)

    def warm_up_feeds(self) -> dict[str, np.ndarray]:
        image = np.zeros(self.preprocess.shape, dtype=self.preprocess.dtype)
        return {self.preprocess.input.name: image, **self.state.initial()}


class AudioFeeder:
    """Windows of float32 samples -> [1, context + window] (the model's dtype), plus constants."""

    def __init__(
        self, config: AudioPreprocessConfig, window: int, inputs: list[TensorSpec], state: RecurrentState
    ) -> None:
        by_name = {spec.name: spec for spec in inputs}
        taken = {link.input for link in state.links} | set(config.constants)
        name = config.input or next((s.name for s in inputs if s.name not in taken), None)
        if name is None or name not in by_name:
            raise ModelError(f"preprocess.input {name!r} is not a model input; inputs: {sorted(by_name)}")
        self.input = by_name[name]
        if len(self.input.shape) != 2:
            raise ModelError(
                f"model input {name!r} has shape {list(self.input.shape)}; audio windows go to a 2-D "
                "[batch, samples] input"
            )
        length = config.context + window
        fixed = self.input.fixed_dim(1)
        if fixed is not None and fixed != length:
            raise ModelError(
                f"model input {name!r} takes {fixed} samples, but context {config.context} + window "
                f"{window} = {length}: set source.window and preprocess.context to match"
            )
        self.context = config.context
        self.window = window
        self._previous = np.zeros(config.context, np.float32)
        self.constants: dict[str, np.ndarray] = {}
        for key, value in config.constants.items():
            if key not in by_name:
                raise ModelError(
                    f"preprocess.constants: {key!r} is not a model input; inputs: {sorted(by_name)}"
                )
            spec = by_name[key]
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
            self.constants[key] = np.full(shape, value, dtype=spec.dtype)
        self.state = state
        self.recurrent = bool(state.links)
        self.input_size: tuple[int, int] | None = None
        missing = set(by_name) - {name} - set(self.constants) - {link.input for link in state.links}
        if missing:
            raise ModelError(
                f"model inputs {sorted(missing)} are not fed: name them in preprocess.constants or state"
            )

    def feeds(self, data: np.ndarray, gap: bool = False) -> tuple[dict[str, np.ndarray], Geometry | None]:
        if gap:
            self._previous = np.zeros(self.context, np.float32)
            self.state.reset()
        samples = np.asarray(data, dtype=np.float32).reshape(-1)
        if samples.size != self.window:
            raise ModelError(f"audio window has {samples.size} samples, expected {self.window}")
        joined = np.concatenate([self._previous, samples]) if self.context else samples
        if self.context:
            self._previous = joined[-self.context :]
        tensor = joined[None].astype(self.input.dtype, copy=False)
        return {self.input.name: tensor, **self.constants, **self.state.values}, None

    def seen(self, outputs: Mapping[str, np.ndarray]) -> None:
        self.state.carry(outputs)

    def warm_up_feeds(self) -> dict[str, np.ndarray]:
        silence = np.zeros((1, self.context + self.window), dtype=self.input.dtype)
        return {self.input.name: silence, **self.constants, **self.state.initial()}


def build_feeder(config: PipelineConfig, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> Feeder:
    state = RecurrentState(config.state, inputs, outputs)
    if isinstance(config.preprocess, AudioPreprocessConfig):
        window = getattr(config.source, "window", None)
        if window is None:  # the config model pairs audio preprocessing with an audio source
            raise ModelError("preprocess.type: audio needs an audio source")
        return AudioFeeder(config.preprocess, window, inputs, state)
    assert isinstance(config.preprocess, PreprocessConfig)
    image_inputs = [spec for spec in inputs if spec.name not in {link.input for link in config.state}]
    return ImageFeeder(Preprocessor(config.preprocess, image_inputs), state)
