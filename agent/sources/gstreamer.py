"""GStreamer pipeline strings as camera sources, e.g. a Jetson CSI camera:

    gst:nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM),width=1280,height=720 ! nvvidconv ! appsink

The opencv-python-headless wheel has no GStreamer, so gst-launch-1.0 runs the pipeline and writes
each frame to its standard output as a PPM image (pnmenc): a header that carries the frame's size
(so a pipeline that renegotiates its caps stays readable), then exact RGB pixels. A trailing
`appsink` (as written for OpenCV) is replaced by that ending.
"""

from __future__ import annotations

import re
import shlex
from fractions import Fraction

import cv2
import numpy as np

from agent.config import GST_PREFIX
from agent.errors import EdgeAgentError
from agent.sources.child import ChildStream

PREFIX = GST_PREFIX
_APPSINK_END = re.compile(r"!\s*appsink\b[^!]*$")
_TO_PPM = ["!", "videoconvert", "!", "video/x-raw,format=RGB", "!", "pnmenc", "!", "fdsink", "fd=1"]
_MAX_SIDE = 16384  # larger "frames" mean the stream is not what we asked for
_INSTALL = "apt-get install gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-bad"


def gst_launch_argv(uri: str, fps: float | None = None) -> list[str]:
    """gst-launch-1.0's arguments for the pipeline in `uri`, ending in RGB PPM frames on stdout.

    With `fps`, videorate drops frames inside GStreamer: frames the model would skip anyway are
    never converted and piped (at 1080p that is 6 MB a frame).
    """
    description = _APPSINK_END.sub("", uri.removeprefix(PREFIX).strip()).strip()
    try:
        words = shlex.split(description)  # as a shell would pass it: quotes group, as in gst-launch docs
    except ValueError as exc:
        raise EdgeAgentError(f"GStreamer pipeline {description!r}: {exc}") from None
    while words and words[-1] == "!":
        words.pop()
    if not words:
        raise EdgeAgentError("GStreamer pipeline is empty")
    rate: list[str] = []
    if fps:
        frames = Fraction(fps).limit_denominator(1001)
        rate = [
            "!",
            "videorate",
            "drop-only=true",
            "!",
            f"video/x-raw,framerate={frames.numerator}/{frames.denominator}",
        ]
    return ["gst-launch-1.0", "-q", *words, *rate, *_TO_PPM]


class GstLaunchCapture:
    """Reads frames from a gst-launch-1.0 pipeline like a cv2.VideoCapture (isOpened/read/get/release).

    Opening waits up to `open_timeout` for the first frame (cameras take a moment to start); after
    that a read that waits longer than `read_timeout` fails, so a stalled pipeline is reopened.
    `failure` says why the last open or read failed.
    """

    def __init__(
        self, uri: str, fps: float | None = None, open_timeout: float = 10.0, read_timeout: float = 5.0
    ) -> None:
        self.read_timeout = read_timeout
        self.failure: str | None = None
        self._child: ChildStream | None = None
        self._first: np.ndarray | None = None
        self._grabbed: np.ndarray | None = None
        try:
            self._child = ChildStream(gst_launch_argv(uri, fps), _INSTALL)
        except EdgeAgentError as exc:
            self.failure = str(exc)
            return
        self._first = self._read_frame(open_timeout)

    def isOpened(self) -> bool:  # cv2.VideoCapture's names
        return self._first is not None

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self._first is not None:
            first, self._first = self._first, None
            return True, first
        frame = self._read_frame(self.read_timeout)
        return frame is not None, frame

    def grab(self) -> bool:
        """The next frame (the pipe must be read either way; its videorate already caps fps)."""
        ok, self._grabbed = self.read()
        return ok

    def retrieve(self) -> tuple[bool, np.ndarray | None]:
        frame, self._grabbed = self._grabbed, None
        return frame is not None, frame

    def get(self, prop: int) -> float:
        return 0.0  # a live source: no frame rate or length to report

    def release(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def _read_frame(self, timeout: float) -> np.ndarray | None:
        child = self._child
        if child is None:
            return None
        header = []
        for _ in range(4):  # P6 width height maxval
            token = child.read_token(timeout)
            if token is None:
                self.failure = f"gst-launch-1.0 {child.failure}"
                return None
            header.append(token)
        magic, width, height, maxval = header
        if magic != b"P6" or not (width.isdigit() and height.isdigit()) or maxval != b"255":
            self.failure = f"gst-launch-1.0 sent something other than RGB frames: {b' '.join(header)[:40]!r}"
            return None
        w, h = int(width), int(height)
        if not (0 < w <= _MAX_SIDE and 0 < h <= _MAX_SIDE):
            self.failure = f"gst-launch-1.0 sent a {w}x{h} frame"
            return None
        pixels = child.read_exact(w * h * 3, timeout)
        if pixels is None:
            self.failure = f"gst-launch-1.0 {child.failure}"
            return None
        rgb = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)  # BGR, as OpenCV decodes every other source
