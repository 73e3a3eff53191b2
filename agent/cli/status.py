"""`edge-agent status`: what the running daemon is doing, asked over its control socket
(agent/control.py): uptime, each pipeline's state, rate, latency, drops, model, backend and why,
the outbox, the broker link, the config and the fleet documents. `--watch` keeps it live (piped:
a status per refresh, flushed; JSON Lines with --json); the picture is drawn by
agent/cli/render/status.py."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.cli.options import DEFAULT_CONFIG, ConfigOption, StateDirOption
from agent.cli.render.status import console, render
from agent.control import NotRunning, ask, socket_path


def status(
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: the whole status.")] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Refresh until Ctrl-C: a live table on a terminal; piped, one status per refresh "
            "(with --json: one JSON object per line).",
        ),
    ] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
    count: Annotated[
        int, typer.Option("--count", min=0, help="With --watch: stop after this many refreshes (0: never).")
    ] = 0,
) -> None:
    """Ask the running daemon what it is doing. Exit 1 when none runs on the state dir."""
    from agent.state_dir import state_dir_of

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
    """Refresh every `interval` s; a daemon that goes away (a restart) shows as such, then returns.

    On a terminal, a live table redrawn in place. Otherwise (a pipe, a file, a log), one status per
    refresh, written and flushed at once: with --json one JSON object per line (JSON Lines), else the
    status as lines under a `--- HH:MM:SS` line. Output that goes away (`| head`) ends it quietly."""
    out = console()
    show = _json_line if as_json else _live if out.is_terminal else _block
    try:
        show(out, _refreshes(where, interval, count))
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        # The reader is gone: nothing more can be shown, and the exit's own flush must not fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _refreshes(where: Path, interval: float, count: int) -> Iterator[dict[str, Any] | NotRunning]:
    """The daemon's status (or why there is none) every `interval` s, `count` times (0: forever)."""
    shown = 0
    while True:
        try:
            yield ask(where, "status")["status"]
        except NotRunning as exc:
            yield exc
        shown += 1
        if count and shown >= count:
            return
        time.sleep(interval)


def _live(out: Any, refreshes: Iterator[dict[str, Any] | NotRunning]) -> None:
    from rich.live import Live
    from rich.text import Text

    with Live(Text("asking the daemon..."), console=out, auto_refresh=False) as live:
        for data in refreshes:
            live.update(_not_running(data) if isinstance(data, NotRunning) else render(data), refresh=True)


def _block(out: Any, refreshes: Iterator[dict[str, Any] | NotRunning]) -> None:
    from rich.text import Text

    for data in refreshes:
        with out:  # buffered, written at once: a reader of the file sees whole refreshes
            if isinstance(data, NotRunning):
                out.print(_not_running(data))
            else:
                out.print(Text(f"--- {time.strftime('%H:%M:%S')}"))
                out.print(render(data))
        sys.stdout.flush()


def _json_line(out: Any, refreshes: Iterator[dict[str, Any] | NotRunning]) -> None:
    for data in refreshes:
        line = {"ok": False, "error": str(data)} if isinstance(data, NotRunning) else data
        sys.stdout.write(json.dumps(line, default=str) + "\n")
        sys.stdout.flush()


def _not_running(exc: NotRunning) -> Any:
    from rich.text import Text

    return Text(f"{time.strftime('%H:%M:%S')} {exc}", style="red")
