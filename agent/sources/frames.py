"""Frames and the newest-frame hand-over between a decoder thread and a model thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Frame:
    image: np.ndarray  # BGR uint8, as OpenCV decodes it
    index: int  # frame number since the source started (counts dropped frames too)
    captured_at: float  # wall clock (time.time()) when the frame was decoded
    position_s: float | None = None  # position in a video file, when the source is a file


class LatestFrameSlot:
    """Holds at most one frame: a new frame replaces an unread one, which counts as dropped.

    A slow model therefore never builds a backlog: it always gets the newest frame.
    """

    def __init__(self) -> None:
        self._frame: Frame | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.dropped = 0

    def put(self, frame: Frame) -> None:
        with self._cond:
            if self._frame is not None:
                self.dropped += 1
            self._frame = frame
            self._cond.notify()

    def get(self, timeout: float) -> Frame | None:
        """The newest unread frame, or None after `timeout` or once closed and empty."""
        with self._cond:
            if self._frame is None and not self._closed:
                self._cond.wait(timeout)
            frame, self._frame = self._frame, None
            return frame

    def close(self) -> None:
        """Wake the reader; `get` returns what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
