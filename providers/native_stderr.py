"""Native runtimes that print to the process's stderr (fd 2) behind Python's back, and a router for it.

TFLite/LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." when it allocates
tensors, on every interpreter; OpenCV's FFmpeg backend prints "[tcp @ 0x...] Connection to tcp://...
failed: Connection refused" while a camera opens. Both write to fd 2 from C, and no environment
variable turns them off. So, once per process (on first use), fd 2 becomes a pipe read by one thread,
which asks the routes (a pattern and a sink) whether each line is theirs: a claimed line goes to its
sink (a list, a logger: agent/sources/video.py logs FFmpeg's lines at DEBUG), every other line is
written at once to the real stderr (a dup of the fd 2 it replaced). `routed` adds a route for the
duration of a block (`filtered_stderr`, what TFLite's calls use, is `routed` with prefixes or a
pattern), `keep_routed` for the life of the process (FFmpeg's). Nothing is locked across a block:
blocks in several threads run at once, and other output is never held (only a line without its
newline, for PARTIAL_WAIT_S). The reader is asynchronous: the end of a block, and `settle()`, wait
(at most SETTLE_S) until what was written to fd 2 before it has reached its route and sink, so a
line a native call printed is never routed after its block ended.

What keeps a long-running daemon safe:
- A writer never waits on the router: a line not claimed is forwarded as soon as it is read, and a
  line without its newline after PARTIAL_WAIT_S. The pipe holds 1 MiB where the kernel allows. If
  the reader falls behind (the pipe three quarters full) or fails, fd 2 goes back to the real stderr
  for good, and the reader (in its `finally`) keeps forwarding what is left in the pipe unrouted
  (children started meanwhile hold the pipe as their stderr). Where something else has been put on
  fd 2 since (a test's capture), the router leaves it there and stops.
- At exit (atexit) fd 2 is restored and the pipe drained through the routes, a last line without
  its newline included, so an uncaught exception's traceback is not lost. A process killed without
  exit handlers (os._exit, SIGKILL) loses only what the reader had not read yet (microseconds).
- faulthandler, when enabled at install (PYTHONFAULTHANDLER, -X faulthandler: nothing in the agent
  enables it), is pointed at the real stderr: a crashed process cannot forward a pipe. Enable it
  later with file=`real_stderr()`.
- Bounded: a line is cut at MAX_LINE bytes; the sinks run on their own thread behind a queue of
  SINK_QUEUE lines (a full queue: the line goes to stderr instead); a sink that raises gets its line
  written to stderr. Sinks may log (and so write to fd 2): the reader never waits on them.
- Once installed, fd 2 is a pipe: `sys.stderr.isatty()` is False from then on. The reader is a
  Python thread: native code that printed more than the pipe holds without releasing the GIL would
  wait for it (OpenCV releases the GIL while FFmpeg opens; LiteRT prints one line).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import fcntl
import os
import queue
import re
import select
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator

PIPE_SIZE = 1 << 20
PARTIAL_WAIT_S = 0.1  # a line without its newline is routed this long after its first byte
MAX_LINE = 16 * 1024
SINK_QUEUE = 1024
SETTLE_S = 1.0  # how long the end of a block waits for what was written in it to be routed
EXIT_DRAIN_S = 2.0
_CHUNK = 64 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)

Noise = tuple[bytes, ...] | re.Pattern[bytes]
Sink = Callable[[bytes], object]


class Route:
    """Lines for which `claims(line)` holds go to `sink` (None: dropped)."""

    def __init__(self, claims: Callable[[bytes], object], sink: Sink | None) -> None:
        self.claims = claims
        self.sink = sink


def _claims(noise: Noise) -> Callable[[bytes], object]:
    """A line is noise when it starts with one of `noise`, or matches it where it is a pattern."""
    if isinstance(noise, re.Pattern):
        return noise.match
    prefixes = noise
    return lambda line: line.startswith(prefixes)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Router:
    def __init__(self) -> None:
        self.real = os.dup(2)  # the real stderr, kept open for the life of the process
        self._read, write = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._read, _F_SETPIPE_SZ, PIPE_SIZE)
        try:
            self.capacity = fcntl.fcntl(self._read, _F_GETPIPE_SZ)
        except OSError:
            self.capacity = 64 * 1024
        os.set_blocking(self._read, False)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)
        # Replaced, never changed in place: the reader reads it without a lock.
        self.routes: tuple[Route, ...] = tuple(_PERMANENT)
        self.direct = False  # fd 2 is the real stderr again (given up, or exiting)
        self.routing = True  # the reader routes (False once it ended or gave up)
        self._cond = threading.Condition()
        self._partial = b""
        self._partial_since = 0.0
        self._unrouted = b""  # read and not routed (written out as it is if the reader fails)
        self._read_bytes = 0  # read from the pipe
        self._routed_bytes = 0  # of those, routed (forwarded, or handed to a sink)
        self._queued = 0
        self._delivered = 0
        self._sinks: queue.Queue[tuple[Sink, bytes]] = queue.Queue(SINK_QUEUE)
        try:  # the threads first: fd 2 is never a pipe nobody reads
            threading.Thread(target=self._deliver, name="stderr-sinks", daemon=True).start()
            threading.Thread(target=self._run, name="stderr-router", daemon=True).start()
        except BaseException:
            os.close(write)  # (a reader that did start sees the end of the pipe and stops)
            raise
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(write, 2)
        os.close(write)
        if faulthandler.is_enabled():
            faulthandler.enable(file=self.real, all_threads=True)

    # --- the reader ---------------------------------------------------------------------------------
    def _run(self) -> None:
        why = "its reader ended"
        try:
            while self._step():
                pass
        except BaseException as exc:  # (whatever it is, fd 2 must go back)
            why = f"its reader failed ({type(exc).__name__}: {exc})"
        finally:
            self.give_up(why)
            with self._cond:  # what it had read and not routed goes out as it came
                rest, self._unrouted, self._partial = self._unrouted, b"", b""
            with contextlib.suppress(OSError):
                _write_all(self.real, rest)
            with self._cond:
                self.routing = False
                self._cond.notify_all()
            self._forward_rest()

    def _step(self) -> bool:
        """Wait for the pipe (or a partial line's time), route what came; False at end of file."""
        # (Only this thread changes the partial line.)
        partial_left = self._partial_since + PARTIAL_WAIT_S - time.monotonic()
        self._poll.poll(None if not self._partial else max(0, round(partial_left * 1000)))
        with self._cond:
            try:
                data = os.read(self._read, _CHUNK)
            except BlockingIOError:
                data = None
            self._unrouted = self._partial + (data or b"")
            lines = self._split(data)
            pending = self._pending()
        self._route(lines)
        with self._cond:
            self._unrouted = self._partial
        if pending > self.capacity * 3 // 4:
            self.give_up(f"it fell behind ({pending} bytes waiting)")
        return data != b""

    def _split(self, data: bytes | None) -> list[bytes]:
        """Complete lines out of the partial one and `data` (None: nothing came in time; b"": end)."""
        now = time.monotonic()
        if data:
            self._read_bytes += len(data)
            if not self._partial:
                self._partial_since = now
            *lines, self._partial = (self._partial + data).split(b"\n")
            lines = [line + b"\n" for line in lines]
            if lines and self._partial:  # what is left started with this read
                self._partial_since = now
        else:
            lines = []
        if self._partial and (
            not data or len(self._partial) >= MAX_LINE or now - self._partial_since >= PARTIAL_WAIT_S
        ):
            lines.append(self._partial)
            self._partial = b""
        return [cut for line in lines for cut in _cuts(line)]

    def _pending(self) -> int:
        buf = fcntl.ioctl(self._read, termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", buf)[0])

    def _route(self, lines: list[bytes]) -> None:
        routes = self.routes
        out = []
        for line in lines:
            route = next((r for r in routes if _safe_claims(r, line)), None)
            if route is None:
                out.append(line)
            elif route.sink is not None:
                try:
                    self._sinks.put_nowait((route.sink, line))
                    with self._cond:
                        self._queued += 1
                except queue.Full:
                    out.append(line)
        if out:
            _write_all(self.real, b"".join(out))
        with self._cond:
            self._routed_bytes += sum(len(line) for line in lines)
            self._cond.notify_all()

    def _forward_rest(self) -> None:
        """After giving up: what is still written to the pipe (a child's stderr) goes on unrouted."""
        os.set_blocking(self._read, True)
        while True:
            try:
                data = os.read(self._read, _CHUNK)
            except OSError:
                return
            if not data:
                return
            with contextlib.suppress(OSError):
                _write_all(self.real, data)

    # --- the sinks ----------------------------------------------------------------------------------
    def _deliver(self) -> None:
        while True:
            sink, line = self._sinks.get()
            try:
                sink(line)
            except Exception:  # (a sink's failure must not lose the line)
                with contextlib.suppress(OSError):
                    _write_all(self.real, line)
            with self._cond:
                self._delivered += 1
                self._cond.notify_all()

    # --- what the rest of the process asks ----------------------------------------------------------
    def settle(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until all written to fd 2 so far was routed and delivered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            routed = self.routing  # (once the reader stopped, what is in the pipe goes out unrouted)
            if routed:
                target = self._read_bytes + self._pending()
                routed = self._cond.wait_for(
                    lambda: self._routed_bytes >= target or not self.routing, deadline - time.monotonic()
                )
            queued = self._queued  # and what it handed to the sinks is in them
            delivered = self._cond.wait_for(lambda: self._delivered >= queued, deadline - time.monotonic())
            return routed and delivered

    def _owns_fd_2(self) -> bool:
        """Whether fd 2 is still this pipe (someone may have put another file there since)."""
        try:
            fd_2, pipe = os.fstat(2), os.fstat(self._read)
        except OSError:
            return False
        return (fd_2.st_dev, fd_2.st_ino) == (pipe.st_dev, pipe.st_ino)

    def give_up(self, why: str) -> None:
        """fd 2 back to the real stderr, for good (where it is still the pipe)."""
        with _INSTALL:
            if self.direct:
                return
            self.direct = True
            if not self._owns_fd_2():
                return
            os.dup2(self.real, 2)
        with contextlib.suppress(OSError):
            _write_all(self.real, f"native stderr router: {why}: stderr goes straight out now\n".encode())

    def exit(self) -> None:
        """At interpreter exit: fd 2 back, and what is in the pipe routed and written out."""
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with _INSTALL:
            if self.direct:
                return
            self.direct = True
            if self._owns_fd_2():
                os.dup2(self.real, 2)  # the pipe's last writer here: the reader reads to its end
        self.settle(EXIT_DRAIN_S)


def _safe_claims(route: Route, line: bytes) -> bool:
    try:
        return bool(route.claims(line))
    except Exception:  # (a route that cannot tell does not claim)
        return False


def _cuts(line: bytes) -> list[bytes]:
    return [line[i : i + MAX_LINE] for i in range(0, len(line), MAX_LINE)] or [line]


_INSTALL = threading.RLock()
_ROUTER: _Router | None = None
_PERMANENT: list[Route] = []  # kept_routed: a router installed later (a forked child's) starts with them


def install() -> _Router | None:
    """The process's router, installed on first call (None where fd 2 cannot be routed)."""
    global _ROUTER
    with _INSTALL:
        if _ROUTER is None:
            try:
                _ROUTER = _Router()
            except (OSError, RuntimeError):  # no descriptor, or no thread to spare: stderr as it is
                return None
            atexit.register(_ROUTER.exit)
        return _ROUTER


def _forget_in_child() -> None:
    # A forked child has no reader thread: it writes into the parent's pipe (still forwarded) and
    # installs its own router on first use.
    global _ROUTER, _INSTALL
    _ROUTER, _INSTALL = None, threading.RLock()


os.register_at_fork(after_in_child=_forget_in_child)


def real_stderr() -> int:
    """A descriptor of the real stderr (fd 2 itself where no router is installed)."""
    router = _ROUTER
    return router.real if router is not None else 2


def add_route(noise: Noise, sink: Sink | None) -> Route | None:
    """Route lines matching `noise` to `sink` (None: dropped) from now on; None if not routable."""
    router = install()
    if router is None:
        return None
    route = Route(_claims(noise), sink)
    with _INSTALL:
        router.routes = (*router.routes, route)
    return route


def keep_routed(noise: Noise, sink: Sink | None) -> None:
    """Route lines matching `noise` to `sink` for the life of the process (and of its forks)."""
    route = Route(_claims(noise), sink)
    with _INSTALL:
        _PERMANENT.append(route)
        router = _ROUTER
        if router is not None:
            router.routes = (*router.routes, route)
    install()


def settle(timeout: float = SETTLE_S) -> bool:
    """Wait (at most `timeout` s) until what was written to fd 2 so far reached its route: a line a
    native call printed is in its sink once the call returned and this did."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    router = _ROUTER
    return router is not None and router.settle(timeout)


def remove_route(route: Route | None) -> None:
    """Stop routing to `route`, once what was written before is routed (at most SETTLE_S)."""
    router = _ROUTER
    if route is None or router is None:
        return
    settle()
    with _INSTALL:
        router.routes = tuple(r for r in router.routes if r is not route)


@contextlib.contextmanager
def routed(noise: Noise, sink: Sink | None) -> Iterator[None]:
    """Lines matching `noise` written while the block runs (by any thread) go to `sink`."""
    route = add_route(noise, sink)
    try:
        yield
    finally:
        remove_route(route)


def filtered_stderr(
    noise: Noise, noise_to: list[bytes] | None = None
) -> contextlib.AbstractContextManager[None]:
    """Run the block with the lines that are noise (starting with one of `noise`, or matching it where
    it is a pattern) kept off stderr, into `noise_to` where given; every other line goes on at once."""
    return routed(noise, None if noise_to is None else noise_to.append)
