"""`edge-agent run`'s own options: a wrong --log-level or --log-format is a usage error (exit 2,
one line naming the allowed values), never a traceback. Real `edge-agent` subprocesses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent_process import EDGE_AGENT


def edge_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--log-level", "verbose", "--log-level is debug, info, warning or error, not 'verbose'"),
        ("--log-format", "yaml", "--log-format is text or json, not 'yaml'"),
    ],
)
def test_a_wrong_log_option_is_a_usage_error(tmp_path: Path, option: str, value: str, said: str) -> None:
    done = edge_agent("run", "-c", str(tmp_path / "agent.yaml"), option, value)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = [line for line in done.stderr.splitlines() if "Invalid value" in line]
    assert f"Invalid value: {said}" in line, done.stderr


def test_a_log_level_in_capitals_is_taken(tmp_path: Path) -> None:
    # It passes the option's check: what stops this run is the missing config file.
    done = edge_agent("run", "-c", str(tmp_path / "agent.yaml"), "--log-level", "DEBUG")
    assert done.returncode == 1 and "cannot read config file" in done.stderr, done.stderr
