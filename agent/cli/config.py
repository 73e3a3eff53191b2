"""`edge-agent config validate|diff|schema`: check agent.yaml files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.cli.common import echo_json, load, starting, user_errors
from agent.cli.options import JsonOption
from agent.errors import ConfigError, EdgeAgentError

config_app = typer.Typer(help="Check agent.yaml files.", no_args_is_help=True)


@config_app.command("validate")
def config_validate(
    file: Annotated[Path, typer.Argument(help="The agent.yaml to check.")],
    as_json: JsonOption = False,
) -> None:
    """Print OK, or every problem as file:line: key.path: message (exit 1).

    The labels that zones, lines and home_automation.watch name are checked against the model's own
    where the model is at hand (a model file, or a version in the local store); where it is not, a
    note says so."""
    from agent.label_check import check_config

    with user_errors(as_json):
        with starting():
            cfg = load(file)
        labels = check_config(cfg)
        if labels.problems:
            raise ConfigError(labels.problems, hint="; ".join(dict.fromkeys(labels.hints)))
    summary = f"{len(cfg.pipelines)} pipeline(s), device {cfg.device.id}"
    if as_json:
        echo_json(
            {
                "ok": True,
                "file": str(file),
                "device": cfg.device.id,
                "pipelines": len(cfg.pipelines),
                "labels_unchecked": labels.unchecked,
            }
        )
        return
    typer.echo(f"OK: {file} ({summary})")
    for note in labels.unchecked:
        typer.echo(f"note: {note}")


@config_app.command("diff")
def config_diff(
    file: Annotated[Path, typer.Argument(help="The edited agent.yaml.")],
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="The config to compare with (default: the one the daemon last ran, "
            "<state_dir>/config/last-good.yaml of FILE's state_dir).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """What `systemctl reload edge-agent` would change: pipelines added, removed, changed (each key
    as old -> new) and unchanged (they run on untouched), settings applied at once, settings that
    need a restart. Secrets are never shown (passwords stay masked); long values are shortened.
    Exit 1 when FILE is invalid."""
    from agent.config_loader import read_config
    from agent.reload import LastGoodConfig, plan_reload

    with user_errors(as_json):
        _, new = read_config(file)
        if against is not None:
            _, running = read_config(against)
            compared = str(against)
        else:
            last_good = LastGoodConfig(new.state_dir)
            found = last_good.load()
            if found is None:
                raise EdgeAgentError(
                    f"no config the daemon ran is on record: {last_good.path} is missing or invalid",
                    hint="the daemon keeps one once it has run; compare two files with --against FILE",
                )
            running, compared = found[1], str(last_good.path)
    plan = plan_reload(running, new)
    if as_json:
        echo_json({"ok": True, "file": str(file), "against": compared, **plan.to_dict()})
        return
    typer.echo(f"{file} against {compared}:")
    for line in plan.lines():
        typer.echo(f"  {line}")


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of agent.yaml (for editors such as yaml-language-server)."""
    from agent.config_loader import config_json_schema

    echo_json(config_json_schema())
