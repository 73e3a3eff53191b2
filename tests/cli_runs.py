"""The `edge-agent` console script run as a user runs it: a real subprocess of the installed script.

`edge_agent` hands back the finished process for a test to judge (exit status, stdout, stderr);
`cli` checks the exit status and that no traceback leaked, and returns what was printed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.agent_process import EDGE_AGENT

TIMEOUT_S = 120  # generous: a busy machine starts the CLI slowly


def edge_agent(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # The example config reads these; keep the host's values out of the results.
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")}
    return subprocess.run(
        [EDGE_AGENT, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=cwd,
        check=False,
    )


def cli(*args: str, expect: int = 0, env: dict[str, str] | None = None, timeout: float = 180) -> str:
    """Run `edge-agent ARGS`; check the exit status and that no traceback leaked; return stdout.

    A wide terminal keeps rich from wrapping table cells, so rows can be read line by line."""
    done = subprocess.run(
        [EDGE_AGENT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"exit {done.returncode}, wanted {expect}:\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    return done.stdout if expect == 0 else output


def cli_json(*args: str, **kwargs: Any) -> Any:
    return json.loads(cli(*args, "--json", **kwargs))
