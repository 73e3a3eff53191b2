"""Video through OpenCV: files, image folders, V4L2 devices, RTSP and HTTP (MJPEG) streams; and
GStreamer pipeline strings through gst-launch-1.0 (agent/sources/gstreamer.py).

One decoder thread per source hands frames to a LatestFrameSlot. A source that cannot be
opened, or that stops delivering, is reopened with capped exponential backoff; the daemon
never stalls on one dead camera.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import cv2

from agent.config import MAX_FPS, VideoSourceConfig, is_gst_pipeline
from agent.retry import backoff_delay
from agent.sources.base import ThreadedSource
from agent.sources.frames import Frame, LatestFrameSlot
from agent.sources.gstreamer import GstLaunchCapture
from agent.sources.uri import URL, hide_password, redact_uri
from agent.status import VideoCounters
from providers.native_stderr import captured_stderr

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
# Bound how long OpenCV's FFmpeg backend may block opening or reading a network stream, and how
# long the diagnosis of one that did not open may wait for each answer (VideoSource.fit_within).
NETWORK_TIMEOUT_S = 5.0
DIAGNOSE_TIMEOUT_S = 3.0
# FFmpeg's own lines ("[tcp @ 0x55d0c0a1b2c0] Connection to tcp://... failed: Connection refused"),
# which it writes to the process's stderr from C. Its level is set through OpenCV's switch, which
# OpenCV reads once, at the first FFmpeg open in the process (_ffmpeg_level): quiet, since the
# diagnosis says more (agent/sources/diagnose.py); AV_LOG_ERROR where the agent then logs at DEBUG,
# and each open is then captured (providers/native_stderr.py) into the log at DEBUG.
FFMPEG_LINE = re.compile(rb"\[[^\]\s]+ @ 0x[0-9a-fA-F]+\] ")
FFMPEG_LEVEL_ENV = "OPENCV_FFMPEG_LOGLEVEL"
FFMPEG_SKIP_CALLBACK_ENV = "OPENCV_FFMPEG_SKIP_LOG_CALLBACK"  # "1": FFmpeg writes, not OpenCV (stdout)
AV_LOG_QUIET, AV_LOG_ERROR = -8, 16
_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_LEVEL_LOCK = threading.Lock()
_LEVEL_SET = threading.Event()


def ffmpeg_text(line: bytes, uri: str) -> str:
    """One of FFmpeg's lines as the log says it: the password of `uri`, and of any URL, hidden."""
    text = hide_password(line.decode(errors="replace").rstrip(), uri)
    return _URL_IN_TEXT.sub(lambda url: _redacted(url.group()), text)


def _redacted(url: str) -> str:
    try:
        return redact_uri(url)
    except ValueError:  # not a URL urlsplit can take apart: hide all but its scheme
        return url.partition("://")[0] + "://***"


def _ffmpeg_level(open_: Callable[[], cv2.VideoCapture]) -> cv2.VideoCapture:
    """`open_()`, an OpenCV FFmpeg open. The process's first runs with FFmpeg's level in the
    environment, where OpenCV reads it (then only), and for that open only: a program the agent
    starts, or a release it execs into, decides for itself. An operator's own OPENCV_FFMPEG_LOGLEVEL
    is kept. A later change of the agent's log level does not change FFmpeg's."""
    if _LEVEL_SET.is_set():
        return open_()
    with _LEVEL_LOCK:
        if _LEVEL_SET.is_set():
            return open_()
        level = AV_LOG_ERROR if log.isEnabledFor(logging.DEBUG) else AV_LOG_QUIET
        wanted = {FFMPEG_LEVEL_ENV: str(level), FFMPEG_SKIP_CALLBACK_ENV: "1"}
        added = {name: value for name, value in wanted.items() if name not in os.environ}
        os.environ.update(added)
        try:
            return open_()
        finally:
            for name in added:
                os.environ.pop(name, None)
            _LEVEL_SET.set()


class Capture(Protocol):
    """What the decoder thread reads from: a cv2.VideoCapture, an ImageFolder or a GStreamer
    pipeline. `grab` takes the next frame; `retrieve` makes it an image (colour conversion and copy
    for OpenCV, the image decode for a folder): frames the fps cap skips are only grabbed."""

    def isOpened(self) -> bool: ...  # OpenCV's names

    def grab(self) -> bool: ...

    def retrieve(self) -> tuple[bool, Any]: ...

    def get(self, prop: int) -> float: ...

    def release(self) -> None: ...


class VideoSource(ThreadedSource):
    """Decodes one video source in its own thread into `slot`, newest frame only."""

    def __init__(self, config: VideoSourceConfig, name: str, slot: LatestFrameSlot) -> None:
        super().__init__(name, slot, redact_uri(config.uri))
        self.latest: LatestFrameSlot = slot  # (the base keeps it as either kind of hand-over)
        self.config = config
        self.kind = source_kind(config.uri)
        self.frames_decoded = 0
        self.frames_skipped_by_fps = 0
        self._opened_before = False  # a looping file reopens each time round: INFO only the first
        self.open_timeout_s = NETWORK_TIMEOUT_S
        self.diagnose_timeout_s = DIAGNOSE_TIMEOUT_S

    def fit_within(self, seconds: float) -> None:
        """Shorten the network timeouts so that a camera that accepts and never answers is opened,
        given up on and diagnosed within `seconds` (`edge-agent source --seconds`, doctor): a third
        of it (at most the daemon's 3 s) for the diagnosis, the rest (at most 5 s) to open."""
        self.diagnose_timeout_s = min(DIAGNOSE_TIMEOUT_S, max(0.25, seconds / 3))
        self.open_timeout_s = min(NETWORK_TIMEOUT_S, max(0.25, seconds - self.diagnose_timeout_s))

    def _counters(self) -> VideoCounters:
        return VideoCounters(self.frames_decoded, self.frames_skipped_by_fps)

    # --- decoder thread ----------------------------------------------------------------

    def _run(self) -> None:
        failures = 0  # in a row; sets the backoff
        index = 0
        try:
            while not self._stop.is_set():
                try:
                    outcome, index = self._open_and_read(index)
                except Exception as exc:  # OpenCV or the file system failing must not end the source
                    log.exception("source %s: unexpected error", self.name)
                    self._fail(f"unexpected error reading {self.display_uri}: {exc}")
                    outcome = "failed"
                if outcome == "finished":
                    self._set_state("finished")
                    log.info("source %s: end of %s", self.name, self.display_uri)
                    return
                if outcome in ("stopped", "rewind"):
                    continue
                with self._lock:
                    self.reconnects += 1
                # "broken": it delivered frames, then stopped: reopen after the shortest delay.
                failures = 1 if outcome == "broken" else failures + 1
                self._stop.wait(backoff_delay(failures, self.config.reopen_min_s, self.config.reopen_max_s))
        finally:
            if self.state != "finished":
                self._set_state("stopped", self.error)
            self.slot.close()

    def _open_and_read(self, index: int) -> tuple[str, int]:
        capture = self._open()
        if capture is None:
            return ("stopped" if self._stop.is_set() else "failed"), index
        try:
            return self._read_until_end(capture, index)
        finally:
            capture.release()

    def _open(self) -> Capture | None:
        uri = self.config.uri
        if self.kind == "folder":
            folder = ImageFolder(Path(uri), self.config.fps or 1.0)
            if not folder.isOpened():
                self._fail(f"image folder {uri} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
                return None
            # A looping folder reopens at each pass (several a second for one photo): said once at INFO.
            level = logging.DEBUG if self._opened_before else logging.INFO
            log.log(level, "source %s: opened %s (%d images)", self.name, uri, len(folder.paths))
            self._opened_before = True
            return folder
        if self.kind == "file" and not Path(uri).is_file():
            self._fail(f"video file {uri} does not exist")
            return None
        if self.kind == "gstreamer":
            pipeline = GstLaunchCapture(uri, self.config.fps)
            if not pipeline.isOpened():
                pipeline.release()
                self._fail(f"GStreamer pipeline gave no frame: {pipeline.failure}")
                return None
            log.info("source %s: GStreamer pipeline running: %s", self.name, self.display_uri)
            return pipeline
        capture: cv2.VideoCapture | None
        if self.kind == "device":
            target: int | str = int(uri) if uri.isdigit() else uri
            capture = cv2.VideoCapture(target, cv2.CAP_V4L2)
        elif self.kind == "url":
            timeout_ms = round(self.open_timeout_s * 1000)
            params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms]
            capture = self._open_ffmpeg(params)
        else:
            capture = self._open_ffmpeg([])
        if capture is None:  # stopped before it opened
            return None
        if not capture.isOpened():
            capture.release()
            if self._stop.is_set():  # a stop cut the open short: nothing to diagnose
                return None
            from agent.sources.diagnose import diagnose_open_failure  # (it imports this module)

            why = diagnose_open_failure(uri, self.kind, self.diagnose_timeout_s)
            self._fail(f"cannot open {self.kind} source {self.display_uri}" + (f": {why}" if why else ""))
            return None
        level = logging.DEBUG if self._opened_before and self.kind == "file" else logging.INFO
        log.log(level, "source %s: opened %s", self.name, self.display_uri)
        self._opened_before = True
        return capture

    def _open_ffmpeg(self, params: list[int]) -> cv2.VideoCapture | None:
        """The config's URI through OpenCV's FFmpeg backend (None: stopped first). What FFmpeg prints
        ("[tcp @ 0x...] Connection to tcp://... failed: Connection refused") is turned off, the
        diagnosis says it in words an operator can act on; where the agent logs at DEBUG it goes to
        the log, captured around the open (other lines written meanwhile go on after it).
        """

        def open_() -> cv2.VideoCapture | None:
            if self._stop.is_set():  # (stopped before, or while it waited for another capture)
                return None
            return _ffmpeg_level(lambda: cv2.VideoCapture(self.config.uri, cv2.CAP_FFMPEG, params))

        if not log.isEnabledFor(logging.DEBUG):
            return open_()
        with captured_stderr(FFMPEG_LINE.match, self._log_ffmpeg_line):
            return open_()

    def _log_ffmpeg_line(self, line: bytes) -> None:
        # (FFmpeg does not say which stream a line is about: most likely, the one opening.)
        log.debug("source %s: FFmpeg: %s", self.name, ffmpeg_text(line, self.config.uri))

    def _read_until_end(self, capture: Capture, index: int) -> tuple[str, int]:
        """Read frames until stop, end of file or failure. Returns (outcome, next index).

        Outcomes: "stopped", "finished" (file end), "rewind" (file end, looping),
        "broken" (frames came, then stopped), "failed" (no frame at all).
        """
        is_file = self.kind in ("file", "folder")  # finite, played at their own rate
        file_fps = capture.get(cv2.CAP_PROP_FPS) if is_file else 0.0
        # A folder's rate is the config's fps (up to MAX_FPS); a file's is its own, when it gives one
        # a camera could have (a high-speed clip at 1000 included); 0 or a runaway value: 25.
        file_fps = file_fps if 0 < file_fps <= MAX_FPS else 25.0
        min_interval = 1.0 / self.config.fps if self.config.fps else 0.0
        # realtime off: a file is decoded just ahead of the model instead of at its own rate.
        paced_by_model = is_file and not self.config.realtime
        started = time.monotonic()
        last_handed = float("-inf")
        frames_here = 0
        while not self._stop.is_set():
            if not capture.grab():
                if is_file and frames_here > 0:
                    return ("rewind" if self.config.loop else "finished"), index
                why = getattr(capture, "failure", None)  # GstLaunchCapture says why; OpenCV cannot
                self._fail(f"{self.display_uri} stopped delivering frames" + (f": {why}" if why else ""))
                return ("broken" if frames_here else "failed"), index
            now_wall, now = time.time(), time.monotonic()
            if frames_here == 0:
                self._set_state("streaming")
            frames_here += 1
            index += 1
            with self._lock:
                self.frames_decoded += 1
            # Files play at their own frame rate, like a camera would deliver them.
            timeline = (frames_here - 1) / file_fps if is_file else now - started
            if timeline - last_handed >= min_interval - 1e-9:
                ok, image = capture.retrieve()  # only frames that go on are converted (or decoded)
                if ok and image is not None:
                    last_handed = timeline
                    position = timeline if is_file else None
                    self.slot.put(Frame(data=image, index=index, captured_at=now_wall, position_s=position))
                    while paced_by_model and not self.latest.wait_taken(0.5) and not self._stop.is_set():
                        pass
                else:
                    self._fail(f"{self.display_uri}: a frame could not be converted")
                    return "broken", index
            else:
                with self._lock:
                    self.frames_skipped_by_fps += 1
            if is_file and not paced_by_model:
                due = started + frames_here / file_fps
                self._stop.wait(max(0.0, due - time.monotonic()))
        return "stopped", index


class ImageFolder:
    """A folder of images read like a cv2.VideoCapture: one frame per image, in name order, at `fps`.

    An image that cannot be decoded is skipped (counted in `unreadable`, logged once per file).
    """

    def __init__(self, folder: Path, fps: float) -> None:
        self.fps = fps
        try:
            self.paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        except OSError:
            self.paths = []
        self.next = 0
        self.unreadable: list[str] = []
        self._grabbed: Any = None  # the image grab() decoded

    def isOpened(self) -> bool:  # cv2.VideoCapture's name
        return bool(self.paths)

    def get(self, prop: int) -> float:
        return self.fps if prop == cv2.CAP_PROP_FPS else 0.0

    def grab(self) -> bool:
        """The next image that decodes (one that does not is skipped, logged once per file). A
        folder plays at the fps cap itself, so every grabbed image is used: decoding here costs
        nothing extra and keeps an unreadable file from taking a frame's place."""
        self._grabbed = None
        while self.next < len(self.paths):
            path = self.paths[self.next]
            self.next += 1
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is not None:
                self._grabbed = image
                return True
            if path.name not in self.unreadable:
                self.unreadable.append(path.name)
                log.warning("image folder: cannot decode %s; skipping it", path)
        return False

    def retrieve(self) -> tuple[bool, Any]:
        image, self._grabbed = self._grabbed, None
        return image is not None, image

    def read(self) -> tuple[bool, Any]:
        return self.retrieve() if self.grab() else (False, None)

    def release(self) -> None:
        self.paths = []


def source_kind(uri: str) -> str:
    """gstreamer, url, device, folder or file: what a video uri names."""
    if is_gst_pipeline(uri):
        return "gstreamer"
    if URL.match(uri):
        return "url"
    if uri.isdigit() or uri.startswith("/dev/video"):
        return "device"
    try:
        return "folder" if Path(uri).is_dir() else "file"
    except OSError:  # a name the file system refuses (too long, ...): opening it says so, and retries
        return "file"
