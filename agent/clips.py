"""Event clips: an H.264 MP4 of what a pipeline's tracked objects did, from `pre_s` before the first
one appeared to `post_s` after the last one left (the pipeline's `clips:`, agent/config/clips.py).

One clip per time span, shared by the objects in it: a clip opens at an object's `new` (with the
pre-roll of the last `pre_s`), stays open while any object is tracked, and closes `post_s` after the
last one's `end` (or at the pipeline's stop, or after `max_s`: the next clip carries on). Every event
of the frames a clip covers carries its id as `clip`, so an object's `new` and `end` name the file that
shows it. (One file per object would encode overlapping objects' frames several times over.)

The pipeline's report thread only hands frames over (`ClipRecorder.frame`: a reference into a bounded
queue, no copy, no encoding); the recorder's own thread keeps the pre-roll as JPEGs (bounded in frames
and bytes), sampled at the clip's frame rate, and feeds them to ffmpeg (libx264, yuv420p, +faststart).
A slow disk or encoder drops clip frames (counted in the status), never stalls the pipeline. Frames a
clip lacks (dropped, gated by motion) are filled by repeating the last one, so its length is the time
it covers.

Files: <root>/<id>.mp4 (root: <state_dir>/clips/<pipeline>); an id is `<UTC time>-<8 hex>`, e.g.
`20261129T071846Z-1a2b3c4d`: a safe file name, in time order. A clip is written under a temp name and
renamed when ffmpeg has finished it. Retention: after each clip the oldest go until at most
`max_clips` remain in `max_bytes`; a new recorder scans its root first and removes temp files a crash
left behind.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import cv2
import numpy as np

from agent.config.clips import MAX_CLIP_FPS, ClipsConfig
from agent.threads import named_thread

log = logging.getLogger(__name__)

ID_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")
SUFFIX = ".mp4"
_TEMP = ".mp4.tmp-"
_QUEUE_FRAMES = 8  # frames waiting for the recorder's thread at most: more are dropped, counted
_PREROLL_BYTES = 64 * 1024 * 1024  # the pre-roll's JPEGs at most
_DEFAULT_FPS = 10.0  # a clip's rate when the frames' own cannot be measured yet
_MAX_REPEAT_S = 10.0  # a gap longer than this in a clip is not filled frame by frame
_CLOSE_TIMEOUT_S = 60.0
# As `infer --draw out.mp4` (agent/tools/infer/video.py): H.264 a browser plays, its index at the front.
_H264 = [
    "-c:v",
    "libx264",
    "-preset",
    "veryfast",
    "-crf",
    "23",
    "-pix_fmt",
    "yuv420p",
    "-movflags",
    "+faststart",
]


def encoder_problem() -> str | None:
    """Why clips cannot be encoded here (no ffmpeg, or one without libx264), or None."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        return "no ffmpeg on PATH: clips need ffmpeg with libx264 (install ffmpeg)"
    return _libx264_problem(ffmpeg)


@functools.lru_cache(maxsize=4)
def _libx264_problem(ffmpeg: str) -> str | None:
    try:
        done = subprocess.run(
            [ffmpeg, "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {ffmpeg}: {exc}"
    if not any(len(line.split()) > 1 and line.split()[1] == "libx264" for line in done.stdout.splitlines()):
        return f"{ffmpeg} has no libx264 encoder: clips need H.264 (install a full ffmpeg)"
    return None


def new_clip_id(at: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at)) + "-" + uuid.uuid4().hex[:8]


def clip_path(root: Path, clip_id: str) -> Path | None:
    """The file of clip `clip_id` under `root`; None when the id is not one (never a path outside root)."""
    return root / f"{clip_id}{SUFFIX}" if ID_RE.fullmatch(clip_id) else None


@dataclass
class _Clip:
    id: str
    process: subprocess.Popen[bytes]
    errors: IO[bytes]
    temp: Path
    t0: float  # the time its first frame shows
    fps: float
    written: int = 0  # frames handed to ffmpeg (repeats included)
    last: bytes = b""  # the last JPEG written (a gap repeats it)


class ClipRecorder:
    """One pipeline's clips. `frame` and `tag` are called by its report thread, `stop` after it; the rest
    runs on the recorder's own thread."""

    def __init__(self, pipeline: str, root: Path, config: ClipsConfig) -> None:
        self.pipeline, self.root, self.config = pipeline, root, config
        self.problem = encoder_problem()
        # The report thread's view: the tracks the open clip covers, and when it closes.
        self._open: str | None = None
        self._opened_at = 0.0
        self._live: set[Any] = set()
        self._close_at: float | None = None
        # Handed to the recorder's thread: ("frame", t, pixels) | ("open", id, t) | ("close", id) | ("stop",)
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._queued_frames = 0
        self._cond = threading.Condition()
        # The recorder thread's own.
        self._preroll: collections.deque[tuple[float, bytes]] = collections.deque()
        self._preroll_bytes = 0
        self._sampled_at = -1e18
        self._clip: _Clip | None = None
        self.encoder_pid: int | None = None  # the running ffmpeg's (status, tests)
        # Counters (status).
        self.clips = 0
        self.dropped = 0
        self.failed = 0
        self.removed = 0
        self.last_error: str | None = None
        self._kept: dict[str, tuple[Path, int]] = {}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._kept = self._scan()
        except OSError as exc:  # no clips, and the pipeline runs on
            self.problem = self.problem or f"cannot use {root} for clips: {exc.strerror or exc}"
        if self.problem is not None:
            log.warning("pipeline %s: no event clips: %s", pipeline, self.problem)
        self._enforce()  # (a smaller bound than the last run's)
        self._thread = named_thread(self._run, f"clips:{pipeline}")
        self._thread.start()

    # --- the report thread's side ------------------------------------------------------------------

    def use(self, config: ClipsConfig) -> None:
        """A new stage's config (a reload): pre/post and retention apply from the next clip."""
        self.config = config

    def frame(self, pixels: np.ndarray | None, at: float, events: list[dict[str, Any]]) -> None:
        """One frame (BGR) at wall time `at` and its tracking events: opens, keeps or closes the clip and
        puts its id on the events it covers. Cheap: the frame is only queued."""
        if self.problem is not None:
            return
        for event in events:
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if event.get("type") == "new":
                self._live.add(obj.get("id"))
                if self._open is None:
                    self._open, self._opened_at = new_clip_id(at), at
                    self._put(("open", self._open, at))
                self._close_at = None
            elif event.get("type") == "end":
                self._live.discard(obj.get("id"))
                if not self._live and self._open is not None:
                    self._close_at = at + self.config.post_s
        if self._open is not None:
            for event in events:
                event["clip"] = self._open
        if pixels is not None:
            with self._cond:
                if self._queued_frames >= _QUEUE_FRAMES:
                    self.dropped += 1
                else:
                    self._queued_frames += 1
                    self._queue.append(("frame", at, pixels))
                    self._cond.notify()
        if self._open is not None:
            if self._close_at is not None and at >= self._close_at:
                self._put(("close", self._open))
                self._open, self._close_at = None, None
            elif at - self._opened_at >= self.config.max_s:  # the next clip carries on at once
                self._put(("close", self._open))
                self._open, self._opened_at = new_clip_id(at), at
                self._put(("open", self._open, at))

    def tag(self, events: list[dict[str, Any]]) -> None:
        """Events outside a frame (the tracks a stop ends): the open clip's id on them."""
        if self._open is not None:
            for event in events:
                event["clip"] = self._open

    def stop(self, timeout: float = 5.0) -> None:
        """Close the open clip (finished with what it has) and end the recorder's thread. An encoder that
        has stopped reading is killed after `timeout` (its clip is lost, counted): a stop never hangs."""
        if self._open is not None:
            self._put(("close", self._open))
            self._open = None
        self._put(("stop",))
        self._thread.join(timeout)
        clip = self._clip
        if self._thread.is_alive() and clip is not None:
            clip.process.kill()  # (the write it blocks on fails: the clip is closed as failed)
            self._thread.join(timeout)

    def _put(self, item: tuple[Any, ...]) -> None:
        with self._cond:  # opens and closes are never dropped: they are few
            self._queue.append(item)
            self._cond.notify()

    def status(self) -> dict[str, Any]:
        kept = list(self._kept.values())  # (the recorder's thread changes it meanwhile)
        return {
            "encoder": "libx264" if self.problem is None else f"unavailable: {self.problem}",
            "recording": self._open,
            "clips": self.clips,
            "kept": len(kept),
            "bytes": sum(size for _, size in kept),
            "frames_dropped": self.dropped,
            "failed": self.failed,
            "removed": self.removed,
            "last_error": self.last_error,
        }

    # --- the recorder's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                item = self._queue.popleft()
                if item[0] == "frame":
                    self._queued_frames -= 1
            try:
                if item[0] == "stop":
                    return
                if item[0] == "frame":
                    self._on_frame(item[1], item[2])
                elif item[0] == "open":
                    self._on_open(item[1], item[2])
                elif item[0] == "close":
                    self._on_close(item[1])
            except Exception as exc:  # a clip lost (an ffmpeg that cannot start), never the recorder
                self._fail(f"{item[0]}: {exc}")

    def _fps(self) -> float:
        if self.config.fps is not None:
            return self.config.fps
        times = [t for t, _ in self._preroll]
        if len(times) >= 2 and times[-1] > times[0]:  # (the pre-roll is sampled at MAX_CLIP_FPS at most)
            return max(1.0, min(MAX_CLIP_FPS, round((len(times) - 1) / (times[-1] - times[0]), 1)))
        return _DEFAULT_FPS

    def _on_frame(self, at: float, pixels: np.ndarray) -> None:
        rate = self.config.fps or MAX_CLIP_FPS
        if at - self._sampled_at < 0.9 / rate:
            return  # between the samples a clip keeps: not even encoded
        ok, jpeg = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, self.config.quality])
        if not ok:
            return
        data = jpeg.tobytes()
        self._sampled_at = at
        self._preroll.append((at, data))
        self._preroll_bytes += len(data)
        keep_from = at - self.config.pre_s - 1.0
        while self._preroll and (self._preroll[0][0] < keep_from or self._preroll_bytes > _PREROLL_BYTES):
            self._preroll_bytes -= len(self._preroll.popleft()[1])
        if self._clip is not None:
            self._write(self._clip, at, data)

    def _on_open(self, clip_id: str, at: float) -> None:
        if self._clip is not None:
            self._on_close(self._clip.id)
        ffmpeg = shutil.which("ffmpeg") or "ffmpeg"
        fps = self._fps()
        temp = self.root / f"{clip_id}{_TEMP}{uuid.uuid4().hex[:8]}"
        command = [
            ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
            "-f", "image2pipe", "-c:v", "mjpeg", "-framerate", f"{fps:.6g}", "-i", "-",
            "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", *_H264, "-f", "mp4", str(temp),
        ]  # fmt: skip
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the clip)
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
        self.encoder_pid = process.pid
        pre = [(t, data) for t, data in self._preroll if t >= at - self.config.pre_s]
        t0 = pre[0][0] if pre else at
        clip = self._clip = _Clip(clip_id, process, errors, temp, t0, fps)
        for t, data in pre:
            self._write(clip, t, data)

    def _write(self, clip: _Clip, at: float, data: bytes) -> None:
        """The frame at `at`: as many times as the clip's timeline has room for since the last (0: a frame
        between two of the clip's; more: a gap filled)."""
        due = round((at - clip.t0) * clip.fps) + 1 - clip.written
        due = min(due, int(_MAX_REPEAT_S * clip.fps))
        assert clip.process.stdin is not None
        try:
            for _ in range(due):
                clip.process.stdin.write(data)
                clip.written += 1
        except BrokenPipeError:  # ffmpeg is gone: the clip fails with what it said
            self._on_close(clip.id)
            return
        clip.last = data

    def _on_close(self, clip_id: str) -> None:
        clip, self._clip = self._clip, None
        if clip is None or clip.id != clip_id:
            if clip is not None:
                self._clip = clip
            return
        self.encoder_pid = None
        stdin = clip.process.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError):
            if clip.written == 0 and clip.last:
                stdin.write(clip.last)
            stdin.close()
        try:
            code = clip.process.wait(_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            clip.process.kill()
            code = clip.process.wait()
        clip.errors.seek(0)
        said = clip.errors.read()[-1000:].decode(errors="replace").strip()
        clip.errors.close()
        if code != 0 or clip.written == 0:
            clip.temp.unlink(missing_ok=True)
            self._fail(f"clip {clip.id}: ffmpeg failed (exit {code}): {said or 'no frames'}")
            return
        final = self.root / f"{clip.id}{SUFFIX}"
        os.replace(clip.temp, final)
        self.clips += 1
        self._kept[clip.id] = (final, final.stat().st_size)
        self._enforce()

    def _fail(self, message: str) -> None:
        self.failed += 1
        self.last_error = message
        if self.failed in (1, 10, 100) or self.failed % 1000 == 0:
            log.warning("pipeline %s: %s (%d clips failed so far)", self.pipeline, message, self.failed)

    # --- retention ---------------------------------------------------------------------------------

    def _scan(self) -> dict[str, tuple[Path, int]]:
        """The clips a previous run left, oldest first; their temp files removed."""
        kept: dict[str, tuple[Path, int]] = {}
        for path in sorted(self.root.iterdir()):
            if _TEMP in path.name:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            elif path.suffix == SUFFIX and ID_RE.fullmatch(path.stem):
                with contextlib.suppress(FileNotFoundError):
                    kept[path.stem] = (path, path.stat().st_size)
        return kept

    def _enforce(self) -> None:
        """The oldest clips go until at most max_clips remain in max_bytes (ids sort by time)."""
        total = sum(size for _, size in self._kept.values())
        for clip_id in sorted(self._kept):
            if len(self._kept) <= self.config.max_clips and total <= self.config.max_bytes:
                break
            path, size = self._kept.pop(clip_id)
            total -= size
            self.removed += 1
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove clip %s: %s", path, exc.strerror)
