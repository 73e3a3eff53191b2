"""The models commands for people: the store's table, validation, check and inspect tables, and
the download bar of a pull."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent.cli.render import cut, num, plain_table, say, yes

if TYPE_CHECKING:
    from agent.store import Progress
    from agent.validate import Validation


@contextmanager
def download_bar(enabled: bool) -> Iterator[Progress | None]:
    """A progress bar per download on stderr when it is a terminal (bytes, rate, time left)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.progress import Progress as Bar

    columns = (
        "{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Bar(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks: dict[str, Any] = {}

        def show(what: str, done: int, total: int, _rate: float) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done)

        yield show


def print_validation(result: Validation) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "backend", "artifact", "loads", "runs", "correct", "max abs err", "max rel err", "ms", "precision",
        title=f"{result.model}: {len(result.test_sets)} test set(s)",
    )  # fmt: skip
    for check in result.candidates:
        errors = [e for e in check.errors if e.max_abs is not None]
        worst_abs = max((e.max_abs for e in errors if e.max_abs is not None), default=None)
        worst_rel = max((e.max_rel for e in errors if e.max_rel is not None), default=None)
        correct = {True: "yes", False: "NO", None: "-"}[check.correct]
        table.add_row(
            check.backend, check.artifact, yes(check.loads), yes(check.runs), correct,
            num(worst_abs, ".3g"), num(worst_rel, ".3g"), num(check.median_ms), check.precision,
        )  # fmt: skip
    console = Console()
    console.print(table)
    for line in [f"{c.backend} on {c.artifact}: {c.reason}" for c in result.candidates if c.reason]:
        console.print(f"  {line}", markup=False)
    for label, why in result.unfit:
        console.print(f"  test data {label}: {why}", markup=False)
    for backend, artifact, why in result.unusable:
        console.print(f"  {backend} on {artifact}: {why}", markup=False)
    kept = " (kept as the agent's decision for this model on this box)" if result.cached else ""
    console.print(f"activates: {result.activated or 'nothing'}{kept}", markup=False)


def print_inspection(info: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    version = info["version"]
    if version is not None:
        say(
            console,
            f"{info['model']} (created {version['created']}, signed by {version['signed_by'] or 'nobody'})",
        )
        if version["metadata"]:
            rows = [[key, cut(value)] for key, value in version["metadata"].items()]
            console.print(plain_table("manifest metadata", ["metadata", "value"], rows))
        # Test-data columns only where some artifact has them: 80 columns are few (a variant's
        # precision is said under its own file's heading below).
        optional = [("model_file", "for model"), ("rtol", "rtol"), ("atol", "atol")]
        extra = [(key, name) for key, name in optional if any(a[key] is not None for a in info["artifacts"])]
        columns = ["file", "format", "size", "sha256", "target", *(name for _, name in extra)]
        rows = [
            [
                a["file"],
                a["format"],
                f"{a['size']:,}",
                a["sha256"][:16],
                a["target"],
                *(a[k] for k, _ in extra),
            ]
            for a in info["artifacts"]
        ]
        console.print(plain_table("artifacts", columns, rows))
    from agent.store.listing import variant_note

    variants = {a["file"]: note for a in info["artifacts"] if (note := variant_note(a))}
    for model in info["models"]:
        _print_model_file(console, model, variants.get(model["file"]))
    for test in info["test_sets"]:
        _print_test_set(console, test)


def _print_model_file(console: Any, m: dict[str, Any], variant: str | None = None) -> None:
    from agent.model_formats import format_shape

    say(console, "")
    say(console, f"{m['file']}: {m['format']}, {m['size']:,} bytes, sha256 {m['sha256'][:16]}")
    if variant is not None:
        say(console, f"  {variant}")
    if "weights_of" in m:
        say(console, f"  the weights of {m['weights_of']}")
        return
    if m["format"] == "onnx":
        opsets = ", ".join(f"{domain or 'ai.onnx'} {v}" for domain, v in m["opsets"].items())
        producer = f"{m['producer_name']} {m['producer_version']}".strip() or "unknown"
        say(console, f"  ir_version {m['ir_version']}, producer {producer}, opsets {opsets}")
        params = f"{m['initializers']} initializers, {m['parameters']:,} parameters"
        if m["parameters_in_constants"]:
            params += f" ({m['parameters_in_constants']:,} in Constant nodes)"
        say(console, f"  {m['nodes']} nodes, {params}")
        if m["external_data"]:
            say(console, f"  external data (not read): {', '.join(m['external_data'])}")
    elif m["format"] == "tflite":
        signatures = f", signatures {', '.join(m['signatures'])}" if m["signatures"] else ""
        say(console, f"  read with {m['runtime']}{signatures}")
    else:
        say(
            console,
            f"  {m['name']}, weights {m['weights']}, {m['nodes']} nodes, {m['parameters']:,} parameters",
        )
    ports = [("input", p) for p in m["inputs"]] + [("output", p) for p in m["outputs"]]
    quantised = any(p.get("quantization") for _, p in ports)
    rows = []
    for kind, port in ports:
        row = [kind, port["name"], port["dtype"], format_shape(port["shape"])]
        q = port.get("quantization")
        if quantised:
            row.append(f"scale {cut(q['scales'], 30)}, zero point {cut(q['zero_points'], 30)}" if q else "")
        rows.append(row)
    columns = ["", "name", "dtype", "shape", *(["quantization"] if quantised else [])]
    console.print(plain_table("inputs and outputs", columns, rows))
    if m["operators"]:
        default_domain = "ai.onnx" if m["format"] == "onnx" else ""
        rows = [[op["op_type"], op["domain"] or default_domain, op["count"]] for op in m["operators"]]
        title = f"operators ({len(rows)} kinds)"
        console.print(plain_table(title, ["operator", "domain", "count"], rows))
    if m.get("operators_note"):
        say(console, f"  {m['operators_note']}")
    if m.get("metadata_props"):
        rows = [[key, cut(value)] for key, value in m["metadata_props"].items()]
        console.print(plain_table("metadata_props", ["key", "value"], rows))


def _print_test_set(console: Any, test: dict[str, Any]) -> None:
    from agent.model_formats import format_shape

    say(console, "")
    tolerances = "".join(f", {key} {test[key]}" for key in ("rtol", "atol") if test[key] is not None)
    say(console, f"test set {test['file']}: for {test['model_file'] or 'any model file it fits'}{tolerances}")
    if test["error"]:
        say(console, f"  unreadable: {test['error']}")
        return
    rows = [
        [array["name"], role, array["dtype"], format_shape(array["shape"])]
        for kind, role in (("inputs", "input"), ("expected", "expected output"))
        for array in test[kind]
    ]
    console.print(plain_table("", ["array", "role", "dtype", "shape"], rows))


def print_models(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from agent.store.listing import variant_note

    table = Table("model", "version", "file", "format", "size", "sha256", "signed by")
    variants = []  # said under the table: its rows fill 80 columns already
    for row in rows:
        for a in row["artifacts"]:
            size, digest = f"{a['size']:,}", a["sha256"][:16]
            table.add_row(
                row["name"], row["version"], a["file"], a["format"], size, digest, row["signed_by"] or ""
            )
            if note := variant_note(a):
                variants.append(f"{row['name']}@{row['version']} {a['file']} ({note})")
    console = Console()
    console.print(table)
    for line in variants:
        say(console, f"  {line}")


def print_check(ref: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("backend", "artifact", "runs it", "why not", title=f"{ref}")
    for row in rows:
        table.add_row(row["backend"], row["artifact"], "yes" if row["supported"] else "no", row["reason"])
    Console().print(table)
