"""A pipeline's stages over time: the one its frames walk now, the one kept warm for a rollback, and
the one waiting to be swapped in. Any thread asks for a swap (`swap_in`, `roll_back`); only the
pipeline's inference thread swaps (`take_pending`), between two frames, and waits nobody.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.stage import Stage, StageStats
from agent.steps import Plan

log = logging.getLogger(__name__)


class StageSwap:
    def __init__(self, pipeline: str, first: Plan, plan_of: Callable[[Stage], Plan]) -> None:
        """`plan_of`: the steps a stage's frames walk in this pipeline."""
        self.pipeline = pipeline
        self.plan = first  # what frames walk now (read by every thread, written by the swapper)
        self.previous: Stage | None = None  # the last good stage, warm until commit or roll_back
        self.swaps = 0
        self._plan_of = plan_of
        self._pending: Stage | None = None
        self._changed = threading.Condition()
        self._open = False  # the inference thread runs: swaps are taken

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def open(self, is_open: bool) -> None:
        """Whether a swap can be taken (the inference thread runs); closing wakes those waiting."""
        with self._changed:
            self._open = is_open
            self._changed.notify_all()

    def swap_in(self, stage: Stage, timeout: float) -> bool:
        """Make `stage` the one frames go through, between two frames; the current one is kept (warm)
        as `previous` until `commit` or `roll_back`. False if the worker did not swap in time
        (stopped, or stuck in a frame): then nothing changed."""
        with self._changed:
            if not self._open:
                return False
            self._pending = stage
            self._changed.wait_for(lambda: self._pending is None or not self._open, timeout)
            if self._pending is stage:  # not taken in time: withdraw it
                self._pending = None
            return self.plan.stage is stage

    def commit(self) -> None:
        """The new stage proved itself: close the previous one."""
        previous, self.previous = self.previous, None
        if previous is not None and previous is not self.plan.stage:
            previous.close()

    def roll_back(self, timeout: float) -> bool:
        """Swap the previous stage back in and close the failed one; False when there is none or the
        worker did not swap in time."""
        previous, failed = self.previous, self.plan.stage
        if previous is None or not self.swap_in(previous, timeout):
            return False
        self.previous = None
        failed.close()
        return True

    def take_pending(self) -> None:
        """The inference thread, between two frames: swap in the stage asked for, if any."""
        with self._changed:
            stage = self._pending
            if stage is None:
                return
            old = self.plan.stage
            unproven = None
            if stage is self.previous:
                pass  # a roll_back: it closes the failed one itself
            elif self.previous is not None:
                unproven = old  # never committed: the last good stays the one to go back to
            else:
                self.previous = old
            self.plan = self._plan_of(stage)
            self._pending = None
            stage.stats = StageStats()
            self.swaps += 1
            self._changed.notify_all()
        if unproven is not None:
            unproven.close()
        log.info(
            "pipeline %s: now on %s on %s, was %s",
            self.pipeline,
            stage.chain,
            stage.running_on()[0],
            old.chain,
        )
