"""`edge-agent run`: the daemon, until SIGTERM/SIGINT (or --duration); SIGHUP reloads the config."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Annotated

import typer

from agent.cli.common import starting, user_errors
from agent.cli.options import DEFAULT_CONFIG, ConfigOption
from agent.logfmt import LOG_LEVELS, setup_logging


def run(
    config: ConfigOption = DEFAULT_CONFIG,
    duration: Annotated[
        float | None, typer.Option("--duration", min=0, help="Stop after this many seconds.")
    ] = None,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="debug, info, warning or error (overrides the config).")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="text or json (JSON lines; overrides the config).")
    ] = None,
) -> None:
    """Run every pipeline until SIGTERM/SIGINT (or --duration), then stop gracefully. SIGHUP
    (systemctl reload) re-reads the config and applies what changed; on an invalid config the last
    good one runs (docs/operations.md, Reload)."""
    # Everything the daemon creates (the state dir, outbox, status, store) is for its user only.
    os.umask(0o077)
    if log_format not in (None, "text", "json"):
        raise typer.BadParameter(f"--log-format is text or json, not {log_format!r}")
    if log_level is not None:
        if log_level.lower() not in LOG_LEVELS:
            raise typer.BadParameter(
                f"--log-level is {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}, not {log_level!r}"
            )
        log_level = log_level.lower()
    setup_logging(log_level or "info", "json" if log_format == "json" else "text")  # (the fallback logs)
    with starting():
        from agent.reload import load_for_run

        with user_errors():
            loaded = load_for_run(config)
        setup_logging(
            log_level or loaded.config.log_level,
            loaded.config.log_format if log_format is None else "json" if log_format == "json" else "text",
        )
        from agent.daemon import Agent, hold_state_dir
        from agent.self_update import boot

    with user_errors():  # a second daemon on the state dir must not touch its releases either
        held = hold_state_dir(loaded.config.state_dir)  # dropped by exec (close-on-exec)
    try:
        boot(loaded.config.state_dir)  # runs the release desired state installed (exec), or returns
    finally:
        held.release()

    stop, reload = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("agent").info("received %s", signal.Signals(signum).name)
        stop.set()

    def on_hangup(_signum: int, _frame: object) -> None:
        logging.getLogger("agent").info("received SIGHUP: reloading %s", config)
        reload.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)  # now: its default action would end the process
    with user_errors():
        agent = Agent(loaded.config, loaded, log_level_from_cli=log_level)
        agent.run(stop, duration_s=duration, reload=reload)
    if agent.exit_code:  # self-update: systemd starts it again, into the release (or back)
        raise typer.Exit(agent.exit_code)
    failures = agent.none_ran()
    if failures:  # e.g. `run --duration` in a script: every pipeline failing is not a success
        for line in failures:
            typer.echo(f"error: no pipeline ran: {line}", err=True)
        raise typer.Exit(1)
