"""Infer: one run of the model on the frame's inputs.

The run itself is the stage's (agent/stage.py `Stage.infer`: the stage's counters, the NaN watch of a
health window, frames offered to a backend proof). This step also notices a backend that keeps failing
and hands over to the next candidate (`Stage.fall_back`) after a few failures in a row.

A frame cut into motion regions (`FrameRecord.crops`) runs the model on each crop: in one batched run
when the model's batch axis is dynamic (`batches`), else one run a crop. The step's time (the result's
`inference` latency) is then all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

from agent.errors import ModelError
from agent.steps.base import INFERENCE_STEP, CropRun, FrameRecord, Step
from providers import BackendError

# Backend failures in a row before the next candidate backend takes over.
SWITCH_AFTER_ERRORS = 5

RunModel = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
T = TypeVar("T")


class InferStep(Step):
    name = INFERENCE_STEP
    thread = "inference"

    def __init__(
        self,
        run_model: RunModel,
        serving: Callable[[], tuple[str, str]],
        fall_back: Callable[[str], None],
        batches: Callable[[], bool] = lambda: False,
    ) -> None:
        """`serving`: the backend and precision the model runs on now; `fall_back(why)`: try the next
        candidate backend; `batches`: whether the model now serving runs several inputs at once."""
        super().__init__()
        self.run_model = run_model
        self.serving = serving
        self.fall_back = fall_back
        self.batches = batches
        self.backend_failures_in_row = 0

    def run(self, record: FrameRecord) -> bool:
        crops, feeds = record.crops, record.feeds
        if crops is not None:
            self._watched(lambda: self._run_crops(crops))
        else:
            assert feeds is not None
            record.outputs = self._watched(lambda: self.run_model(feeds))
            record.feeds = None  # the inputs are not needed any more
        record.backend, record.precision = self.serving()
        return True

    def _run_crops(self, crops: list[CropRun]) -> None:
        """The model on each crop's inputs: stacked into one batch when it batches, else one by one."""
        if len(crops) > 1 and self.batches():
            feeds = [crop.feeds or {} for crop in crops]
            outputs = self.run_model({name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]})
            wrong = {name: list(v.shape) for name, v in outputs.items() if v.shape[:1] != (len(crops),)}
            if wrong:
                raise ModelError(f"a batch of {len(crops)} motion regions gave outputs of shapes {wrong}")
            for i, crop in enumerate(crops):
                crop.outputs, crop.feeds = {n: v[i : i + 1] for n, v in outputs.items()}, None
            return
        for crop in crops:
            assert crop.feeds is not None
            crop.outputs, crop.feeds = self.run_model(crop.feeds), None

    def _watched(self, run: Callable[[], T]) -> T:
        """`run`, a backend that keeps failing handed over to the next candidate."""
        try:
            outputs = run()
        except BackendError as exc:
            self.backend_failures_in_row += 1
            if self.backend_failures_in_row >= SWITCH_AFTER_ERRORS:
                self.backend_failures_in_row = 0
                self.fall_back(f"{SWITCH_AFTER_ERRORS} failures in a row ({exc})")
            raise
        self.backend_failures_in_row = 0
        return outputs
