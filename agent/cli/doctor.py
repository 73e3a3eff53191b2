"""`edge-agent doctor`: why something does not work (agent/tools/doctor/), as a table or --json."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli.common import echo_json
from agent.cli.options import DEFAULT_CONFIG, ConfigOption, JsonOption
from agent.cli.render.doctor import print_doctor
from agent.logfmt import setup_logging


def doctor(
    config: ConfigOption = DEFAULT_CONFIG,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.5, max=600, help="Seconds each network step and each source may take."
        ),
    ] = 10.0,
    as_json: JsonOption = False,
) -> None:
    """Find out why something does not work: the config, the broker login, the registry, the model
    store's integrity, every pipeline's source and backend, disk space, permissions and the clock,
    each OK, WARN or FAIL with a fix. Exit 0 when all are OK, 1 on a WARN, 2 on a FAIL."""
    from agent.tools.doctor.core import exit_code, report
    from agent.tools.doctor.run import run_doctor

    # The rows say what went wrong; the libraries' own warnings would only break up the table.
    setup_logging("error")
    checks = run_doctor(config, timeout)
    if as_json:
        echo_json(report(checks))
    else:
        print_doctor(checks)
    raise typer.Exit(exit_code(checks))
