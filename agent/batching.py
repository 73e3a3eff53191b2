"""Frames of several streams that share one session run as one batch, when that proves faster.

Leader and followers: a caller that finds the session idle runs at once (it never waits for company,
so a lone camera gets no added latency); callers that arrive while the session is busy queue, and
when it is free the first of them leads the whole queue (up to `max_batch` frames whose shapes
match) as one run. A model can batch only when every input and output has a dynamic first
dimension. Whether it is worth it is measured on the live traffic, not assumed:

1. The first batch runs one by one (the results callers get) and together: the outputs must agree.
2. Then phases of PHASE_FRAMES frames alternate between together and one by one (exactly as with
   batching off), TRIAL_PHASES of each, timed by the wall clock per frame: the runs and the
   hand-overs between them (the first batch of each size together is not timed: a runtime plans
   memory for a new shape once).
   Real traffic matters: batches come in varying sizes, and some runtimes pay for every change of
   shape (OpenVINO's CPU plugin: 1.8x faster on a fixed batch of 4 frames, 0.86x on batches of 2-4
   mixed, on this machine); and batching also saves hand-overs between camera threads, which
   timing the runs alone would miss.
3. Batching stays on only if together was at least MIN_SPEEDUP times faster per frame.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from providers import Session, TensorSpec
from providers.select import SelectionPolicy, compare_outputs

log = logging.getLogger(__name__)

PHASE_FRAMES = 24  # frames per timed phase
TRIAL_PHASES = 2  # phases each way, alternating
MIN_SPEEDUP = 1.15  # together must beat one-by-one by this much per frame
Outputs = dict[str, np.ndarray]


@dataclass(eq=False)  # compared by identity: the queue holds each request once
class _Request:
    feeds: Mapping[str, np.ndarray]
    result: Outputs | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def frames(self) -> int:
        return int(next(iter(self.feeds.values())).shape[0])

    @property
    def signature(self) -> tuple[Any, ...]:
        """What must match for requests to be stacked: names, dtypes, and shapes past the first axis."""
        return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in self.feeds.items()))


def _first_axis_dynamic(specs: list[TensorSpec]) -> bool:
    return bool(specs) and all(spec.shape and spec.fixed_dim(0) is None for spec in specs)


def runs_batches(session: Session) -> bool:
    """Whether `session` runs several inputs at once: every input and output has a dynamic first axis
    (every backend here resizes such a dimension to the inputs fed)."""
    return _first_axis_dynamic(session.inputs) and _first_axis_dynamic(session.outputs)


@dataclass
class _Phase:
    way: str  # together | one_by_one
    started: float  # time.perf_counter() at its first batch
    frames: int = 0
    untimed: float = 0.0  # seconds of first runs at a new batch size, left out


def _untimed() -> dict[str, list[float]]:
    return {"together": [0, 0, 0.0], "one_by_one": [0, 0, 0.0]}


@dataclass
class BatchStats:
    state: str  # trial | on | off
    reason: str
    speedup: float | None = None  # one-by-one time per frame / together time per frame, once measured
    verified: bool = False  # a batch gave the same outputs together as one by one
    # per way of running (together, one_by_one): [phases, frames, seconds] timed in the trial
    timed: dict[str, list[float]] = field(default_factory=_untimed)
    batched_runs: int = 0
    frames_in_batches: int = 0
    largest_batch: int = 1


class BatchRunner:
    """Runs a session for several callers, in turn or batched (see the module's docstring)."""

    def __init__(
        self,
        session: Session,
        mode: Literal["auto", "off"] = "auto",
        max_batch: int = 8,
        policy: SelectionPolicy | None = None,
    ) -> None:
        self.session = session
        self.max_batch = max_batch
        self.policy = policy or SelectionPolicy()
        if mode == "off":
            self.stats = BatchStats("off", "batching is off in the config")
        elif not runs_batches(session):
            self.stats = BatchStats("off", "not every input and output of the model has a dynamic batch axis")
        else:
            trial = 2 * TRIAL_PHASES * PHASE_FRAMES
            self.stats = BatchStats("trial", f"measuring on the first {trial} frames or so")
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._busy = False
        self._seen_sizes: set[int] = set()  # batch sizes run together at least once
        self._phase: _Phase | None = None  # the trial's timed phase under way

    def run(self, feeds: Mapping[str, np.ndarray]) -> Outputs:
        request = _Request(feeds)
        with self._cond:
            self._queue.append(request)
            while self._busy and not request.done:
                self._cond.wait()
            leading = not request.done
            if leading:
                batch = self._take(request)
                self._busy = True
        if leading:
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            stats = self.stats
            return {
                "state": stats.state,
                "reason": stats.reason,
                "speedup": None if stats.speedup is None else round(stats.speedup, 2),
                "batched_runs": stats.batched_runs,
                "frames_in_batches": stats.frames_in_batches,
                "largest_batch": stats.largest_batch,
            }

    # --- the leader's side ---------------------------------------------------------------------

    def _take(self, leader: _Request) -> list[_Request]:
        """The leader's request and, when batching (or trying it), the queued ones that stack with it.

        Called holding the lock. A trial's one-by-one phase takes the leader alone, exactly as
        batching off does, so that the hand-overs it pays are the ones off would pay.
        """
        self._queue.remove(leader)
        batch, frames = [leader], leader.frames
        state = self.stats.state
        if state == "trial" and self.stats.verified and self._phase is None:
            timed = self.stats.timed
            way = "together" if timed["together"][0] <= timed["one_by_one"][0] else "one_by_one"
            self._phase = _Phase(way, time.perf_counter())
        stacking = state == "on" or (
            state == "trial" and (self._phase is None or self._phase.way == "together")
        )
        if stacking:
            signature = leader.signature
            for other in list(self._queue):
                if other.signature == signature and frames + other.frames <= self.max_batch:
                    self._queue.remove(other)
                    batch.append(other)
                    frames += other.frames
        return batch

    def _run(self, batch: list[_Request]) -> None:
        try:
            if self.stats.state == "trial" and (self._phase is not None or len(batch) > 1):
                self._trial(batch)
            elif len(batch) == 1 or self.stats.state == "off":
                self._one_by_one(batch)
            else:
                self._together(batch)
        except Exception as exc:  # a fault here must not leave the followers without an answer
            log.exception("batch runner failed")
            for request in batch:
                if request.result is None and request.error is None:
                    request.error = exc
        finally:
            for request in batch:
                request.done = True

    def _one_by_one(self, batch: list[_Request]) -> None:
        for request in batch:
            try:
                request.result = self.session.run(request.feeds)
            except Exception as exc:  # each caller gets its own failure, as without batching
                request.error = exc

    def _together(self, batch: list[_Request]) -> None:
        if len(batch) == 1:  # nobody to stack with
            self._one_by_one(batch)
            return
        try:
            outputs = self._run_stacked(batch)
        except Exception as exc:  # run them one by one: a failure is then the failing caller's
            log.warning("batched run of %d frames failed (%s); running them one by one", len(batch), exc)
            self._one_by_one(batch)
            return
        for request, result in zip(batch, outputs, strict=True):
            request.result = result
        frames = sum(r.frames for r in batch)
        with self._cond:
            self.stats.batched_runs += 1
            self.stats.frames_in_batches += frames
            self.stats.largest_batch = max(self.stats.largest_batch, frames)

    def _run_stacked(self, batch: list[_Request]) -> list[Outputs]:
        names = list(batch[0].feeds)
        stacked = {name: np.concatenate([r.feeds[name] for r in batch]) for name in names}
        total = sum(r.frames for r in batch)
        outputs = self.session.run(stacked)
        for name, value in outputs.items():
            if value.shape[:1] != (total,):
                raise ValueError(f"output {name!r} has shape {list(value.shape)} for a batch of {total}")
        bounds = np.cumsum([r.frames for r in batch])[:-1]
        parts = {name: np.split(value, bounds) for name, value in outputs.items()}
        return [{name: parts[name][i] for name in outputs} for i in range(len(batch))]

    def _trial(self, batch: list[_Request]) -> None:
        """Verify once (both ways, outputs compared), then alternate the two ways, timed; decide."""
        frames = sum(r.frames for r in batch)
        if not self.stats.verified:
            self._one_by_one(batch)
            if any(r.error is not None for r in batch):
                return  # nothing to compare against; the next batch verifies
            try:
                together = self._run_stacked(batch)
            except Exception as exc:
                self._decide("off", f"a batch of {frames} frames did not run: {exc}")
                return
            for request, outputs in zip(batch, together, strict=True):
                assert request.result is not None
                _diff, problem = compare_outputs(outputs, request.result, self.policy)
                if problem:
                    self._decide("off", f"a batch of {frames} gives other outputs than one by one: {problem}")
                    return
            with self._cond:
                self.stats.verified = True
            return
        phase = self._phase
        if phase is None:  # verified, between phases: _take starts the next one
            self._one_by_one(batch)
            return
        if phase.way == "together" and frames > 1 and frames not in self._seen_sizes:
            # A runtime's first run at a new shape plans memory (onnxruntime): not what it costs after.
            self._seen_sizes.add(frames)
            started = time.perf_counter()
            self._together(batch)
            phase.untimed += time.perf_counter() - started
            return
        if phase.way == "together":
            self._together(batch)
        else:
            self._one_by_one(batch)
        phase.frames += frames
        if phase.frames < PHASE_FRAMES:
            return
        # Wall time of the whole phase: the runs and the hand-overs between them (cameras waking,
        # resubmitting), which batching saves too.
        elapsed = time.perf_counter() - phase.started - phase.untimed
        timed = self.stats.timed
        with self._cond:
            self._phase = None
            tally = timed[phase.way]
            tally[0], tally[1], tally[2] = tally[0] + 1, tally[1] + phase.frames, tally[2] + elapsed
            done = min(timed["together"][0], timed["one_by_one"][0]) >= TRIAL_PHASES
        if done:
            per_frame = {w: seconds / count for w, (_p, count, seconds) in timed.items()}
            speedup = per_frame["one_by_one"] / max(per_frame["together"], 1e-12)
            with self._cond:
                self.stats.speedup = speedup
            if speedup >= MIN_SPEEDUP:
                self._decide(
                    "on", f"batches of up to {self.max_batch} frames were {speedup:.2f}x faster per frame"
                )
            else:
                self._decide(
                    "off", f"batching was not faster ({speedup:.2f}x per frame, needs {MIN_SPEEDUP}x)"
                )

    def _decide(self, state: str, reason: str) -> None:
        with self._cond:
            self.stats.state, self.stats.reason = state, reason
        log.info("session %s: batching %s: %s", self.session.backend, state, reason)

    def measure_again(self) -> None:
        """Traffic changed (another pipeline joined): a speed decision is measured afresh. A model
        that cannot batch, or gave other outputs batched, stays off."""
        with self._cond:
            stats = self.stats  # the counters carry on; the trial's measurements start again
            if stats.verified and stats.state in ("on", "off") and stats.speedup is not None:
                stats.state, stats.reason = "trial", "measuring again: another pipeline joined"
                stats.speedup, stats.timed = None, _untimed()
                self._phase = None
