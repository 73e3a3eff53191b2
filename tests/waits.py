"""Bounded waiting and free ports: the two things nearly every real-component test needs."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released), below the kernel's
    ephemeral range: a broker a test stops and starts again on its port must find it free, and an
    ephemeral port can be taken meanwhile as the source port of any outgoing connection (even a
    client's connection to that very port: TCP's self-connect, which then holds it)."""
    low, _ = _ephemeral_range()
    if low <= 10_000:  # no room below it: let the kernel choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(500):
        port = random.randrange(10_000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: another
            return port
    raise RuntimeError(f"no free TCP port between 10000 and {low} on 127.0.0.1")


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
