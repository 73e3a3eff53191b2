"""A helper program whose standard output carries a stream: arecord's PCM for live audio,
gst-launch-1.0's frames for GStreamer camera pipelines.

Reads are bounded in time (a stalled camera or sound card must not hang the source thread), and
the program's last lines on standard error are kept: they say why it failed ("audio open error:
No such file or directory", "no element nvarguscamerasrc").
"""

from __future__ import annotations

import collections
import os
import re
import selectors
import shutil
import subprocess
import threading
import time

from agent.errors import EdgeAgentError

# Whitespace and #-comments, then a word, then the one whitespace byte that ends it.
_TOKEN = re.compile(rb"(?:\s|#[^\n]*\n)*(\S+)\s")


class ChildStream:
    """Runs `argv` and reads its standard output; `close()` ends it (terminate, then kill)."""

    def __init__(self, argv: list[str], install_hint: str, chatter: tuple[str, ...] = ()) -> None:
        """`chatter`: beginnings of standard-error lines that say nothing about failures (banners)."""
        program = shutil.which(argv[0])
        if program is None:
            raise EdgeAgentError(f"{argv[0]} is not installed ({install_hint})")
        self._process = subprocess.Popen(
            [program, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the terminal goes to the daemon, which ends us
        )
        assert self._process.stdout is not None and self._process.stderr is not None
        self._stdout = self._process.stdout.fileno()
        self._buffer = bytearray()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=3)  # the last lines say why
        self._chatter = chatter
        self._stderr_thread = threading.Thread(
            target=self._collect_stderr, name=f"stderr-{argv[0]}", daemon=True
        )
        self._stderr_thread.start()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout, selectors.EVENT_READ)
        self.failure: str | None = None  # why the last read came back short

    def read_exact(self, size: int, timeout: float) -> bytes | None:
        """`size` bytes, or None (with `failure` set) when the program ends or sends nothing for
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while len(self._buffer) < size:
            if not self._fill(deadline, timeout):
                return None
        chunk = bytes(self._buffer[:size])
        del self._buffer[:size]
        return chunk

    def read_token(self, timeout: float, limit: int = 64) -> bytes | None:
        """The next whitespace-separated word (for text headers such as PPM's), skipping `#` comments
        and the one whitespace byte after it."""
        deadline = time.monotonic() + timeout
        while True:
            match = _TOKEN.match(self._buffer)  # matches in place: no copy of a frame-sized buffer
            if match is not None:
                token = match.group(1)
                del self._buffer[: match.end()]
                return token
            if len(self._buffer) > limit and not self._buffer[:limit].strip().startswith(b"#"):
                self.failure = f"unexpected output: {bytes(self._buffer[:limit])!r}..."
                return None
            if not self._fill(deadline, timeout):
                return None

    def _fill(self, deadline: float, timeout: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._selector.select(remaining):
            self.failure = f"sent nothing for {timeout:g} s"
            return False
        data = os.read(self._stdout, 1 << 20)
        if not data:
            self.failure = self._exit_text()
            return False
        self._buffer += data
        return True

    def _exit_text(self) -> str:
        try:
            code = self._process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "closed its output"
        self._stderr_thread.join(timeout=1.0)
        said = " / ".join(self._stderr_tail)
        if code == 0:
            ended = "ended"  # of its own accord: gst-launch at the end of the stream
        else:
            ended = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return ended + (f": {said}" if said else "")

    def said(self, text: str) -> str | None:
        """The last line on standard error that contains `text`, if any."""
        return next((line for line in reversed(self._stderr_tail) if text in line), None)

    def _collect_stderr(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            line = raw.decode(errors="replace").strip()
            if line and not line.startswith(self._chatter):
                self._stderr_tail.append(line)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=2.0)
        self._selector.close()
        assert self._process.stdout is not None and self._process.stderr is not None
        self._process.stdout.close()
        self._stderr_thread.join(timeout=1.0)  # it ends at the pipe's end, now the program is gone
        if not self._stderr_thread.is_alive():  # (a grandchild may still hold it open: leave it then)
            self._process.stderr.close()
