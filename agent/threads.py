"""The daemon's long-lived threads, named for the operating system too.

Python names its threads for itself only: `top -H`, `ps -L` and /proc/<pid>/task/*/comm show every
thread of the daemon as `python3`. A thread started here names itself as the kernel sees it (Linux
keeps 15 bytes), and threads it starts inherit that name unless they name themselves (FFmpeg calls
its decoding threads `av:<codec>:...`), so the CPU a camera's decoding costs can be told from the
pipeline's (scripts/bench_capacity.py reads it so).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

_PR_SET_NAME = 15  # prctl(2)
OS_NAME_BYTES = 15  # the kernel's limit, without the terminating NUL


@cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` as the kernel sees it (cut to 15 bytes); nothing where the
    system cannot."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_NAME, name.encode("utf-8", "replace")[:OS_NAME_BYTES], 0, 0, 0)


def named_thread(target: Callable[[], Any], name: str) -> threading.Thread:
    """A daemon thread running `target` under `name`, for Python and for the operating system."""

    def run() -> None:
        name_this_thread(name)
        target()

    return threading.Thread(target=run, name=name, daemon=True)
