"""The previous version beside the new one during a health window: like with like.

A speed is only comparable with a speed measured in the same seconds: a figure recorded minutes ago
on a quiet box says nothing about a new version measured while a neighbour compiles. While the new
stage is on probation the previous one is still loaded (it is kept for the rollback), so on one live
frame in `SHARE` the pipeline's inference thread runs both versions on it, after the frame went on to
its result (results never wait for them): each version RUNS_EACH times in a row, the order alternating
from one frame to the next (old old old new new new, then new new new old old old). The verdict goes by
each version's fastest run in the window: new fastest / old fastest.

Why the fastest: whatever else the box does can only add to a run's time, never take from it, and it
adds about the same milliseconds to a short run as to a long one, so it moves the ratio of two
typical runs towards 1 (a 0.7 ms model waits as long for a core another process holds as a 4 ms one).
Three processes sharing two idle cores, each running a model 4-7x slower alone (3.6 ms against
0.5-0.9) beside the previous one, read it 1.6-6.2x by the median of per-frame ratios over 15-frame
windows (10 windows in 60 under 3x), 2.7-7.8x by the fastest runs (median 6.1x, 1 in 60 under 3x);
with every core busy 5.1-6.9x by the fastest runs, and the same model against itself 0.7-1.3x.
The fastest of three runs in a row on each frame: a run straight after another run of the same model
finds the runtime's worker threads awake and its own weights in the caches (the first run after the
other version's, or after the wait for a frame, read up to 3x slower on its own).

Where both runtimes keep a timer of their own (OpenVINO's, `Session.compute_ms`) the pairs are its
figures: the wall time from Python adds what is not the model's (the call, the output copies, the
wait for the GIL after the runtime returns while another of the daemon's threads runs Python), the
same for both versions, and added to both it made a ~6x slower model read 2-3x on an idle box (once
in ten runs of tests/test_fleet_speed_judgement.py).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from agent.processing.feed import build_feeder
from agent.stage import Stage

log = logging.getLogger(__name__)

SHARE = 10  # one live frame in this many runs both versions: at most 6/SHARE more runs (60 %)
RUNS_EACH = 3  # runs of each version in a row on that frame (see the module's docstring)
MIN_PAIRS = 5  # fewer pairs than this tell a slower model from a busy moment no better than chance
_PAIRS_KEPT = 200


@dataclass(frozen=True)
class Comparison:
    """Two speeds, their ratio (the verdict goes by it), and how they were measured (said in its
    reason): side by side the fastest runs, against a recorded figure the new version's median."""

    new_ms: float
    old_ms: float
    how: str
    statistic: str = "median"  # which of the new version's times `new_ms` is

    @property
    def ratio(self) -> float:
        return self.new_ms / self.old_ms if self.old_ms > 0 else float("inf")


class SideBySide:
    """The previous stage run on a share of the same frames (the pipeline's inference thread only)."""

    def __init__(self, previous: Stage, new: Stage, share: int = SHARE) -> None:
        self.previous, self.new = previous, new  # (pairs are made while `new` serves)
        self.share = share
        # Feeders of their own: the stages' state (audio context, recurrent links) stays untouched.
        self._feeders = {
            stage: build_feeder(stage.config, stage.model.session.inputs, stage.model.session.outputs)
            for stage in (previous, new)
        }
        self._frames = 0
        self._pairs: collections.deque[tuple[float, float]] = collections.deque(maxlen=_PAIRS_KEPT)
        self._made = 0  # pairs made so far (the deque keeps the last _PAIRS_KEPT)
        self._lock = threading.Lock()
        self.failed: str | None = None  # why the previous stage cannot run beside the new one
        self._own_timer = False  # the pairs are the runtimes' own timings (see `run`)

    def wants(self) -> bool:
        """Whether this frame runs both versions again (one in `share`)."""
        self._frames += 1
        return self.failed is None and self._frames % self.share == 0

    def run(self, pixels: np.ndarray, gap: bool) -> None:
        """Both versions on the frame the new one just served, each RUNS_EACH times in a row (the
        order alternates from one frame to the next): the fastest run of each is kept."""
        order = (self.previous, self.new) if self._frames // self.share % 2 else (self.new, self.previous)
        took: dict[Stage, tuple[float, float | None]] = {}  # (wall ms, the runtime's own ms or None)
        for stage in order:
            try:
                took[stage] = min(
                    (self._time(stage, pixels, gap) for _ in range(RUNS_EACH)),
                    key=lambda timed: timed[1] if timed[1] is not None else timed[0],
                )
            except Exception as exc:  # freed, another input shape: the verdict falls back, and says so
                if stage is self.new:  # (its own runs count its failures)
                    log.debug("%s failed beside the previous version: %s", stage.ref, exc)
                    return
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("cannot run %s beside the new version: %s", self.previous.ref, self.failed)
                return
        (new_wall, new_own), (old_wall, old_own) = took[self.new], took[self.previous]
        pair = (new_own, old_own) if new_own is not None and old_own is not None else (new_wall, old_wall)
        with self._lock:
            self._pairs.append(pair)
            self._made += 1
            self._own_timer = new_own is not None and old_own is not None

    def _time(self, stage: Stage, pixels: np.ndarray, gap: bool) -> tuple[float, float | None]:
        """One run of `stage`'s model on the frame: (wall ms, the runtime's own timer's ms or None)."""
        feeder = self._feeders[stage]
        feeds, _ = feeder.feeds(pixels, gap)
        session = stage.model.session
        t0 = time.perf_counter()
        outputs = session.run(feeds)
        took = (time.perf_counter() - t0) * 1000
        feeder.seen(outputs)
        return took, session.compute_ms

    @property
    def made(self) -> int:
        """Pairs made so far, all of them (`pairs`: those kept)."""
        with self._lock:
            return self._made

    @property
    def pairs(self) -> int:
        with self._lock:
            return len(self._pairs)

    def comparison(self) -> Comparison | None:
        """Each version's fastest run over the pairs so far (None: fewer than MIN_PAIRS)."""
        with self._lock:
            pairs = list(self._pairs)
        if len(pairs) < MIN_PAIRS:
            return None
        new, old = min(p[0] for p in pairs), min(p[1] for p in pairs)
        timer = ", the runtime's own timer" if self._own_timer else ""
        return Comparison(new, old, f"side by side on {len(pairs)} live frames{timer}", "fastest")


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
