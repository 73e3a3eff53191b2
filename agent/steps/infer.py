"""Infer: one run of the model on the frame's inputs.

The run itself is the stage's (agent/stage.py `Stage.infer`: the stage's counters, the NaN watch of a
health window, frames offered to a backend proof). This step also notices a backend that keeps failing
and hands over to the next candidate (`Stage.fall_back`) after a few failures in a row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from agent.steps.base import INFERENCE_STEP, FrameRecord, Step
from providers import BackendError

# Backend failures in a row before the next candidate backend takes over.
SWITCH_AFTER_ERRORS = 5

RunModel = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class InferStep(Step):
    name = INFERENCE_STEP
    thread = "inference"

    def __init__(
        self,
        run_model: RunModel,
        serving: Callable[[], tuple[str, str]],
        fall_back: Callable[[str], None],
    ) -> None:
        """`serving`: the backend and precision the model runs on now; `fall_back(why)`: try the next
        candidate backend."""
        super().__init__()
        self.run_model = run_model
        self.serving = serving
        self.fall_back = fall_back
        self.backend_failures_in_row = 0

    def run(self, record: FrameRecord) -> bool:
        assert record.feeds is not None
        try:
            outputs = self.run_model(record.feeds)
        except BackendError as exc:
            self.backend_failures_in_row += 1
            if self.backend_failures_in_row >= SWITCH_AFTER_ERRORS:
                self.backend_failures_in_row = 0
                self.fall_back(f"{SWITCH_AFTER_ERRORS} failures in a row ({exc})")
            raise
        self.backend_failures_in_row = 0
        record.outputs, record.feeds = outputs, None  # the inputs are not needed any more
        record.backend, record.precision = self.serving()
        return True
