"""Bounded waiting and free ports: the two things nearly every real-component test needs."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], object],
    what: str = "condition",
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    state: Callable[[], object] | None = None,
) -> bool:
    """Poll `condition` until it holds; AssertionError naming `what` (and `state()`) after `timeout` s.

    Returns True, so `assert wait_until(...)` reads naturally too.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = f" {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(interval)
    return True
