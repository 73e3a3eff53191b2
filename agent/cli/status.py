"""`edge-agent status`: what the running daemon is doing, asked over its control socket
(agent/control.py): uptime, each pipeline's state, rate, latency, drops, model, backend and why,
the outbox, the broker link, the config and the fleet documents. `--watch` keeps it live; the
picture is drawn by agent/cli/render/status.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from agent.cli.options import DEFAULT_CONFIG, ConfigOption, StateDirOption
from agent.cli.render.status import console, render
from agent.control import NotRunning, ask, socket_path


def status(
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: the whole status.")] = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="A live table until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
    count: Annotated[
        int, typer.Option("--count", min=0, help="With --watch: stop after this many refreshes (0: never).")
    ] = 0,
) -> None:
    """Ask the running daemon what it is doing. Exit 1 when none runs on the state dir."""
    from agent.reload import state_dir_of

    where = socket_path(state_dir or state_dir_of(config))
    if not watch:
        try:
            reply = ask(where, "status")
        except NotRunning as exc:
            _fail(str(exc), as_json)
        if as_json:
            typer.echo(json.dumps(reply["status"], indent=2, default=str))
        else:
            console().print(render(reply["status"]))
        return
    _watch(where, interval, count, as_json)


def _fail(message: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"ok": False, "error": message}))
    else:
        typer.echo(f"error: {message}", err=True)
        typer.echo("hint: systemctl start edge-agent (or edge-agent run -c CONFIG)", err=True)
    raise typer.Exit(1)


def _watch(where: Path, interval: float, count: int, as_json: bool) -> None:
    """Refresh every `interval` s; a daemon that goes away (a restart) shows as such, then returns."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    shown = 0
    with Live(Text("asking the daemon..."), console=console(), auto_refresh=False) as live:
        try:
            while True:
                try:
                    data = ask(where, "status")["status"]
                    if as_json:
                        live.console.print_json(json.dumps(data, default=str))
                    else:
                        live.update(render(data), refresh=True)
                except NotRunning as exc:
                    live.update(Group(Text(f"{time.strftime('%H:%M:%S')} {exc}", style="red")), refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
