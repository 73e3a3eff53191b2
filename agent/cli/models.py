"""`edge-agent models ...`: the models in the local store (list, remove, clean up, verify, pull),
and what a model is and runs on (validate, check, inspect)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.cli.common import echo_json, load, model_state_dir, split_ref, user_errors
from agent.cli.options import (
    DEFAULT_CONFIG,
    AtolOption,
    ConfigOption,
    JsonOption,
    RtolOption,
    StateDirOption,
    TestDataOption,
)
from agent.cli.render.models import (
    download_bar,
    print_check,
    print_inspection,
    print_models,
    print_validation,
)
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.store import ModelStore

models_app = typer.Typer(help="Models in the local store.", no_args_is_help=True)


@models_app.command("list")
def models_list(
    config: ConfigOption = DEFAULT_CONFIG, state_dir: StateDirOption = None, as_json: JsonOption = False
) -> None:
    """Model versions installed in the local store.

    A reduced-precision variant (registry publish --quantize) shows its precision and the model
    file it was made from."""
    from agent.store.listing import installed_rows

    with user_errors(as_json):
        rows = installed_rows(_store(config, state_dir))
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo("no models installed")
        return
    print_models(rows)


def _store(config: Path, state_dir: Path | None) -> ModelStore:
    """The store under --state-dir (no trust policy), else the config's (with its trusted keys)."""
    from agent.store import ModelStore, store_for

    if state_dir is not None:
        return ModelStore(state_dir / "store")
    return store_for(load(config))


@models_app.command("rm")
def models_rm(
    refs: Annotated[list[str], typer.Argument(help="NAME@VERSION to remove from the store.")],
    force: Annotated[
        bool, typer.Option("--force", help="Remove it even if a configured pipeline names it.")
    ] = False,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove installed versions (and the files no other version uses)."""
    removed: list[dict[str, Any]] = []
    with user_errors(as_json):
        store = _store(config, state_dir)
        in_use = _pipeline_models(config) if state_dir is None else set()
        for ref in refs:
            name, version = split_ref(ref)
            if (name, version) in in_use and not force:
                raise EdgeAgentError(
                    f"{ref} is used by a pipeline in {config}; refusing to remove it",
                    hint="change the pipeline first, or pass --force",
                )
            report = store.remove(name, version)
            removed.append({"name": name, "version": version, "freed_bytes": report.freed_bytes})
            if not as_json:
                typer.echo(f"removed {ref} ({report.freed_bytes:,} bytes freed)")
    if as_json:
        echo_json(removed)


@models_app.command("gc")
def models_gc(
    keep: Annotated[
        int | None,
        typer.Option("--keep", min=1, help="Versions kept per model (default: store.keep_versions)."),
    ] = None,
    max_size: Annotated[
        str | None,
        typer.Option("--max-size", help="Shrink the store below this, e.g. 2G, 500M (store.max_bytes)."),
    ] = None,
    older_than: Annotated[
        float | None,
        typer.Option("--older-than", min=0, help="Remove versions installed more than N days ago."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
    ] = False,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove old versions: beyond the newest N of each model, older than N days, and the oldest
    while the store is over a size. A version a configured pipeline names is never removed."""
    with user_errors(as_json):
        store = _store(config, state_dir)
        limits = load(config).store if state_dir is None else None
        in_use = _pipeline_models(config) if state_dir is None else set()
        keep_versions = keep if keep is not None else (limits.keep_versions if limits else None)
        max_bytes = _parse_size(max_size) if max_size else (limits.max_bytes if limits else None)
        days = older_than if older_than is not None else (limits.max_age_days if limits else None)
        if keep_versions is None and max_bytes is None and days is None:
            raise EdgeAgentError("nothing to do: give --keep, --max-size or --older-than (or a config)")
        report = store.gc(
            in_use, keep_versions, max_bytes, days * 86400 if days is not None else None, dry_run=dry_run
        )
    if as_json:
        echo_json(
            {
                "dry_run": dry_run,
                "removed": report.removed,
                "blobs": report.blobs,
                "freed_bytes": report.freed_bytes,
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for row in report.removed:
        typer.echo(f"{verb} {row['name']}@{row['version']}: {row['why']}")
    typer.echo(
        f"{verb} {len(report.removed)} version(s), {report.blobs} file(s), {report.freed_bytes:,} bytes"
    )


def _pipeline_models(config: Path) -> set[tuple[str, str]]:
    return {(p.model.name, p.model.version) for p in load(config).pipelines}


_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _parse_size(text: str) -> int:
    """`500M`, `2G`, `1.5G`, `123456` (bytes) -> bytes."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1] if value and value[-1] in _SIZE_UNITS else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise EdgeAgentError(f"--max-size {text!r}: expected a size such as 500M or 2G") from None
    return int(number * _SIZE_UNITS[unit])


@models_app.command("verify")
def models_verify(
    refs: Annotated[
        list[str] | None, typer.Argument(help="NAME@VERSION to check (default: every installed version).")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Re-check installed versions: the manifest's signature against the config's trusted keys, and
    every artifact's sha256. Exit 1 if any problem is found."""
    with user_errors(as_json):
        store = _store(config, state_dir)
        wanted = [split_ref(ref) for ref in refs] if refs else [(m.name, m.version) for m in store.list()]
        results: list[dict[str, Any]] = []
        for name, version in wanted:
            problems = store.verify(name, version)
            signed_by = None if problems else store.get(name, version).signed_by
            results.append(
                {
                    "name": name,
                    "version": version,
                    "ok": not problems,
                    "signed_by": signed_by,
                    "problems": problems,
                }
            )
    if as_json:
        echo_json(results)
    else:
        if not results:
            typer.echo("no models installed")
        for result in results:
            ref = f"{result['name']}@{result['version']}"
            if result["ok"]:
                signed = f", signed by trusted key {result['signed_by']}" if result["signed_by"] else ""
                typer.echo(f"ok: {ref} (every artifact's sha256 matches{signed})")
            else:
                for problem in result["problems"]:
                    typer.echo(f"FAILED: {ref}: {problem}", err=True)
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


@models_app.command("pull")
def models_pull(
    refs: Annotated[
        list[str] | None,
        typer.Argument(
            help="NAME@VERSION to pull from the config's registry (default: what the pipelines name)."
        ),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: JsonOption = False,
) -> None:
    """Pull model versions into the store (verified): those given, else every one the config's
    pipelines name (files given by model.path are imported). Each is reported; exit 1 if any failed."""
    from agent.registry import open_registry
    from agent.store import store_for

    results: list[dict[str, Any]] = []
    with user_errors(as_json):
        cfg = load(config)
        store = store_for(cfg)
        if refs:
            wanted = sorted({split_ref(ref) for ref in refs})
            local = []
        else:
            wanted = sorted({(p.model.name, p.model.version) for p in cfg.pipelines if p.model.path is None})
            local = sorted({p.model for p in cfg.pipelines if p.model.path is not None}, key=str)
        for model in local:
            assert model.path is not None
            results.append(
                _outcome(
                    model.name,
                    model.version,
                    "file",
                    partial(store.import_file, model.path, model.name, model.version),
                )
            )
        if wanted and cfg.registry is None:
            raise EdgeAgentError(f"{config}: no registry configured")
        if wanted and cfg.registry is not None:
            registry = open_registry(cfg.registry.url, cfg.registry)
            with contextlib.closing(registry), download_bar(enabled=not as_json) as progress:
                for name, version in wanted:
                    source = "store" if store.is_installed(name, version) else "registry"
                    results.append(
                        _outcome(
                            name,
                            version,
                            source,
                            partial(store.pull, registry, name, version, progress=progress),
                        )
                    )
    unreachable = any("cannot reach registry" in (r["error"] or "") for r in results)
    if as_json:
        echo_json(results)
    else:
        for r in results:
            ref = f"{r['name']}@{r['version']}"
            if r["ok"]:
                how = {
                    "store": "already in the store",
                    "registry": "pulled",
                    "file": "imported from its file",
                }
                typer.echo(f"ok: {ref} ({how[r['source']]})")
            else:
                typer.echo(f"FAILED: {ref}: {r['error']}", err=True)
        if unreachable:
            installed = ", ".join(m.ref for m in store.list()) or "nothing"
            typer.echo(
                f"the registry could not be reached: the box keeps running what its store has ({installed})",
                err=True,
            )
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


def _outcome(name: str, version: str, source: str, pull: Callable[[], Any]) -> dict[str, Any]:
    """One model's pull as a result row; its error (with hint) instead of stopping the others."""
    try:
        pull()
    except EdgeAgentError as exc:
        return {"name": name, "version": version, "ok": False, "source": source, "error": str(exc)}
    return {"name": name, "version": version, "ok": True, "source": source, "error": None}


@models_app.command("validate")
def models_validate(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    testdata: TestDataOption = None,
    rtol: RtolOption = None,
    atol: AtolOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run every candidate of this box (backends x artifacts, upgraded opsets included) on every test
    set of MODEL (its own, plus --test-data) and say which are correct, how far off each output is,
    how fast they are, and which one the agent would activate. Exit 1 when none is correct. The
    candidate it activates is kept as the agent's decision for this model on this box (under the
    config's state dir): the daemon, infer and explain then use it without proving again."""
    with user_errors(as_json):
        agent_config = None
        if config.is_file():
            try:
                agent_config = load(config)
            except EdgeAgentError:
                if not Path(model).is_file():
                    raise  # a model file needs no config: only its backend settings would be used
        store_dir = model_state_dir(model, config, state_dir)
        states = state_dir or (agent_config.state_dir if agent_config is not None else None)
        from agent.tools.validation import validate_model

        result = validate_model(model, testdata or [], rtol, atol, agent_config, store_dir, states)
    if as_json:
        echo_json(result.to_dict())
    else:
        print_validation(result)
    if not result.usable:
        raise typer.Exit(1)


@models_app.command("check")
def models_check(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Which backends can run MODEL, and for those that cannot, why (naming unsupported operators)."""
    from agent.store import ModelStore
    from agent.tools.inventory import check_model, resolve_model

    with user_errors(as_json):
        store_dir = model_state_dir(model, config, state_dir)
        resolved = resolve_model(model, ModelStore((store_dir or Path(".")) / "store"))
        ref, rows = resolved.ref, check_model(resolved.artifacts)
    if as_json:
        echo_json({"model": ref, "backends": rows})
        return
    print_check(ref, rows)


@models_app.command("inspect")
def models_inspect(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """What is inside MODEL, read without running it: per model file its format, size, sha256,
    inputs and outputs, operators and weights (ONNX: opsets, producer, metadata_props; TFLite:
    quantisation); for a store version also its manifest metadata, artifacts, test sets and signer."""
    from agent.store import ModelStore
    from agent.tools.model_info import inspect_model

    with user_errors(as_json):
        store_dir = model_state_dir(model, config, state_dir)
        info = inspect_model(model, ModelStore((store_dir or Path(".")) / "store"))
    if as_json:
        echo_json(info)
    else:
        print_inspection(info)
        _print_labels(info["labels"])


def _print_labels(labels: dict[str, Any] | None) -> None:
    """Every label, numbered as the model's classes are (the metadata table cuts long values): the
    names zones, lines and home_automation.watch may filter on."""
    if labels is None:
        return
    names = labels["names"]
    typer.echo(f"\nlabels ({len(names)}, from {labels['source']}):")
    line = ""
    for i, name in enumerate(names):  # wrapped between labels, never inside one
        item = f"{i} {name}" + ("," if i < len(names) - 1 else "")
        if line and len(line) + 1 + len(item) > 78:
            typer.echo(line)
            line = ""
        line = f"{line} {item}" if line else f"  {item}"
    typer.echo(line)
