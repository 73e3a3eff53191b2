"""Options every `edge-agent` command module shares (agent/cli.py and its siblings)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_CONFIG = Path(os.environ.get("EDGE_AGENT_CONFIG", "/etc/edge-agent/agent.yaml"))

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="Agent config file (env EDGE_AGENT_CONFIG).", show_default=True)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="State directory (default: from the config).")
]
