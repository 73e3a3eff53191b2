"""`edge-agent`: run, validate, publish and inspect. A thin layer over `agent/` and the operator's
tools (agent/tools/): one module per noun (run, config, registry, models, backends, infer, source,
status, watch, doctor, fleet, web), the options they share in options.py, and what people read (tables, text)
in render/; `--json` prints machine-readable output for scripts.

Every command maps the agent's typed errors to a one-line message (plus hint) and exit 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from agent import __version__
from agent.cli import backends, doctor, infer, run, source, status, watch
from agent.cli.config import config_app
from agent.cli.fleet import fleet_app
from agent.cli.models import models_app
from agent.cli.registry import registry_app
from agent.cli.web import web_app

app = typer.Typer(
    help="edge-agent: run ML pipelines on edge boxes and report over MQTT.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"edge-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    _version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """edge-agent: run ML pipelines on edge boxes and report over MQTT."""


def version() -> None:
    """Print the agent's version."""
    typer.echo(__version__)


# In this order: `edge-agent --help` lists them so.
app.add_typer(config_app, name="config")
app.add_typer(registry_app, name="registry")
app.add_typer(models_app, name="models")
app.add_typer(fleet_app, name="fleet")
app.add_typer(web_app, name="web")
app.command("status")(status.status)
app.command()(watch.watch)
app.command()(run.run)
app.command()(backends.providers)
app.command()(backends.explain)
app.command()(backends.bench)
app.command()(infer.infer)
app.command()(source.source)
app.command()(doctor.doctor)
app.command()(version)


def main() -> None:
    app()
