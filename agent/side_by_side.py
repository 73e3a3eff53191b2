"""The previous version beside the new one during a health window: like with like.

A speed is only comparable with a speed measured in the same seconds: a figure recorded minutes ago
on a quiet box says nothing about a new version measured while a neighbour compiles. While the new
stage is on probation the previous one is still loaded (it is kept for the rollback), so the
pipeline's inference thread runs it on one live frame in `SHARE`, right after the new model's own run
on that frame and after the frame went on to its result (results never wait for it). The verdict
compares the medians of these pairs.
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from agent.processing.feed import build_feeder
from agent.stage import Stage

log = logging.getLogger(__name__)

SHARE = 4  # one live frame in this many also runs the previous version: at most 1/SHARE more runs
MIN_PAIRS = 5  # fewer pairs than this tell a slower model from a busy moment no better than chance
_PAIRS_KEPT = 200


@dataclass(frozen=True)
class Comparison:
    """Two medians and how they were measured (said in a verdict's reason)."""

    new_ms: float
    old_ms: float
    how: str

    @property
    def ratio(self) -> float:
        return self.new_ms / self.old_ms if self.old_ms > 0 else float("inf")


class SideBySide:
    """The previous stage run on a share of the same frames (the pipeline's inference thread only)."""

    def __init__(self, previous: Stage, new: Stage, share: int = SHARE) -> None:
        self.previous, self.new = previous, new  # (pairs are made while `new` serves)
        self.share = share
        session = previous.model.session
        # Its own feeder: the previous stage's state (audio context, recurrent links) stays untouched.
        self._feeder = build_feeder(previous.config, session.inputs, session.outputs)
        self._frames = 0
        self._pairs: collections.deque[tuple[float, float]] = collections.deque(maxlen=_PAIRS_KEPT)
        self._lock = threading.Lock()
        self.failed: str | None = None  # why the previous stage cannot run beside the new one

    def wants(self) -> bool:
        """Whether this frame also runs the previous version (one in `share`)."""
        self._frames += 1
        return self.failed is None and self._frames % self.share == 0

    def run(self, pixels: np.ndarray, gap: bool, new_ms: float) -> None:
        """The previous version on the frame the new one just ran on in `new_ms`."""
        try:
            feeds, _ = self._feeder.feeds(pixels, gap)
            t0 = time.perf_counter()
            outputs = self.previous.model.session.run(feeds)
            old_ms = (time.perf_counter() - t0) * 1000
            self._feeder.seen(outputs)
        except Exception as exc:  # freed, another input shape: the verdict falls back, and says so
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("cannot run %s beside the new version: %s", self.previous.ref, self.failed)
            return
        with self._lock:
            self._pairs.append((new_ms, old_ms))

    def restart(self) -> None:
        """Forget the pairs so far (a second measurement after a pause)."""
        with self._lock:
            self._pairs.clear()

    @property
    def pairs(self) -> int:
        with self._lock:
            return len(self._pairs)

    def comparison(self) -> Comparison | None:
        """The medians of the pairs (None: fewer than MIN_PAIRS)."""
        with self._lock:
            pairs = list(self._pairs)
        if len(pairs) < MIN_PAIRS:
            return None
        new = statistics.median(p[0] for p in pairs)
        old = statistics.median(p[1] for p in pairs)
        return Comparison(new, old, f"side by side on {len(pairs)} live frames")


def compare(side: SideBySide | None, stage: Stage, recorded_ms: float | None) -> Comparison | None:
    """The new stage's speed against the previous one's: side by side where it ran beside it, else
    the figure recorded before the swap (saying why). None: nothing to compare (no previous stage,
    one on the same session, or too few frames)."""
    if side is None:
        return None
    comparison = side.comparison()
    if comparison is not None:
        return comparison
    new_ms = stage.stats.median_latency_ms()
    if recorded_ms is None or new_ms is None or len(stage.stats.recent_ms) < MIN_PAIRS:
        return None
    why = f"it could not run beside the new one: {side.failed}" if side.failed else "too few frames beside it"
    return Comparison(
        new_ms, recorded_ms, f"against the previous version's figure recorded before the swap ({why})"
    )
