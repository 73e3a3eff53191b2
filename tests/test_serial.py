"""Serial-line sensors on a real pseudo-terminal pair (os.openpty): the source opens the tty side in
raw mode at a baud rate and reads lines; the test writes to the other side as a device would. Bad
lines are counted and named; a device that goes away is reported and retried."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import SerialSourceConfig
from agent.sources import FrameQueue, SerialSource
from tests.waits import wait_until


@pytest.fixture
def pty() -> Iterator[tuple[int, str]]:
    """(the device side to write to, the tty path the source opens)."""
    device, tty = os.openpty()
    path = os.ttyname(tty)
    yield device, path
    for fd in (device, tty):
        with contextlib.suppress(OSError):  # a test may have closed the device side already
            os.close(fd)


def _serial(uri: str, sources: list[SerialSource], **settings: Any) -> tuple[SerialSource, FrameQueue]:
    config = SerialSourceConfig.model_validate(
        {"type": "serial", "uri": uri, "reopen_min_s": 0.05, "reopen_max_s": 0.2, **settings}
    )
    queue = FrameQueue(config.max_queue)
    source = SerialSource(config, "uart", queue)
    sources.append(source)
    source.start()
    return source, queue


def test_lines_become_windows_and_bad_lines_are_counted(
    pty: tuple[int, str], sources: list[SerialSource]
) -> None:
    device, path = pty
    source, queue = _serial(path, sources, baud=115200, window=3)
    assert wait_until(lambda: source.state == "streaming", timeout=30), source.stats()
    # Split across writes, CRLF and LF endings, a line with two readings, a garbled one.
    for chunk in (b"1.0\r\n2.", b"0\n", b"\x00\xffgarbage\n3.0 4.0\n", b"5.0\n6.0\n"):
        os.write(device, chunk)
    assert wait_until(lambda: source.stats().counters.windows == 2, timeout=30), source.stats()
    first, second = queue.get(30.0), queue.get(30.0)
    assert first is not None and second is not None
    assert np.array_equal(first.data, [1.0, 2.0, 3.0]) and np.array_equal(second.data, [4.0, 5.0, 6.0])
    assert (first.gap, second.gap) == (True, False)
    stats = source.stats()
    assert stats.counters.lines == 6 and stats.counters.bad_lines == 1
    assert stats.counters.last_bad_line == "line 3: not UTF-8 text"


def test_json_lines_with_a_field(pty: tuple[int, str], sources: list[SerialSource]) -> None:
    device, path = pty
    source, queue = _serial(path, sources, field="env.t", window=2)
    assert wait_until(lambda: source.state == "streaming", timeout=30)
    os.write(device, b'{"env": {"t": 21.5}}\n{"env": {"h": 40}}\n{"env": {"t": 22.0}}\n')
    assert wait_until(lambda: source.stats().counters.windows == 1, timeout=30), source.stats()
    frame = queue.get(30.0)
    assert frame is not None and np.array_equal(frame.data, [21.5, 22.0])
    assert source.stats().counters.last_bad_line == "line 2: no field 'env.t' (missing 't')"


def test_a_device_that_goes_away_is_reported_and_retried(
    pty: tuple[int, str], sources: list[SerialSource]
) -> None:
    device, path = pty
    source, _ = _serial(path, sources)
    assert wait_until(lambda: source.state == "streaming", timeout=30)
    os.close(device)  # unplugged: the line hangs up
    assert wait_until(lambda: source.state == "retrying", timeout=30), source.stats()
    assert str(source.stats().error).startswith(f"serial port {path} failed") or "cannot open" in str(
        source.stats().error
    )
    assert wait_until(lambda: source.stats().reconnects >= 2, timeout=30)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"uri": "/dev/ttyEDGEAGENT-NONE"}, "cannot open serial port /dev/ttyEDGEAGENT-NONE: [Errno 2]"),
        ({"baud": 12345}, "baud rate 12345 is not one this system supports"),
    ],
)
def test_a_port_that_cannot_be_used_says_why(
    pty: tuple[int, str], sources: list[SerialSource], settings: dict[str, Any], message: str
) -> None:
    _, path = pty
    uri = settings.pop("uri", path)
    source, _ = _serial(uri, sources, **settings)
    assert wait_until(lambda: source.state == "retrying", timeout=30), source.stats()
    assert message in str(source.stats().error)
    assert not Path("/dev/ttyEDGEAGENT-NONE").exists()
