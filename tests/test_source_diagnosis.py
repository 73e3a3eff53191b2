"""Cameras that do not work, tried as a user tries them (issue 26): `edge-agent source` on a camera
that accepts the connection and never answers says why within its --seconds, in the daemon's words
(agent/sources/diagnose.py); FFmpeg's own lines ("[tcp @ 0x...] Connection ... refused") stay off the
terminal (`source`, `doctor`) and go to the agent's log at DEBUG (`run --log-level debug`). Real
sockets on loopback, the CLI and the daemon as subprocesses."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.sources.check import DIAGNOSIS_GRACE_S
from agent.sources.diagnose import diagnose_url
from tests.agent_process import EDGE_AGENT, StartAgent
from tests.daemon_fixtures import pipeline, write_config
from tests.mosquitto import Mosquitto
from tests.waits import free_port

FFMPEG_LINE = re.compile(r"^\[[^\]\s]+ @ 0x[0-9a-fA-F]+\]", re.MULTILINE)  # as FFmpeg prints its own
STALL = "the server did not answer HTTP (no answer in time)"  # diagnose.py's words for this case
# Starting the CLI (Python, OpenCV) and ending it, on a busy 2-core machine.
START_AND_EXIT_S = 4.0


@pytest.fixture
def silent_camera() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never sends a byte: a camera whose server
    hangs. Yields the port; the connections it holds are closed afterwards."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        deadline = time.monotonic() + 300  # bounded, whatever the test does
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            held.append(connection)  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        for connection in [*held, server]:
            connection.close()


def edge_agent(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    """`edge-agent ARGS` as a user runs it: (the finished process, its wall time in seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        [EDGE_AGENT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
    )
    return done, time.monotonic() - started


@pytest.mark.slow
def test_a_camera_that_accepts_and_never_answers_is_diagnosed_within_its_seconds(
    tmp_path: Path, silent_camera: int
) -> None:
    uri = f"http://127.0.0.1:{silent_camera}/mjpeg"
    none = str(tmp_path / "none.yaml")
    done, took = edge_agent("source", uri, "--seconds", "3", "--json", "-c", none)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["received"] == 0
    # The daemon's diagnosis, in its words: what diagnose.py says of this very server.
    assert diagnose_url(uri, timeout_s=0.5) == STALL
    assert report["stats"]["error"] == f"cannot open url source {uri}: {STALL}", report
    assert report["stats"]["state"] == "retrying"
    # Within its 3 s, plus the grace for a diagnosis just ending; and no long wait after it.
    assert report["seconds"] <= 3 + DIAGNOSIS_GRACE_S, report
    assert took < 3 + DIAGNOSIS_GRACE_S + START_AND_EXIT_S, took
    assert "Traceback" not in done.stderr and not FFMPEG_LINE.search(done.stderr), done.stderr

    done, took = edge_agent("source", uri, "--seconds", "3", "-c", none)  # the same for people
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == f"source: {uri} (url), retrying"
    assert f"error: cannot open url source {uri}: {STALL}" in done.stderr.splitlines(), done.stderr
    assert took < 3 + DIAGNOSIS_GRACE_S + START_AND_EXIT_S, took


@pytest.mark.slow
def test_ffmpegs_own_lines_stay_off_the_terminal_of_source_and_doctor(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    uri = f"rtsp://127.0.0.1:{port}/x"
    refused = f"connection refused by 127.0.0.1:{port}: nothing listens there (wrong port, or service off)"
    done, _ = edge_agent("source", uri, "--seconds", "2", "-c", str(tmp_path / "none.yaml"))
    assert done.returncode == 1
    assert f"error: cannot open url source {uri}: {refused}" in done.stderr.splitlines(), done.stderr
    assert not FFMPEG_LINE.search(done.stdout + done.stderr), done.stderr

    config = tmp_path / "agent.yaml"
    settings = {
        "device": {"id": "box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": free_port()},
        "registry": {"url": f"file://{tmp_path}/registry"},
        "pipelines": [pipeline("door", uri)],
    }
    config.write_text(yaml.safe_dump(settings))
    done, _ = edge_agent("doctor", "-c", str(config), "--timeout", "2", "--json")
    assert "Traceback" not in done.stderr and not FFMPEG_LINE.search(done.stderr), done.stderr
    [check] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "source:door"]
    assert check["status"] == "FAIL" and check["detail"].endswith(f"cannot open url source {uri}: {refused}")


def test_ffmpegs_lines_are_in_the_agents_log_at_debug(
    tmp_path: Path, mosquitto: Mosquitto, registry_dir: Path, start_agent: StartAgent
) -> None:
    port = free_port()
    uri = f"rtsp://admin:hunter2@127.0.0.1:{port}/stream"
    config = write_config(tmp_path, mosquitto.port, registry_dir, [pipeline("dead-camera", uri)])
    agent = start_agent(config, "--log-level", "debug")
    ffmpeg = re.compile(
        r"^\S+ \S+ DEBUG agent\.sources\.video: source dead-camera: FFmpeg: \[tcp @ 0x[0-9a-f]+\] "
        rf"Connection to tcp://127\.0\.0\.1:{port}\S* failed: Connection refused$",
        re.MULTILINE,
    )
    diagnosis = f"connection refused by 127.0.0.1:{port}: nothing listens there"
    log = agent.run_until(
        lambda: ffmpeg.search(agent.log()) and diagnosis in agent.log(),
        "FFmpeg's line and the diagnosis",
        timeout=60,
    )
    assert not FFMPEG_LINE.search(log), log[-3000:]  # only inside the agent's own log lines
    said = [line for line in log.splitlines() if diagnosis in line]
    assert said and all(" WARNING agent.sources.video: source dead-camera: cannot open" in s for s in said), (
        said
    )
    assert "hunter2" not in log
