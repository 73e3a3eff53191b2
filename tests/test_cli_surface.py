"""The CLI's surface stays what users and scripts know while its code moves: every command's
`--help`, as a person reads it at 100 columns, is compared with tests/fixtures/cli_help.txt.

A change to a command's options or help is a change to this file too: rerun with
EDGE_AGENT_UPDATE_CLI_HELP=1 to write it, and read the diff before committing it."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from agent.cli import app

SNAPSHOT = Path(__file__).parent / "fixtures" / "cli_help.txt"
ENV = {"COLUMNS": "100", "LINES": "50", "NO_COLOR": "1", "TERM": "dumb", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}


def command_paths() -> list[list[str]]:
    """Every command and group of `edge-agent`, as the words typed after it (the root is [])."""
    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        paths.append(path)
        subcommands = getattr(command, "commands", {})  # a group's (typer's own click)
        for name in sorted(subcommands):
            walk(subcommands[name], [*path, name])

    walk(root, [])
    return paths


def help_text() -> str:
    runner = CliRunner()
    parts = []
    for path in command_paths():
        result = runner.invoke(app, [*path, "--help"], env=ENV, prog_name="edge-agent")
        assert result.exit_code == 0, (path, result.output)
        body = "\n".join(line.rstrip() for line in result.output.splitlines())
        parts.append(f"=== edge-agent {' '.join(path)}".rstrip() + f" ===\n{body.strip()}\n")
    return "\n".join(parts)


def test_every_commands_help_is_as_recorded() -> None:
    text = help_text()
    if os.environ.get("EDGE_AGENT_UPDATE_CLI_HELP") == "1":
        SNAPSHOT.write_text(text)
    recorded = SNAPSHOT.read_text()
    diff = "".join(
        difflib.unified_diff(
            recorded.splitlines(keepends=True), text.splitlines(keepends=True), "recorded", "now", n=2
        )
    )
    assert not diff, f"the CLI's --help changed (EDGE_AGENT_UPDATE_CLI_HELP=1 records it):\n{diff[:6000]}"


def test_the_surface_covers_every_noun() -> None:
    paths = {" ".join(p) for p in command_paths()}
    for expected in (
        "run",
        "models validate",
        "explain",
        "infer",
        "bench",
        "fleet status",
        "config validate",
    ):
        assert expected in paths, sorted(paths)
