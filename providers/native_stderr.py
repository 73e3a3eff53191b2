"""Native runtimes that print to the process's stderr (fd 2) behind Python's back.

TFLite/LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." when it allocates
tensors, on every interpreter: noise on every CLI command and in the daemon's journal, and no
environment variable turns it off (TF_CPP_MIN_LOG_LEVEL does not reach it). `filtered_stderr`
catches fd 2 for the duration of such a call and writes back every line but the known noise, so a
real warning or error from the runtime is still seen. The caller may keep the noise to log it (the
video sources log FFmpeg's own lines at DEBUG: agent/sources/video.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

# fd 2 is the process's: one filter at a time.
_LOCK = threading.Lock()


@contextlib.contextmanager
def filtered_stderr(
    noise: tuple[bytes, ...] | re.Pattern[bytes], noise_to: list[bytes] | None = None
) -> Iterator[None]:
    """Run the block with fd 2 caught; afterwards write back each line that is not noise: one
    starting with one of `noise`, or matching it where it is a pattern. The noise goes to `noise_to`
    where given, else nowhere. What other threads wrote meanwhile is written back too, only later."""
    is_noise = noise.match if isinstance(noise, re.Pattern) else lambda line: line.startswith(noise)
    with _LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with tempfile.TemporaryFile() as caught:
                os.dup2(caught.fileno(), 2)
                try:
                    yield
                finally:
                    sys.stderr.flush()
                    os.dup2(saved, 2)
                    caught.seek(0)
                    lines = caught.read().splitlines(keepends=True)
                    kept = [line for line in lines if not is_noise(line)]
                    if noise_to is not None:
                        noise_to.extend(line for line in lines if is_noise(line))
                    if kept:
                        os.write(2, b"".join(kept))
        finally:
            os.close(saved)
