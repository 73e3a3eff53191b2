"""What every step shares: the frame record the steps fill in, the step's own counters, and `Step`.

A frame walks an ordered list of steps (agent/steps/__init__.py `build_steps`) over one record. Each
step reads what earlier steps wrote and writes its own fields. A step runs on one of the pipeline's
three threads (agent/pipeline.py): `prepare` (ahead of the model, overlapping its run), `inference`
(the model's thread) or `report` (after the model: postprocess, tracking, rules, the result). A gate
may end a frame early (nothing more to do for it: held back, no motion); a failing step ends it and
is counted, by its own name, unless the step says its failure costs only its own work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from agent.processing import Geometry
from agent.sources import Frame

# The pipeline's threads, in the order a frame meets them.
Thread = Literal["prepare", "inference", "report"]
THREADS: tuple[Thread, ...] = get_args(Thread)
# The steps whose times a result reports as its `preprocess` and `inference` latencies.
PREPROCESS_STEP, INFERENCE_STEP = "preprocess", "inference"


@dataclass
class CropRun:
    """One motion region of a frame (agent/processing/motion_regions.py): the detector's run on a crop."""

    box: tuple[int, int, int, int]  # the crop, in frame pixels
    feeds: dict[str, np.ndarray] | None  # its inputs (prepare -> infer)
    geometry: Geometry | None  # crop-input pixels -> frame pixels
    outputs: dict[str, np.ndarray] | None = None  # the model's raw outputs on it (infer -> postprocess)


@dataclass
class FrameRecord:
    """One frame on its way through the steps: what the source gave, then what each step made of it.

    `pixels` are the frame's data (BGR image, or an audio window's samples) while a step still needs
    them: the pipeline lets them go after the model ran unless a later step declared `needs_pixels`.
    """

    index: int  # the frame's number since the source started
    captured_at: float  # wall clock when decoded
    position_s: float | None  # position in a file
    gap: bool  # the stream restarted before this frame
    pixels: np.ndarray | None
    # Where the frame moved, (x1, y1, x2, y2) in frame pixels (the motion gate's; None: no gate ran).
    motion_areas: list[tuple[int, int, int, int]] | None = None
    frames_gated: int = 0  # frames the motion gate skipped before this one
    feeds: dict[str, np.ndarray] | None = None  # the model's inputs (prepare -> infer)
    geometry: Geometry | None = None  # how an image was fitted into the model's input
    outputs: dict[str, np.ndarray] | None = None  # the model's raw outputs (infer -> postprocess)
    # Motion regions: the detector runs on these crops instead of `feeds` (None: on the whole frame).
    crops: list[CropRun] | None = None
    backend: str = ""  # the backend the model ran on (a switch may follow before the result)
    precision: str = ""
    output: dict[str, Any] | None = None  # postprocessed: detections/regions (with track_id), labels...
    events: list[dict[str, Any]] = field(default_factory=list)  # tracking events of this frame
    scene: dict[str, Any] | None = None  # the scene's counts after this frame (when it had events)
    publish: bool = False  # whether the frame's result is published (the report rules' verdict)
    held_back: int = 0  # results held back by the rules since the last published one
    tags: dict[str, Any] = field(default_factory=dict)  # what steps add to the published result
    timings_ms: dict[str, float] = field(default_factory=dict)  # per step, in the order run

    @property
    def inference_ms(self) -> float:
        """How long the model's run on this frame took (0 before it ran)."""
        return self.timings_ms.get(INFERENCE_STEP, 0.0)

    @classmethod
    def of(cls, frame: Frame) -> FrameRecord:
        return cls(frame.index, frame.captured_at, frame.position_s, frame.gap, frame.data)


class StepStats:
    """A step's counters: frames it ran on, failures, time spent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs = 0
        self.failures = 0
        self.ended = 0  # frames a gate ended here
        self.total_ms = 0.0

    def count(self, ms: float, failed: bool = False, ended: bool = False) -> None:
        with self._lock:
            self.runs += 1
            self.failures += failed
            self.ended += ended
            self.total_ms += ms

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            mean = self.total_ms / self.runs if self.runs else None
            return {
                "runs": self.runs,
                "failures": self.failures,
                "ended": self.ended,
                "mean_ms": None if mean is None else round(mean, 3),
            }


class Step:
    """One thing done to each frame. Subclasses set `name`, `thread`, and implement `run`."""

    name: ClassVar[str]
    thread: Thread = "report"
    gate: ClassVar[bool] = False  # may end a frame early (run returns False)
    failure_ends_frame: ClassVar[bool] = True  # False: a failure costs only this step's work
    needs_pixels: bool = False  # the frame's pixels must reach this step (report-thread steps)

    def __init__(self) -> None:
        self.stats = StepStats()

    @property
    def failure(self) -> str:
        """How a failure of this step reads in the status and the log: `<what> failed: <error>`."""
        return f"{self.name} failed"

    def run(self, record: FrameRecord) -> bool:
        """Do this step's work on the record; False (gates only) ends the frame here."""
        raise NotImplementedError

    def status(self) -> dict[str, Any] | None:
        """What this step shows in the pipeline's status under `steps.<name>` (its own counters and
        state, JSON); None: nothing."""
        return None
