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

    from providers.select import spare_core_note

    unlock = any(c.unlock for c in candidates)
    columns = ["backend", "artifact", "verdict", "median ms", "spread ms", "precision", "max diff", "reason"]
    table = Table(*columns, *(["would pass with"] if unlock else []))
    for c in candidates:
        row = [
            c.backend,
            c.artifact,
            c.verdict,
            num(c.median_ms),
            num(c.spread_ms),
            c.precision or "",
            num(c.max_abs_diff, ".2g"),
            "; ".join(part for part in (c.reason, spare_core_note(c)) if part),
        ]
        table.add_row(*row, *([c.unlock] if unlock else []))
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
    from rich.console import Console

    from providers import Decision
    from providers.select import CandidateReport

    console = Console()
    for record in records:
        title = f"[bold]{record['pipeline'] or record['model']}[/bold]" + (
            f" ({record['model']})" if record["pipeline"] else ""
        )
        if record.get("attribute"):  # a second model of the pipeline (its `attributes:`)
            attribute = f"attribute [bold]{record['attribute']}[/bold]"
            title = f"[bold]{record['pipeline']}[/bold] {attribute} ({record['model']})"
        if "error" in record:
            left = "left out, the pipeline serves without it" if record.get("live") else "not to be had here"
            console.print(f"{title}: {left}")
            console.print(f"  {record['error']}", markup=False)
            continue
        if "decision" not in record and "refused" not in record:  # the daemon's word, no record of its choice
            serving = record.get("serving") or {}
            console.print(
                f"{title}: serving now on {serving.get('backend')}, precision {serving.get('precision')}"
            )
            if serving.get("why"):
                console.print(f"  {serving['why']}", markup=False)
            continue
        if "refused" in record:
            console.print(f"{title}: no backend serves it")
            console.print(f"  {record['refused']}", markup=False)
            candidates = [CandidateReport(**c) for c in record["candidates"]]
            console.print(candidate_table(candidates))
            continue
        decision = Decision.from_dict(record["decision"])
        serving = record.get("serving") or {}
        backend = serving.get("backend") or decision.backend
        artifact = serving.get("artifact") or decision.artifact
        precision = serving.get("precision") or decision.precision
        verb = "would serve first on" if record.get("prospective") else "runs on"
        if record.get("live"):
            verb = "serving now on"
        console.print(
            f"{title}: {verb} {backend} on {artifact}" + (f", precision {precision}" if precision else "")
        )
        if record.get("prospective"):
            console.print(
                "  not proven yet: the daemon proves the candidates below, in this order, on the "
                "version's test data or its first frame, and switches to the fastest correct one"
            )
        elif not record.get("live") and "serving" in record:
            console.print("  the cached decision: the next start serves it at once")
        if backend != decision.backend:
            console.print(f"  on a fallback: the decision chose {decision.backend}", markup=False)
        if decision.reference:
            checked = "checked" if decision.checked else "not checked"
            console.print(f"  outputs {checked} against {decision.proof()}", markup=False)
        if decision.timing():
            console.print(f"  {decision.timing()}", markup=False)
        if decision.note:
            console.print(f"  note: {decision.note}", markup=False)
        if not decision.checked and not record.get("prospective"):
            console.print("  [bold]unchecked[/bold]: no candidate's outputs were compared with a reference")
        console.print(candidate_table(decision.candidates))


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
