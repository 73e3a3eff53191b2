"""What every `edge-agent` command module shares: JSON output, the agent's errors as one-line
messages (exit 1), the config loaded, and where a model is looked up."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from agent.errors import ConfigError, EdgeAgentError

if TYPE_CHECKING:  # building the config models costs a command that reads no config (--help, status)
    from agent.config import AgentConfig


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@contextmanager
def user_errors(
    as_json: bool = False, exit_code: Callable[[EdgeAgentError], int] | None = None
) -> Iterator[None]:
    """Turn the agent's errors into a clear message and exit 1, never a traceback. A command with
    exit codes of its own passes `exit_code` (the error -> its status): its JSON says the code too."""
    try:
        yield
    except EdgeAgentError as exc:
        code = 1 if exit_code is None else int(exit_code(exc))
        problems = exc.problems if isinstance(exc, ConfigError) else [exc.message]
        if as_json:
            extra = {} if exit_code is None else {"exit_code": code}
            echo_json({"ok": False, "errors": problems, "hint": exc.hint, **extra})
        else:
            for line in problems:
                typer.echo(f"error: {line}", err=True)
            if exc.hint:
                typer.echo(f"hint: {exc.hint}", err=True)
        raise typer.Exit(code) from None


@contextmanager
def starting() -> Iterator[None]:
    """A command's start: importing the agent's modules and building the config models makes tens of
    thousands of objects that live as long as the process and no garbage, and the cyclic collector's
    passes over them cost ~10% of the start (importing the daemon: 0.42 s of CPU with it, 0.37 s
    without). Off while starting; what was made is then frozen (gc.freeze): later passes skip it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def load(config_path: Path) -> AgentConfig:
    from agent.config_loader import load_config

    return load_config(config_path)


def split_ref(ref: str) -> tuple[str, str]:
    name, _, version = ref.partition("@")
    if not name or not version:
        raise EdgeAgentError(f"{ref!r} is not NAME@VERSION")
    return name, version


def model_state_dir(model: str, config: Path, state_dir: Path | None) -> Path | None:
    """Where MODEL is looked up: None for a model file, else the state dir (from the config unless given)."""
    if state_dir is not None or Path(model).is_file():
        return state_dir
    if "/" in model:  # a path, never a model name: say so, not that the config is missing
        raise EdgeAgentError(f"{model}: no such model file")
    return load(config).state_dir
