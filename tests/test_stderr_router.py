"""FFmpeg's own lines (agent/sources/video.py): turned off through OpenCV's switch, so a camera open
touches nothing of the process's stderr; where the agent logs at DEBUG, captured around each open into
the log, naming the source, passwords hidden. Each case is a child Python whose real stderr is a pipe
read here, opening real cameras on loopback (one refusing, one that accepts and never answers)."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import textwrap
import time

import pytest

from agent.sources.video import ffmpeg_text
from tests.waits import free_port

# A child that opens `uri` as source "door" in a thread, with the agent's log at LEVEL to stderr as
# "LOG <level> <message>"; once a silent camera has been reached it writes a line of its own and
# waits for a line on stdin before it hangs up on the open.
OPENER = """
import json, logging, os, socket, sys, threading
import cv2
from agent.config import VideoSourceConfig
from agent.sources.frames import LatestFrameSlot
from agent.sources.video import VideoSource
logging.basicConfig(stream=sys.stderr, level=logging.{level}, format="LOG %(levelname)s %(message)s")
server = socket.create_server(("127.0.0.1", 0))
held, connected = [], threading.Event()
def accept():
    held.append(server.accept()[0])  # never answered
    connected.set()
threading.Thread(target=accept, daemon=True).start()
silent = f"http://127.0.0.1:{{server.getsockname()[1]}}/mjpeg"
params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 60000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 60000]
result = {{}}
def open_silent():
    source = VideoSource(VideoSourceConfig(type="video", uri=silent), "silent", LatestFrameSlot())
    result["silent_opened"] = source._open_ffmpeg(params).isOpened()
opener = threading.Thread(target=open_silent)
opener.start()
result["connected"] = connected.wait(30)
os.write(2, b"LIVE line while a camera opens\\n")
sys.stdin.readline()
held[0].close()  # the open ends
opener.join(60)
source = VideoSource(VideoSourceConfig(type="video", uri={uri!r}), "door", LatestFrameSlot())
result["door_opened"] = source._open_ffmpeg(params).isOpened()
result["env"] = os.environ.get("OPENCV_FFMPEG_LOGLEVEL")
print(json.dumps(result))
"""


def opener(level: str, uri: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OPENER.format(level=level, uri=uri))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    """What `fd` gives until `wanted` is among it, or AssertionError after `timeout` s."""
    got = b""
    deadline = time.monotonic() + timeout
    while wanted not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} within {timeout} s; got {got!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"end of stream before {wanted!r}; got {got!r}"
            got += chunk
    return got


def refused_uri() -> str:
    return f"rtsp://admin:hunter2@127.0.0.1:{free_port()}/stream"  # nothing listens there


def test_at_info_ffmpeg_says_nothing_and_a_stalled_open_holds_no_other_line() -> None:
    uri = refused_uri()
    process = opener("INFO", uri)
    assert process.stdin is not None and process.stderr is not None
    try:
        # Written while the silent camera's open is in progress, and seen at once: fd 2 is untouched.
        seen = read_until(process.stderr.fileno(), b"LIVE line while a camera opens\n", timeout=60)
        assert process.poll() is None
    finally:
        out, err = process.communicate(b"\n", timeout=120)
    assert process.returncode == 0, seen + err
    assert out.strip() == (
        b'{"connected": true, "silent_opened": false, "door_opened": false, "env": null}'
    )  # (the level was in the environment for the first open only)
    assert seen + err == b"LIVE line while a camera opens\n"  # not one of FFmpeg's lines


def test_at_debug_ffmpegs_lines_go_to_the_log_naming_the_source_with_passwords_hidden() -> None:
    uri = refused_uri()
    port = uri.rsplit(":", 1)[1].split("/")[0]
    process = opener("DEBUG", uri)
    out, err = process.communicate(b"\n", timeout=120)
    assert process.returncode == 0, err
    assert out.strip() == b'{"connected": true, "silent_opened": false, "door_opened": false, "env": null}'
    lines = err.decode().splitlines()
    # The other line, held while the silent camera's open was captured, went on after it.
    assert lines.count("LIVE line while a camera opens") == 1, lines
    refused = re.compile(
        r"LOG DEBUG source door: FFmpeg: \[tcp @ 0x[0-9a-f]+\] "
        rf"Connection to tcp://127\.0\.0\.1:{port}\S* failed: Connection refused"
    )
    assert [line for line in lines if refused.fullmatch(line)], lines
    assert not [line for line in lines if line.startswith("[")], lines  # none as FFmpeg writes them
    assert "hunter2" not in err.decode()


def test_an_operators_own_ffmpeg_level_is_kept_and_its_lines_stay_on_stderr() -> None:
    # OPENCV_FFMPEG_LOGLEVEL set by hand: FFmpeg says what it has to say, on stderr (OpenCV's own
    # writer would put it on stdout) and untouched by the agent at INFO.
    uri = refused_uri()
    process = opener("INFO", uri, env={"OPENCV_FFMPEG_LOGLEVEL": "16"})
    out, err = process.communicate(b"\n", timeout=120)
    assert process.returncode == 0, err
    assert out.strip() == b'{"connected": true, "silent_opened": false, "door_opened": false, "env": "16"}'
    assert b"failed: Connection refused" in err and b"] Connection to tcp://127.0.0.1:" in err, err


@pytest.mark.parametrize(
    ("line", "uri", "said"),
    [
        (
            b"[rtsp @ 0x55d0c0a1b2c0] method DESCRIBE failed for rtsp://admin:hunter2@10.0.0.7/x\n",
            "rtsp://admin:hunter2@10.0.0.7/x",
            "[rtsp @ 0x55d0c0a1b2c0] method DESCRIBE failed for rtsp://admin:***@10.0.0.7/x",
        ),
        (b"[http @ 0x1] bad http://u:secret@[::1 here\n", "rtsp://cam/x", "[http @ 0x1] bad http://*** here"),
        (b"[tcp @ 0x2] hunter2 in the text\n", "rtsp://admin:hunter2@cam/x", "[tcp @ 0x2] *** in the text"),
    ],
)
def test_ffmpegs_lines_are_logged_with_passwords_hidden(line: bytes, uri: str, said: str) -> None:
    assert ffmpeg_text(line, uri) == said
