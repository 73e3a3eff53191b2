"""`edge-agent watch [PIPELINE]`: what the box publishes, live, off its broker with the config's
`mqtt:` settings (agent/tools/watch.py): a line per result, event, status and state message (drawn by
agent/cli/render/watch.py), or with --json one JSON object per line (JSON Lines); --events: the
tracking events alone."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from agent.cli.common import load, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption


def watch(
    pipeline: Annotated[
        str | None, typer.Argument(help="Only this pipeline's results and state (default: all of them).")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON object per line (JSON Lines): topic, kind, pipeline, retained, received_at, "
            "bytes and the payload.",
        ),
    ] = False,
    seconds: Annotated[
        float, typer.Option("--seconds", min=0, help="Stop after this many seconds (0: until Ctrl-C).")
    ] = 0.0,
    count: Annotated[
        int, typer.Option("--count", min=0, help="Stop after this many messages (0: until Ctrl-C).")
    ] = 0,
    events: Annotated[
        bool,
        typer.Option(
            "--events",
            help="Only tracking events (new, enter, exit, dwell, cross, overcrowded, end, update): "
            "no results, status or state.",
        ),
    ] = False,
) -> None:
    """Show what the box publishes, live: its results, events, status and state topics.

    Read off the box's broker with the config's mqtt settings (login, TLS), one line per message
    as it arrives; stop with Ctrl-C, --seconds or --count. A tracking event's line starts with its
    zone or line, e.g. `door-cam: line door in: cross person #4 (count 3)`, and ends with the
    message's number in brackets (seq 48); #4 is the object's id. Exit 1 when the broker cannot be
    reached or refuses the login."""
    from agent.cli.render.watch import line, styled
    from agent.tools.watch import Seen, Watch

    with user_errors(as_json):
        box = Watch(load(config), pipeline, events)
        box.start()
    typer.echo(f"watching {', '.join(box.filters)} on {box.broker} (Ctrl-C to stop)", err=True)

    console = None
    if not as_json and sys.stdout.isatty():
        from rich.console import Console

        console = Console(highlight=False)

    def show(seen: Seen) -> None:
        if as_json:
            typer.echo(json.dumps(seen.to_dict(), separators=(",", ":"), default=str))
        elif console is not None:
            console.print(styled(seen), soft_wrap=True)
        else:
            typer.echo(line(seen))  # click flushes each line: a pipe gets it at once

    try:
        with user_errors(as_json):
            box.run(show, seconds, count)
    except KeyboardInterrupt:
        pass
    finally:
        box.close()
