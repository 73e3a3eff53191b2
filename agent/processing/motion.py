"""Motion on a small grey frame (agent/config/motion.py MotionConfig): where a camera frame moved.

Frigate's recipe: downscale to `frame_height` rows and grey, blur, compare with the background (a
running average, or OpenCV's MOG2), threshold, drop the masked pixels, dilate, keep the contours of at
least `min_area`. A change over most of the frame at once is a brightness jump (lights, IR switch,
lightning), not motion: the background is learnt again from this frame. Everything is done on the
small frame (well under a millisecond for a 720p frame: docs/performance.md); the areas come back in
the source frame's pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from agent.config.motion import MotionConfig

Area = tuple[int, int, int, int]  # x1, y1, x2, y2 in the source frame's pixels
_KERNEL = np.ones((3, 3), np.uint8)


@dataclass(frozen=True)
class Motion:
    """One frame's motion: the moving areas (empty: none) and whether the background was learnt again."""

    areas: list[Area]
    relearned: bool = False
    changed: float = 0.0  # the fraction of the (unmasked) small frame whose pixels changed


class MotionDetector:
    """The background of one camera; `detect` each frame in order (one thread)."""

    def __init__(self, config: MotionConfig) -> None:
        self.config = config
        self._size: tuple[int, int] | None = None  # the source frame's (width, height)
        self._small: tuple[int, int] = (0, 0)  # the small frame's (width, height)
        self._keep: np.ndarray | None = None  # 255 where motion counts (unmasked), on the small frame
        self._kept = 0  # unmasked pixels
        self._min_area = 0.0  # in small-frame pixels
        self._average: np.ndarray | None = None  # float32 running average (method average)
        self._mog2: cv2.BackgroundSubtractorMOG2 | None = None

    def detect(self, frame: np.ndarray) -> Motion:
        """The motion in `frame` (BGR or grey) against the background, which then learns the frame.
        The first frame (or the first of a new size) has none: it is the background."""
        height, width = frame.shape[:2]
        if self._size != (width, height):
            self._start(width, height)
        small = self._shrink(frame)
        if self._average is None and self._mog2 is None:
            self._relearn(small)
            return Motion([])
        moving = self._moving(small)
        if self._keep is not None:
            moving = cv2.bitwise_and(moving, self._keep)
        changed = cv2.countNonZero(moving) / self._kept if self._kept else 0.0
        if changed > self.config.relearn_above:
            self._relearn(small)
            return Motion([], relearned=True, changed=changed)
        if changed == 0.0:
            return Motion([], changed=0.0)
        return Motion(self._areas(moving), changed=changed)

    def _start(self, width: int, height: int) -> None:
        config = self.config
        rows = min(config.frame_height, height)
        cols = max(1, round(width * rows / height))
        self._size, self._small = (width, height), (cols, rows)
        self._average, self._mog2 = None, None
        min_area = config.min_area if config.units == "fraction" else config.min_area / (width * height)
        self._min_area = min_area * cols * rows
        self._keep, self._kept = None, cols * rows
        if config.masks:
            keep = np.full((rows, cols), 255, np.uint8)
            for mask in config.masks:
                scale = (cols, rows) if mask.units == "fraction" else (cols / width, rows / height)
                points = np.round(np.array(mask.points, np.float64) * scale).astype(np.int32)
                cv2.fillPoly(keep, [points], 0)
            self._keep, self._kept = keep, cv2.countNonZero(keep)

    def _shrink(self, frame: np.ndarray) -> np.ndarray:
        # Resize first: the grey conversion and the blur then touch ~1/40 of a 720p frame's pixels.
        # Bilinear, as Frigate: INTER_AREA averages away more noise but costs 40x (2.5 ms at 720p).
        small = cv2.resize(frame, self._small, interpolation=cv2.INTER_LINEAR)
        if small.ndim == 3:
            small = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        return cv2.GaussianBlur(small, (3, 3), 0)

    def _relearn(self, small: np.ndarray) -> None:
        if self.config.method == "mog2":
            self._mog2 = cv2.createBackgroundSubtractorMOG2(
                history=max(2, round(1 / self.config.learning_rate)),
                varThreshold=float(self.config.threshold),
                detectShadows=False,
            )
            self._mog2.apply(small, learningRate=1.0)
        else:
            self._average = small.astype(np.float32)

    def _moving(self, small: np.ndarray) -> np.ndarray:
        """255 where `small` differs from the background; the background then takes it in."""
        rate = self.config.learning_rate
        if self._mog2 is not None:
            return self._mog2.apply(small, learningRate=rate)
        assert self._average is not None
        diff = cv2.absdiff(small, cv2.convertScaleAbs(self._average))
        cv2.accumulateWeighted(small, self._average, rate)
        return cv2.threshold(diff, self.config.threshold, 255, cv2.THRESH_BINARY)[1]

    def _areas(self, moving: np.ndarray) -> list[Area]:
        if self.config.dilation:
            moving = cv2.dilate(moving, _KERNEL, iterations=self.config.dilation)
        contours, _ = cv2.findContours(moving, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        assert self._size is not None
        sx, sy = self._size[0] / self._small[0], self._size[1] / self._small[1]
        areas: list[Area] = []
        for contour in contours:
            if cv2.contourArea(contour) < self._min_area:
                continue
            x, y, w, h = cv2.boundingRect(contour)
            areas.append(
                (
                    int(x * sx),
                    int(y * sy),
                    min(self._size[0], round((x + w) * sx)),
                    min(self._size[1], round((y + h) * sy)),
                )
            )
        return areas
