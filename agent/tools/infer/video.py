"""The videos `infer --track --draw` writes, in formats browsers and Home Assistant play: .mp4 is H.264
(yuv420p, the index at the front) through ffmpeg's libx264, which the OpenCV wheels lack; .webm is VP8
(ffmpeg's libvpx, else OpenCV's own); .avi stays Motion JPEG through OpenCV (players, not browsers).

Each format is checked before any work starts (`video_problem`): a name whose format cannot be
written here is refused with what would work, never a file OpenCV silently writes one frame of.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

import cv2
import numpy as np

from agent.errors import EdgeAgentError

# suffix -> what it holds, for the --help and the messages
VIDEO_FORMATS = {
    ".mp4": "H.264 in MP4, for browsers and Home Assistant (needs ffmpeg with libx264)",
    ".webm": "VP8 in WebM, for browsers and Home Assistant",
    ".avi": "Motion JPEG in AVI (video players; browsers do not play it)",
}
# Names people try that would not give a playable clip: why not.
REFUSED = {
    ".gif": "a GIF would hold one still frame",
    ".mkv": "Matroska is not written here",
    ".mov": "QuickTime is not written here",
}
_ENCODERS = {".mp4": "libx264", ".webm": "libvpx"}
_CODEC_ARGS = {
    ".mp4": ["-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-pix_fmt", "yuv420p",
             "-movflags", "+faststart"],
    ".webm": ["-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "2M",
              "-pix_fmt", "yuv420p"],
}  # fmt: skip
_OPENCV_FOURCC = {".webm": "VP80", ".avi": "MJPG"}
_CLOSE_TIMEOUT_S = 300.0  # ffmpeg finishing a long clip's last frames


@functools.lru_cache(maxsize=4)
def _ffmpeg_encoders(ffmpeg: str) -> frozenset[str]:
    try:
        done = subprocess.run(
            [ffmpeg, "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    names = (line.split()[1] for line in done.stdout.splitlines() if len(line.split()) > 1)
    return frozenset(names) if done.returncode == 0 else frozenset()


def _ffmpeg_for(suffix: str) -> str | None:
    """The ffmpeg on PATH when it has the encoder `suffix` needs, else None."""
    encoder = _ENCODERS.get(suffix)
    ffmpeg = shutil.which("ffmpeg")
    if encoder is None or ffmpeg is None:
        return None
    return ffmpeg if encoder in _ffmpeg_encoders(ffmpeg) else None


def is_video_name(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_FORMATS


def video_problem(path: Path) -> str | None:
    """Why a video cannot be written at `path` here (its format), or None (a video name that can be
    written, or not a video name at all)."""
    suffix = path.suffix.lower()
    if suffix in REFUSED:
        return f"{REFUSED[suffix]}"
    if suffix == ".mp4" and _ffmpeg_for(suffix) is None:
        found = shutil.which("ffmpeg")
        return (
            "H.264 needs ffmpeg with libx264, and "
            + (f"{found} has no libx264" if found else "there is no ffmpeg on PATH")
            + " (install ffmpeg, or name a .webm)"
        )
    return None


class VideoWriter:
    """Frames (BGR, one size) to a video file at `fps`, by ffmpeg or OpenCV as the suffix needs."""

    def __init__(self, path: Path, fps: float, size: tuple[int, int]) -> None:
        self.path, self.fps, self.size = path, fps, size
        self.frames = 0
        suffix = path.suffix.lower()
        self._process: subprocess.Popen[bytes] | None = None
        self._errors: IO[bytes] | None = None
        self._opencv: cv2.VideoWriter | None = None
        ffmpeg = _ffmpeg_for(suffix)
        width, height = size
        if ffmpeg is not None:
            # H.264 and VP8 in yuv420p want even sides: pad by a pixel where the frame's are odd.
            command = [
                ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
                "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width}x{height}", "-framerate", f"{fps:.6g}",
                "-i", "-", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", *_CODEC_ARGS[suffix], str(path),
            ]  # fmt: skip
            # ffmpeg's complaints, kept off the terminal and out of a pipe it could fill and block on
            self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close or abort)
            try:
                self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                 stderr=self._errors)  # fmt: skip
            except OSError as exc:
                raise EdgeAgentError(f"--draw {path}: cannot start ffmpeg: {exc}") from None
            return
        if suffix not in _OPENCV_FOURCC:
            raise EdgeAgentError(f"--draw {path}: {video_problem(path) or 'no writer for this format'}")
        self._opencv = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*_OPENCV_FOURCC[suffix]), fps, size)
        if not self._opencv.isOpened():
            raise EdgeAgentError(f"--draw {path}: OpenCV cannot write this video here")

    def write(self, frame: np.ndarray) -> None:
        if frame.shape[1::-1] != self.size:  # a clip that changes size mid-way: the writer's size it is
            frame = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        if self._process is not None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(np.ascontiguousarray(frame, np.uint8).tobytes())
            except BrokenPipeError:
                raise EdgeAgentError(f"--draw {self.path}: ffmpeg stopped: {self._said()}") from None
        elif self._opencv is not None:
            self._opencv.write(frame)
        self.frames += 1

    def close(self) -> None:
        """Finish the file; EdgeAgentError (and no file) when the encoder failed."""
        if self._opencv is not None:
            self._opencv.release()
            self._opencv = None
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        try:
            code = process.wait(_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = -1
        said = self._said()
        if self._errors is not None:
            self._errors.close()
            self._errors = None
        if code != 0:
            self.path.unlink(missing_ok=True)
            raise EdgeAgentError(f"--draw {self.path}: ffmpeg failed (exit {code}): {said or 'no message'}")

    def abort(self) -> None:
        """Stop without a file (the run failed)."""
        if self._opencv is not None:
            self._opencv.release()
            self._opencv = None
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def _said(self) -> str:
        if self._errors is None:
            return ""
        self._errors.seek(0)
        return self._errors.read()[-2000:].decode(errors="replace").strip()
