"""The fleet commands for people: each wave's progress (stderr), a deploy's or rollback's outcome,
and the status table of every device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer

from agent.text import clip

if TYPE_CHECKING:
    from agent.fleetctl.results import DeployResult
    from agent.fleetctl.status import DeviceStatus

PROBLEMS_SHOWN = 10  # per wave, in the human output
LINE_CHARS = 240  # a pipeline's line in the status table (reasons can be long; --json has them whole)


def print_progress(phase: str, generation: int, counts: Mapping[str, int], devices: int) -> None:
    done = ", ".join(f"{n} {o}" for o, n in counts.items() if n and o != "in-flight")
    typer.echo(
        f"{phase} wave, generation {generation}: {devices - counts.get('in-flight', 0)}/{devices} done"
        + (f" ({done})" if done else ""),
        err=True,
    )


def print_deploy_result(result: DeployResult) -> None:
    signed = f", signed by key {result.signed_by}" if result.signed_by else ""
    typer.echo(f"published {result.target} generation(s) {', '.join(map(str, result.published))}{signed}")
    for wave in result.waves:
        counts = ", ".join(f"{n} {o}" for o, n in wave.counts().items() if n) or "no devices"
        typer.echo(
            f"{wave.phase} wave, generation {wave.generation}: {counts} "
            f"({wave.failed_pct:.1f}% failed, {wave.seconds:.1f} s)"
        )
        problems = [(d, o, r) for d, (o, r) in sorted(wave.outcomes.items()) if o != "converged"]
        for device, outcome, reason in problems[:PROBLEMS_SHOWN]:
            typer.echo(f"  {device}: {outcome}: {reason}")
        if len(problems) > PROBLEMS_SHOWN:
            typer.echo(f"  ... and {len(problems) - PROBLEMS_SHOWN} more (--json lists every device)")
    typer.echo(result.message)


def print_status(devices: list[DeviceStatus], summary: str) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for column in ("device", "online", "generation (desired/reported)", "pipeline", "backend", "last seen"):
        table.add_column(column, overflow="fold")  # long ids and models wrap, never cut
    for device in devices:
        record = device.record
        online = {True: "online", False: "offline", None: "?"}[record.online]
        if device.stale is not None and record.online is not False:
            online += " (restarted, not reported since)"
        layers = "\n".join(
            f"{r.layer} {_gen(r.desired_generation)}/{_gen(r.applied_generation)}"
            + (f" {r.state}" if r.state not in (None, "applied") else "")
            for r in record.layers.values()
        )
        names = list(record.pipelines)
        lines = []
        for name in names:
            view = device.pipelines.get(name)
            text = view.text if view else record.pipelines[name].phase or "?"
            lines.append(f"{name}: {clip(text, LINE_CHARS)}")
        backends = [
            (record.pipelines[n].backend or "") if (v := device.pipelines.get(n)) and v.serving else ""
            for n in names
        ]
        table.add_row(
            *(
                Text(cell)
                for cell in (
                    record.device,
                    online,
                    layers,
                    "\n".join(lines) or (record.problem or ""),
                    "\n".join(backends),
                    record.last_seen or "",
                )
            )
        )
    console = Console()
    console.print(table)
    console.print(summary, markup=False, highlight=False)


def _gen(value: int | None) -> str:
    return "-" if value is None else str(value)
