"""Frames and their hand-over from a source thread to the model thread: newest-only for cameras
(a slow model skips frames), first-in-first-out within a bound for sensors and audio (nothing is
skipped until the bound; overflow is counted)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Frame:
    data: np.ndarray  # cameras: BGR uint8, as OpenCV decodes it; audio: float32 samples in [-1, 1]
    index: int  # frame (window) number since the source started (counts dropped ones too)
    captured_at: float  # wall clock (time.time()) when the frame was decoded
    position_s: float | None = None  # position in a file, when the source is a file
    gap: bool = False  # the stream restarted before this one (reopened, looped): state is stale


class _HandOver:
    """What both hand-overs share: the condition the reader waits on, closing, the drop count."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self.dropped = 0

    def close(self) -> None:
        """Wake the reader; `get` returns what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class LatestFrameSlot(_HandOver):
    """Holds at most one frame: a new frame replaces an unread one, which counts as dropped.

    A slow model therefore never builds a backlog: it always gets the newest frame.
    """

    def __init__(self) -> None:
        super().__init__()
        self._frame: Frame | None = None

    def put(self, frame: Frame) -> None:
        with self._cond:
            if self._frame is not None:
                self.dropped += 1
            self._frame = frame
            self._cond.notify_all()  # the reader, and a peek waiting for a sample

    def get(self, timeout: float) -> Frame | None:
        """The newest unread frame, or None after `timeout` or once closed and empty."""
        with self._cond:
            if self._frame is None and not self._closed:
                self._cond.wait(timeout)
            frame, self._frame = self._frame, None
            if frame is not None:
                self._cond.notify_all()  # a source pacing itself by the model (wait_taken)
            return frame

    def wait_taken(self, timeout: float) -> bool:
        """Wait until the frame put last has been taken (or the slot closed); False after `timeout`."""
        with self._cond:
            return self._cond.wait_for(lambda: self._frame is None or self._closed, timeout)

    def __len__(self) -> int:
        with self._cond:
            return 0 if self._frame is None else 1

    def peek(self, timeout: float) -> Frame | None:
        """The newest frame without taking it (it is still served): a sample for choosing a backend."""
        with self._cond:
            self._cond.wait_for(lambda: self._frame is not None or self._closed, timeout)
            return self._frame


class FrameQueue(_HandOver):
    """First in, first out, at most `limit` frames: a source faster than the model loses nothing
    until the bound; beyond it the oldest frame is dropped and counted. Same interface as
    LatestFrameSlot."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._frames: collections.deque[Frame] = collections.deque()
        self._limit = limit

    def put(self, frame: Frame) -> None:
        with self._cond:
            if len(self._frames) >= self._limit:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            self._cond.notify()

    def get(self, timeout: float) -> Frame | None:
        """The oldest unread frame, or None after `timeout` or once closed and empty."""
        with self._cond:
            if not self._frames and not self._closed:
                self._cond.wait(timeout)
            return self._frames.popleft() if self._frames else None

    def __len__(self) -> int:
        with self._cond:
            return len(self._frames)

    def peek(self, timeout: float) -> Frame | None:
        """The oldest frame without taking it: a sample for choosing a backend costs no window."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._frames) or self._closed, timeout)
            return self._frames[0] if self._frames else None


class Windower:
    """Cuts a stream of values into windows of `window` values every `hop` values, into `queue`.

    Not thread-safe: one feeding thread, or the caller's lock.
    """

    def __init__(self, queue: FrameQueue, window: int, hop: int) -> None:
        self.queue, self.window, self.hop = queue, window, hop
        self._values = np.zeros(0, np.float32)
        self._skip = 0  # values still to pass over when hop > window
        self.index = 0  # windows made so far
        self.gap = True  # the next window starts a new stretch of the stream

    def add(
        self, values: Sequence[float] | np.ndarray, captured_at: float, position_s: float | None = None
    ) -> None:
        """Append values; hand every window that fills up to the queue."""
        incoming = np.asarray(values, dtype=np.float32).reshape(-1)
        if self._skip:
            dropped = min(self._skip, len(incoming))
            incoming, self._skip = incoming[dropped:], self._skip - dropped
        self._values = np.concatenate([self._values, incoming])
        while len(self._values) >= self.window:
            self.index += 1
            data = self._values[: self.window].copy()
            self.queue.put(
                Frame(
                    data=data, index=self.index, captured_at=captured_at, position_s=position_s, gap=self.gap
                )
            )
            self.gap = False
            self._skip = max(0, self.hop - len(self._values))
            self._values = self._values[self.hop :]

    def restart(self) -> None:
        """The stream broke off: drop the partial window; the next one starts a new stretch."""
        self._values, self._skip, self.gap = np.zeros(0, np.float32), 0, True
