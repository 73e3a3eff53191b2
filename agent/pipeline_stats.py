"""A pipeline's counters, in one object: results, inferences, failed frames and the last error, the
live rate and latency percentiles. The pipeline's threads count into it; `status` reads it.

The last error is cleared once the pipeline has run a health window's length cleanly since it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from agent.clock import iso_utc
from agent.config import HealthWindowConfig
from agent.logfmt import first_or_every
from agent.stage import Stage
from agent.status import Counts, LastError, Latency, Percentiles, Rates

log = logging.getLogger(__name__)

# How many failed frames in a row before the pipeline reports itself degraded.
DEGRADED_AFTER_ERRORS = 10
_RECENT_FRAMES = 512  # inferences kept for the live rate and latency percentiles
_RATE_WINDOW_S = 10.0  # the live rate is over the last this many seconds


@dataclass(frozen=True)
class Failure:
    """The last failed frame: what went wrong, when (wall clock), through which model."""

    text: str
    at: float
    model: str

    def reported(self) -> LastError:
        return LastError(self.text, iso_utc(self.at), self.model)


class PipelineStats:
    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()
        self.results = 0  # published (handed to the sink)
        self.inferences = 0  # frames the model ran on, published or held back by the report rules
        self.errors = 0
        self.errors_in_row = 0
        self.last_error: Failure | None = None
        self._last_error_mono = 0.0  # to tell a clean run since
        self._inferences_at_error = 0
        self._latency_sum_ms = 0.0
        # The last inferences: (when done, monotonic; inference ms; capture to result ms).
        self._recent: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=_RECENT_FRAMES)

    def ran(self, stage: Stage, inference_ms: float) -> None:
        """The model ran on a frame (inference thread): the stage's latencies (the health window's)."""
        with self._lock:
            stage.stats.latency_sum_ms += inference_ms
            stage.stats.recent_ms.append(inference_ms)

    def done(self, inference_ms: float, captured_at: float, failed: bool, published: bool) -> None:
        """The report thread is done with a frame whose output was made (published, held back, or
        failed after its output: tracking, the outbox)."""
        with self._lock:
            self._recent.append((time.monotonic(), inference_ms, (time.time() - captured_at) * 1000))
            self.inferences += 1
            self._latency_sum_ms += inference_ms
            self.results += published
            if not failed:
                self.errors_in_row = 0

    def failed(self, frame: int, what: str, stage: Stage) -> None:
        """Count a failed frame (against the stage it went through) and log the first failure and
        every 100th (not a line per frame). `what`: `<step> failed: <error>`."""
        with self._lock:
            self.errors += 1
            self.errors_in_row += 1
            self.last_error = Failure(what, time.time(), stage.ref)
            self._last_error_mono = time.monotonic()
            self._inferences_at_error = self.inferences
            errors = self.errors
            stage.stats.errors += 1
            stage.stats.last_error = what
            stage.stats.last_error_at = self.last_error.at
        if first_or_every(errors):
            log.error(
                "pipeline %s: frame %d: %s (%d failed frames so far)", self.pipeline, frame, what, errors
            )

    def read(self, health: HealthWindowConfig) -> Counts:
        """The counters for the status, the last error forgotten once a clean run as long as `health`
        followed it (window_s without a failed frame and min_frames good ones since). A pipeline that
        gets no frames keeps it: nothing proved the problem gone."""
        with self._lock:
            error = self.last_error
            if error is not None:
                clean_s = time.monotonic() - self._last_error_mono
                good_since = self.inferences - self._inferences_at_error
                if clean_s >= health.window_s and good_since >= health.min_frames:
                    log.info(
                        "pipeline %s: clean for %.0f s since its last error (%s); cleared",
                        self.pipeline,
                        clean_s,
                        error.text,
                    )
                    self.last_error = error = None
            inferences = self.inferences
            mean = self._latency_sum_ms / inferences if inferences else None
            recent = list(self._recent)
            results, degraded, errors = self.results, self.errors_in_row >= DEGRADED_AFTER_ERRORS, self.errors
        rates = live_rates(recent, time.monotonic())
        return Counts(
            results=results,
            inferences=inferences,
            degraded=degraded,
            errors=errors,
            last_error=None if error is None else error.reported(),
            mean_inference_ms=round(mean, 3) if mean is not None else None,
            fps=rates.fps,
            latency=rates.latency,
        )


def live_rates(recent: list[tuple[float, float, float]], now: float) -> Rates:
    """`fps` over the last _RATE_WINDOW_S and latency percentiles over the last inferences (at most
    _RECENT_FRAMES): what `edge-agent status` shows. None where there is nothing to measure yet."""
    in_window = [r for r in recent if now - r[0] <= _RATE_WINDOW_S]
    fps: float | None = None
    if in_window:
        # Over the whole window, unless every frame we know of is in it (a start, a fast
        # pipeline filling the record): then over the time they cover.
        covered = _RATE_WINDOW_S if len(in_window) < len(recent) else now - recent[0][0]
        fps = round(len(in_window) / max(covered, 1.0), 2)  # (one frame alone: not 1000 fps)
    elif recent:
        fps = 0.0  # frames once, none lately

    def percentiles(values: list[float]) -> Percentiles | None:
        if not values:
            return None
        p50, p95 = np.percentile(values, [50, 95])
        return Percentiles(round(float(p50), 3), round(float(p95), 3))

    return Rates(fps, Latency(percentiles([r[1] for r in recent]), percentiles([r[2] for r in recent])))
