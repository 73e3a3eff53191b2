"""The motion gate: the first step of a camera's frame, deciding whether it is worth the model.

A frame goes on when something moved in it (agent/processing/motion.py), while any track of the
pipeline is alive (a person who stops moving is still followed, and a lost track still ends), when
`keepalive_s` passed since the last frame that went on (a static scene is still looked at), or while
a new version is in its health window. The others end here, counted (`frames_gated`; the next
result carries how many were skipped before it).

The background and the counters are the pipeline's (`PipelineMotion`), not this step's: a swapped-in
stage (a new model version) gets a new step on the same background, which is learnt again only when
the `motion:` settings changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent.config import MotionConfig
from agent.processing.motion import Motion, MotionDetector
from agent.steps.base import FrameRecord, Step


class PipelineMotion:
    """One pipeline's motion across its stages: its background, whether it moves now, its counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the prepare thread writes, status readers read
        self.detector: MotionDetector | None = None
        self.moving = False  # the last frame looked at moved
        self.frames_gated = 0  # frames skipped since the pipeline started
        self.gated_since = 0  # ... since the last frame that went on
        self.relearned = 0  # brightness jumps: the background learnt again
        self.last_motion_at: float | None = None  # wall clock of the last frame that moved
        self.last_passed: float | None = None  # the clock (see `_clock`) of the last frame that went on
        # A new version is on trial (its health window, agent/supervisor/health.py): every frame goes
        # on, so that it is judged on live frames (min_frames, errors, its speed beside the old one).
        self.on_trial = False

    def detector_for(self, config: MotionConfig) -> MotionDetector:
        """The background for `config`: the same one while the settings stay, a new one when they change."""
        if self.detector is None or self.detector.config != config:
            self.detector = MotionDetector(config)
        return self.detector

    def took(self, motion: Motion, captured_at: float) -> None:
        with self._lock:
            self.moving = bool(motion.areas)
            self.relearned += motion.relearned
            if motion.areas:
                self.last_motion_at = captured_at

    def passed(self, at: float) -> int:
        """A frame went on at `at`: how many were skipped before it."""
        with self._lock:
            gated, self.gated_since, self.last_passed = self.gated_since, 0, at
            return gated

    def gated(self) -> None:
        with self._lock:
            self.frames_gated += 1
            self.gated_since += 1

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "motion": self.moving,
                "frames_gated": self.frames_gated,
                "relearned": self.relearned,
                "last_motion_at": self.last_motion_at,
            }


class MotionGateStep(Step):
    name = "motion"
    thread = "prepare"
    gate = True

    def __init__(
        self, config: MotionConfig, motion: PipelineMotion, tracks_alive: Callable[[], bool]
    ) -> None:
        super().__init__()
        self.config = config
        self.motion = motion
        self.tracks_alive = tracks_alive
        self.detector = motion.detector_for(config)

    def run(self, record: FrameRecord) -> bool:
        assert record.pixels is not None, "the gate runs before the model, on the frame's pixels"
        found = self.detector.detect(record.pixels)
        record.motion_areas = found.areas
        self.motion.took(found, record.captured_at)
        now, last = _clock(record), self.motion.last_passed
        # (a clock gone backwards: a file looped, a stream restarted)
        due = last is None or not 0 <= now - last < self.config.keepalive_s
        if found.areas or due or self.motion.on_trial or self.tracks_alive():
            record.frames_gated = self.motion.passed(now)
            return True
        self.motion.gated()
        return False

    def status(self) -> dict[str, Any]:
        # (the gate's own cost a frame, since this stage started: what a static scene costs)
        return {**self.motion.status(), "mean_ms": self.stats.to_dict()["mean_ms"]}


def _clock(record: FrameRecord) -> float:
    """The frame's time for keepalive_s: its position in a file (a recording analysed faster than real
    time keeps its own pace), else when it was decoded."""
    return record.position_s if record.position_s is not None else record.captured_at
