"""Native libraries that write to the process's stderr (fd 2) from C, and a capture for a block of
their calls, for the library that has no switch of its own.

Where a library has one, it is used instead: FFmpeg's level is set through OpenCV's
OPENCV_FFMPEG_LOGLEVEL (agent/sources/video.py). LiteRT has none for "INFO: Created TensorFlow Lite
XNNPACK delegate for CPU.", which it prints once per process, on its first interpreter: the probe's
(providers/tflite_backend.py captures it there).

`captured_stderr(claims, sink)`: while the block runs, fd 2 is a memory file; when it ends, fd 2 is
what it was again, and each line written meanwhile (by the block or any other thread) goes to `sink`
where `claims(line)` holds, else to stderr, in the order written. Other threads' lines are held for
the block's length, never lost. One block runs at a time (fd 2 is the whole process's); outside them
fd 2 is left alone: `sys.stderr.isatty()` stays true in a terminal. A program started during a block
inherits the memory file as its stderr (the agent's own children have theirs piped), and a process
that dies inside a block loses what the block captured.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

Claims = Callable[[bytes], object]
Sink = Callable[[bytes], object]

_LOCK = threading.Lock()  # one capture at a time: each moves the process's fd 2


@contextlib.contextmanager
def captured_stderr(claims: Claims, sink: Sink | None = None) -> Iterator[None]:
    """Run the block with fd 2 captured; then the lines `claims` takes go to `sink` (None: dropped),
    the others to stderr."""
    with _LOCK:
        _flush()
        files = _open_capture()
        if files is None:  # no descriptor to spare: the block runs with stderr as it is
            yield
            return
        capture, saved = files
        try:
            os.dup2(capture, 2)
            try:
                yield
            finally:
                _flush()  # what Python buffered in the block is the block's
                os.dup2(saved, 2)
        finally:
            try:
                _pass_on(_read_all(capture), claims, sink)
            finally:
                os.close(capture)
                os.close(saved)


def _open_capture() -> tuple[int, int] | None:
    """(the memory file, a descriptor of the current fd 2), or None."""
    try:
        capture = os.memfd_create("captured-stderr", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # (no memfd: an unlinked temporary file)
        try:
            capture, path = tempfile.mkstemp(prefix="captured-stderr-")
        except OSError:
            return None
        os.unlink(path)
    try:
        return capture, os.dup(2)
    except OSError:
        os.close(capture)
        return None


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _pass_on(data: bytes, claims: Claims, sink: Sink | None) -> None:
    """Each line to `sink` or to stderr, in order (a sink that fails: the line to stderr)."""
    out: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if not _claimed(claims, line):
            out.append(line)
            continue
        if sink is None:
            continue
        _write(b"".join(out))  # (the sink may log to stderr: what came before goes first)
        out = []
        try:
            sink(line)
        except Exception:  # (a sink's failure must not lose the line)
            out.append(line)
    _write(b"".join(out))


def _claimed(claims: Claims, line: bytes) -> bool:
    try:
        return bool(claims(line))
    except Exception:  # (a claim that cannot tell does not claim)
        return False


def _write(data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(OSError):
        while view:
            view = view[os.write(2, view) :]


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
