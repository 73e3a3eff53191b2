"""`edge-agent status --watch` with its output not a terminal (a pipe, a file): each refresh is
written and flushed as it happens, line by line (JSON Lines with --json), not held until the end.

The real CLI runs as a subprocess and asks a real control socket (agent/control.py's ControlServer,
the daemon's own) in a state dir of the test's, answering a status whose uptime grows per request.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from agent.control import ControlServer, socket_path
from tests.waits import wait_until

INTERVAL = "0.2"
TIMEOUT_S = 60.0  # the CLI's start (imports) and two refreshes on a busy 2-core machine


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, ControlServer]]:
    """A state dir whose control socket answers `status` as a running daemon does."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    asked = [0]

    def status() -> dict[str, Any]:
        asked[0] += 1
        return {
            "device": "watch-box",
            "agent_version": "0.1.0",
            "pid": 4242,
            "uptime_s": asked[0],
            "config": {"file": "/etc/edge-agent/agent.yaml"},
            "mqtt": {"connected": True, "connects": 1},
            "outbox": {"pending": 0, "dropped": 0, "when_full": "drop_oldest"},
            "fleet": {"enabled": False},
            "pipelines": {"cam": {"state": "running", "model": "det@1", "backend": "onnxruntime/cpu"}},
        }

    server = ControlServer(socket_path(state), {"status": status})
    assert server.start()
    try:
        yield state, server
    finally:
        server.stop()


def watch(state: Path, *args: str, stdout: IO[Any] | int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "status",
            "--state-dir",
            str(state),
            "--watch",
            "--interval",
            INTERVAL,
            *args,
        ],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


class Lines:
    """The lines a process writes to its stdout pipe, as they arrive (read on a thread)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._queue: queue.Queue[str] = queue.Queue()
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    def arrived(self) -> list[str]:
        while not self._queue.empty():
            self.lines.append(self._queue.get_nowait())
        return self.lines


def stop(process: subprocess.Popen[str]) -> str:
    """Kill it (as `timeout` or Ctrl-C would end a watch) and return its stderr."""
    process.kill()
    _, err = process.communicate(timeout=TIMEOUT_S)
    return err or ""


def test_watch_json_piped_writes_one_json_object_per_refresh_as_it_goes(
    daemon: tuple[Path, ControlServer],
) -> None:
    state, server = daemon
    process = watch(state, "--json")
    out = Lines(process)
    try:
        wait_until(
            lambda: len(out.arrived()) >= 2 or process.poll() is not None, "two refreshes", timeout=TIMEOUT_S
        )
        assert process.poll() is None, f"it exited ({process.returncode}) after {out.arrived()}"
        first, second = (json.loads(line) for line in out.arrived()[:2])  # each line a whole object
        assert (first["device"], first["pipelines"]["cam"]["state"]) == ("watch-box", "running")
        assert second["uptime_s"] > first["uptime_s"]  # asked again, not the same one twice

        # The daemon goes away (a restart): a line saying so, and the watch goes on.
        server.stop()
        wait_until(
            lambda: any('"ok": false' in line for line in out.arrived()),
            "the not-running line",
            timeout=TIMEOUT_S,
        )
        gone = json.loads(next(line for line in out.arrived() if '"ok": false' in line))
        assert gone["ok"] is False and "no edge-agent is running here" in gone["error"], gone
        assert process.poll() is None
    finally:
        err = stop(process)
    assert "Traceback" not in err, err


def test_watch_to_a_file_shows_each_refresh_before_it_exits(
    daemon: tuple[Path, ControlServer], tmp_path: Path
) -> None:
    """`edge-agent status --watch > f`: the file fills while the watch runs."""
    state, _ = daemon
    file = tmp_path / "watch.txt"

    def refreshes() -> list[str]:
        return [line for line in file.read_text().splitlines() if line.startswith("--- ")]

    with file.open("w") as f:
        process = watch(state, stdout=f)
    try:
        wait_until(
            lambda: len(refreshes()) >= 2 or process.poll() is not None,
            "two refreshes in the file",
            timeout=TIMEOUT_S,
            state=lambda: file.read_text(),
        )
        assert process.poll() is None, f"it exited ({process.returncode}): {file.read_text()}"
        text = file.read_text()
        assert text.count("edge-agent 0.1.0 on watch-box (pid 4242)") >= 2, text
        assert "cam" in text and "onnxruntime/cpu" in text
        assert "\x1b[" not in text  # no cursor movement or colour in a file
    finally:
        err = stop(process)
    assert "Traceback" not in err, err


def test_watch_piped_into_a_reader_that_stops_ends_quietly(daemon: tuple[Path, ControlServer]) -> None:
    """`edge-agent status --watch --json | head -1`: once the reader is gone, the watch exits 0."""
    state, _ = daemon
    process = watch(state, "--json")
    assert process.stdout is not None
    try:
        assert json.loads(process.stdout.readline())["device"] == "watch-box"
        process.stdout.close()  # head has what it wanted
        assert process.wait(timeout=TIMEOUT_S) == 0
    finally:
        err = stop(process)
    assert err == "", err
