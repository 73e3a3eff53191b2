"""Sensor values from a serial line (/dev/ttyUSB0, /dev/ttyACM0, ...): one reading per text line.

The port is opened raw at the configured baud rate (termios: no extra package), read line by line;
each line is parsed like an MQTT payload (numbers, or JSON with a field path) and the values go
into windows. A line that holds no number is counted and named; a port that disappears (unplugged)
is reopened with backoff, and the partial window is dropped (the stream has a gap).
"""

from __future__ import annotations

import logging
import os
import select
import termios
import time

from agent.config import SerialSourceConfig
from agent.logfmt import first_or_every
from agent.retry import backoff_delay
from agent.sources.base import ThreadedSource
from agent.sources.frames import FrameQueue, Windower
from agent.sources.sensors import parse_values
from agent.status import SerialCounters

log = logging.getLogger(__name__)

_MAX_LINE = 64 * 1024  # a device that never sends a newline must not fill the memory


def _baud_constant(baud: int) -> int:
    constant = getattr(termios, f"B{baud}", None)
    if constant is None:
        raise ValueError(f"baud rate {baud} is not one this system supports")
    return int(constant)


class SerialSource(ThreadedSource):
    kind = "serial"

    def __init__(self, config: SerialSourceConfig, name: str, queue: FrameQueue) -> None:
        super().__init__(name, queue, config.uri)
        self.config = config
        self._windows = Windower(queue, config.window, config.hop or config.window)
        self.lines = 0
        self.bad_lines = 0
        self.last_bad_line: str | None = None

    def _counters(self) -> SerialCounters:
        return SerialCounters(self.lines, self.bad_lines, self.last_bad_line, self._windows.index)

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    fd = self._open()
                except (OSError, ValueError, termios.error) as exc:
                    failures += 1
                    self._count_reconnect()
                    self._fail(f"cannot open serial port {self.config.uri}: {exc}")
                    self._stop.wait(
                        backoff_delay(failures, self.config.reopen_min_s, self.config.reopen_max_s)
                    )
                    continue
                failures = 0
                self._set_state("streaming")
                log.info("source %s: reading %s at %d baud", self.name, self.config.uri, self.config.baud)
                try:
                    self._read_lines(fd)
                except OSError as exc:  # unplugged: EIO on read
                    self._count_reconnect()
                    self._fail(f"serial port {self.config.uri} failed: {exc}")
                    self._windows.restart()
                    self._stop.wait(self.config.reopen_min_s)
                finally:
                    os.close(fd)
        finally:
            self._set_state("stopped", self.error)
            self.slot.close()

    def _open(self) -> int:
        fd = os.open(self.config.uri, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            attributes = termios.tcgetattr(fd)
            attributes[0] = 0  # iflag: no input processing
            attributes[1] = 0  # oflag
            attributes[2] = termios.CS8 | termios.CREAD | termios.CLOCAL  # cflag: 8N1, ignore modem lines
            attributes[3] = 0  # lflag: raw (no echo, no line editing, no signals)
            speed = _baud_constant(self.config.baud)
            attributes[4] = attributes[5] = speed
            termios.tcsetattr(fd, termios.TCSANOW, attributes)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_lines(self, fd: int) -> None:
        pending = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:  # the other end hung up
                raise OSError("the device closed the line")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > _MAX_LINE:
                self._bad(f"a line longer than {_MAX_LINE} bytes")
                pending = b""
            for line in lines:
                if line.strip():
                    self._take(line.rstrip(b"\r"))

    def _take(self, line: bytes) -> None:
        try:
            values = parse_values(line, self.config.field)
        except ValueError as exc:
            self._bad(str(exc))
            return
        with self._lock:
            self.lines += 1
        self._windows.add(values, time.time())

    def _bad(self, why: str) -> None:
        with self._lock:
            self.lines += 1
            self.bad_lines += 1
            self.last_bad_line = f"line {self.lines}: {why}"
            count = self.bad_lines
        if first_or_every(count):
            log.warning("source %s: bad line (%d so far): %s", self.name, count, why)
