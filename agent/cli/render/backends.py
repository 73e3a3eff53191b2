"""providers, explain and bench for people: the box's backends, where each pipeline runs and why,
and the timings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent.cli.render import num

if TYPE_CHECKING:
    from rich.table import Table

    from providers.cpu_load import CpuUse
    from providers.select import CandidateReport


def candidate_table(candidates: list[CandidateReport]) -> Table:
    from rich.table import Table

    from agent.explained import candidate_rows

    columns, rows = candidate_rows(candidates)
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    return table


def print_providers(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    hw = report["hardware"]
    cpu = hw["cpu"]
    console.print(
        f"[bold]CPU[/bold] {cpu['model']} ({cpu['arch']}, {cpu['logical_cores']} threads), "
        f"flags: {', '.join(cpu['flags']) or '-'}"
    )
    if not hw["accelerators"]:
        console.print("[bold]Accelerators[/bold] none found")
    for acc in hw["accelerators"]:
        hint = f" - {acc['install_hint']}" if acc.get("install_hint") else ""
        console.print(f"[bold]Accelerator[/bold] {acc['kind']}: {acc['model']}{hint}")
    table = Table("backend", "available", "why / versions")
    for row in report["backends"]:
        versions = ", ".join(f"{k} {v}" for k, v in row["versions"].items())
        detail = versions if row["available"] else row["reason"]
        table.add_row(row["backend"], "yes" if row["available"] else "no", detail)
    console.print(table)


def print_explanation(records: list[dict[str, Any]]) -> None:
    """Each record as agent/explained.py words it (the web page's models page says the same)."""
    from rich.console import Console
    from rich.text import Text

    from agent.explained import Line, explained

    def text(line: Line) -> Text:
        return Text.assemble(*((part, "bold") if bold else part for part, bold in line))

    console = Console()
    for record in records:
        said = explained(record)
        console.print(text(said.title))
        for line in said.lines:
            console.print(Text("  ") + text(line))
        if said.candidates is not None:
            console.print(candidate_table(said.candidates))


@contextmanager
def bench_progress() -> Iterator[Callable[[str], None]]:
    """A spinner saying which backend is being timed; gone when done."""
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("benchmarking", total=None)
        yield lambda what: progress.update(task, description=what)


def print_bench(
    ref: str, runs: int, warmup: int, fed: str, rows: list[dict[str, Any]], rounds: int, cpu: CpuUse | None
) -> None:
    from rich.console import Console
    from rich.table import Table

    side_by_side = (
        f"; side by side: the median of each one's turns in {rounds} interleaved rounds, ± their spread, "
        f"while {cpu.describe()}"
        if cpu is not None
        else ""
    )
    table = Table(
        "backend",
        "artifact",
        "precision",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "runtime p50 ms",
        "side by side ms",
        "per s",
        "peak MB",
        "",
        title=f"{ref}: {runs} runs after {warmup} warm-up, on {fed}",
        caption="p50/p90/p99: wall time of each run from Python, each backend timed alone; runtime p50: the "
        "runtime's own timer (OpenVINO's, as its benchmark_app reports), where it has one" + side_by_side,
    )
    for row in rows:
        if not row["ok"]:
            table.add_row(
                row["backend"], row["artifact"], "failed", "", "", "", "", "", "", "", row["error"][:60]
            )
            continue
        table.add_row(
            row["backend"],
            row["artifact"],
            row["precision"],
            num(row["p50_ms"], ".3f"),
            num(row["p90_ms"], ".3f"),
            num(row["p99_ms"], ".3f"),
            num(row.get("compute_p50_ms"), ".3f"),
            _side_by_side(row),
            num(row["throughput_per_s"], ".1f"),
            num(row["peak_rss_mb"], ".0f"),
            "selected" if row["selected"] else "",
        )
    Console().print(table)


def _side_by_side(row: dict[str, Any]) -> str:
    if "side_by_side_ms" not in row:
        return "failed" if row.get("side_by_side_error") else ""
    return f"{row['side_by_side_ms']:.3f} ±{row['spread_ms']:.2g}"
