"""`edge-agent run` as a subprocess, as a user or systemd runs it, for the end-to-end tests.

Its output goes to a file, not a pipe: a run that logs a lot never blocks on a full pipe while
the test waits. Tests run it until something they can see has happened (`run_until`), then stop
it with SIGTERM as systemd does; a fixed `--duration` would be too short on a busy machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.control import NotRunning, ask, socket_path
from tests.waits import wait_until

EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")
# Long enough for a pull, a backend selection and a warm-up on a busy 2-core machine.
RUN_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 120.0  # a graceful stop: sources, in-flight frames, outbox flush, `offline`


def read_status(state_dir: Path) -> dict[str, Any]:
    """The running daemon's status, asked over its control socket (fresh, as `edge-agent status`
    gets it); once it has stopped (or before the socket is up), its status.json (rewritten every
    5 s and at the stop); {} until there is one."""
    with contextlib.suppress(NotRunning):
        fresh: dict[str, Any] = ask(socket_path(state_dir), "status", timeout=10)["status"]
        return fresh
    with contextlib.suppress(OSError, ValueError):
        status: dict[str, Any] = json.loads((state_dir / "status.json").read_text())
        return status
    return {}


def cli_step_status(config: Path, pipeline: str, step: str) -> dict[str, Any] | None:
    """What `edge-agent status -c CONFIG --json` shows of one step of a pipeline (`steps.<step>`: the
    motion gate's, the attributes'...), as an operator reads it; None while the command fails (the
    daemon not up yet) or the step shows nothing."""
    command = [EDGE_AGENT, "status", "-c", str(config), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return None
    shown: dict[str, Any] | None = json.loads(done.stdout)["pipelines"][pipeline].get("steps", {}).get(step)
    return shown


def pipeline_state(state_dir: Path, pipeline: str) -> str | None:
    """A pipeline's state in status.json ("starting", "running", "finished", ...); None before."""
    state = read_status(state_dir).get("pipelines", {}).get(pipeline, {}).get("state")
    return str(state) if state is not None else None


class AgentProcess:
    def __init__(
        self, config: Path, args: tuple[str, ...], log_path: Path, env: dict[str, str] | None
    ) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [EDGE_AGENT, "run", "-c", str(config), *args],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )  # fmt: skip

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def finish(self, timeout: float = EXIT_TIMEOUT_S, exit_codes: tuple[int, ...] = (0,)) -> str:
        """Wait for the agent to exit 0 (or one of `exit_codes`; after --duration or a signal) and
        return its log."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"edge-agent did not exit within {timeout} s:\n{self.log()[-4000:]}"
            ) from None
        log = self.log()
        assert self.proc.returncode in exit_codes, f"edge-agent exited {self.proc.returncode}:\n{log[-4000:]}"
        assert "Traceback" not in log, log[-4000:]
        return log

    def stop(self, timeout: float = EXIT_TIMEOUT_S, exit_codes: tuple[int, ...] = (0,)) -> str:
        """SIGTERM, as systemd stops it; waits for a clean exit and returns the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.finish(timeout, exit_codes)

    def run_until(
        self,
        condition: Callable[[], object],
        what: str,
        timeout: float = RUN_TIMEOUT_S,
        exit_codes: tuple[int, ...] = (0,),
    ) -> str:
        """Let the agent run until `condition()` holds, then stop it (SIGTERM); returns the log."""
        wait_until(
            lambda: condition() or self.proc.poll() is not None,
            what,
            timeout=timeout,
            interval=0.1,
            state=lambda: "; agent log:\n" + self.log()[-3000:],
        )
        if self.proc.poll() is not None:
            raise AssertionError(
                f"edge-agent exited ({self.proc.returncode}) before {what}:\n{self.log()[-4000:]}"
            )
        return self.stop(exit_codes=exit_codes)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


StartAgent = Callable[..., AgentProcess]


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[StartAgent]:
    """`start_agent(config, *args, env=None)` -> a running `AgentProcess`; killed after the test if up."""
    started: list[AgentProcess] = []

    def start(config: Path, *args: str, env: dict[str, str] | None = None) -> AgentProcess:
        agent = AgentProcess(config, args, tmp_path / f"agent-{len(started) + 1}.log", env)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()
