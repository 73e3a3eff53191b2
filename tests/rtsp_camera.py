"""A real RTSP camera for the tests (tests/test_rtsp.py, test_camera_diagnostics.py): GStreamer's RTSP
server (scripts/rtsp_server.py) streaming an image as H.264 on loopback, started and killed at will."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.waits import free_port

SERVER = Path(__file__).resolve().parent.parent / "scripts" / "rtsp_server.py"


class RtspServer:
    """scripts/rtsp_server.py under Debian's python3, started and killed at will on one port."""

    def __init__(self, image: Path, *extra: str) -> None:
        """`extra`: more arguments, e.g. "--user", "cam", "--password", "s3cret"."""
        self.image = image
        self.extra = extra
        self.port = free_port()
        self.url = f"rtsp://127.0.0.1:{self.port}/stream"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", str(SERVER), "--port", str(self.port), "--image", str(self.image),
             *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens (or dies: then EOF)
        if not line.startswith("ready "):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
            pytest.fail(f"the RTSP server did not start: {line!r} {err[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
