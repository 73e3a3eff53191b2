"""`edge-agent`: run, validate, publish and inspect. A thin layer over `agent/` functions.

Every command maps the agent's typed errors to a one-line message (plus hint) and exit 1;
`--json` prints machine-readable output for scripts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent import __version__
from agent.cli_fleet import fleet_app
from agent.cli_options import DEFAULT_CONFIG, ConfigOption, JsonOption, StateDirOption
from agent.cli_status import status as show_status
from agent.config import AgentConfig, RegistryConnection
from agent.errors import ConfigError, EdgeAgentError
from agent.logfmt import setup_logging

if TYPE_CHECKING:
    from rich.table import Table

    from agent.doctor import Check
    from agent.store import ModelStore, Progress
    from agent.validate import Validation
    from providers.select import CandidateReport


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


config_app = typer.Typer(help="Check agent.yaml files.", no_args_is_help=True)
registry_app = typer.Typer(help="Publish models to a registry.", no_args_is_help=True)
models_app = typer.Typer(help="Models in the local store.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(registry_app, name="registry")
app.add_typer(models_app, name="models")
app.add_typer(fleet_app, name="fleet")
app.command("status")(show_status)


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@contextmanager
def _user_errors(as_json: bool = False) -> Iterator[None]:
    """Turn the agent's errors into a clear message and exit 1, never a traceback."""
    try:
        yield
    except EdgeAgentError as exc:
        if as_json:
            problems = exc.problems if isinstance(exc, ConfigError) else [exc.message]
            _echo_json({"ok": False, "errors": problems, "hint": exc.hint})
        else:
            for line in exc.problems if isinstance(exc, ConfigError) else [exc.message]:
                typer.echo(f"error: {line}", err=True)
            if exc.hint:
                typer.echo(f"hint: {exc.hint}", err=True)
        raise typer.Exit(1) from None


def _load(config_path: Path) -> AgentConfig:
    from agent.config_loader import load_config

    return load_config(config_path)


# --- run ----------------------------------------------------------------------------------


@app.command()
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
    setup_logging(log_level or "info", "json" if log_format == "json" else "text")  # (the fallback logs)
    from agent.reload import load_for_run

    with _user_errors():
        loaded = load_for_run(config)
    setup_logging(
        log_level or loaded.config.log_level,
        loaded.config.log_format if log_format is None else "json" if log_format == "json" else "text",
    )
    from agent.daemon import Agent, hold_state_dir
    from agent.self_update import boot

    with _user_errors():  # a second daemon on the state dir must not touch its releases either
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
    with _user_errors():
        agent = Agent(loaded.config, loaded)
        agent.log_level_from_cli = log_level
        agent.run(stop, duration_s=duration, reload=reload)
    if agent.exit_code:  # self-update: systemd starts it again, into the release (or back)
        raise typer.Exit(agent.exit_code)
    failures = agent.none_ran()
    if failures:  # e.g. `run --duration` in a script: every pipeline failing is not a success
        for line in failures:
            typer.echo(f"error: no pipeline ran: {line}", err=True)
        raise typer.Exit(1)


# --- config -------------------------------------------------------------------------------


@config_app.command("validate")
def config_validate(
    file: Annotated[Path, typer.Argument(help="The agent.yaml to check.")],
    as_json: JsonOption = False,
) -> None:
    """Print OK, or every problem as file:line: key.path: message (exit 1)."""
    with _user_errors(as_json):
        cfg = _load(file)
    summary = f"{len(cfg.pipelines)} pipeline(s), device {cfg.device.id}"
    if as_json:
        _echo_json({"ok": True, "file": str(file), "device": cfg.device.id, "pipelines": len(cfg.pipelines)})
    else:
        typer.echo(f"OK: {file} ({summary})")


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
    """What `systemctl reload edge-agent` would change: pipelines added, removed, changed (which
    keys) and unchanged (they run on untouched), settings applied at once, settings that need a
    restart. Values are never shown (configs hold passwords). Exit 1 when FILE is invalid."""
    from agent.config_loader import read_config
    from agent.reload import LastGoodConfig, plan_reload

    with _user_errors(as_json):
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
        _echo_json({"ok": True, "file": str(file), "against": compared, **plan.to_dict()})
        return
    typer.echo(f"{file} against {compared}:")
    for line in plan.lines():
        typer.echo(f"  {line}")


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of agent.yaml (for editors such as yaml-language-server)."""
    from agent.config_loader import config_json_schema

    _echo_json(config_json_schema())


# --- registry -----------------------------------------------------------------------------


TestDataOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--test-data",
        help="A .npz of inputs (arrays named after the model's inputs) and optional expected:<output> "
        "arrays, or an ONNX model-zoo folder (test_data_set_N of input_K.pb/output_K.pb, or a folder of "
        "them). Repeatable.",
        exists=True,
    ),
]
RtolOption = Annotated[
    float | None,
    typer.Option(
        "--rtol", min=0, help="Relative tolerance of the expected outputs (model-zoo default 1e-3)."
    ),
]
AtolOption = Annotated[
    float | None,
    typer.Option(
        "--atol", min=0, help="Absolute tolerance of the expected outputs (model-zoo default 1e-7)."
    ),
]
RegistryUrlOption = Annotated[
    str, typer.Option("--registry", help="file:///srv/registry or oci://host[:port]/prefix.")
]
UsernameOption = Annotated[str | None, typer.Option("--username", help="OCI registry user (basic auth).")]
PasswordFileOption = Annotated[
    Path | None, typer.Option("--password-file", help="File holding the OCI registry password.")
]
TokenFileOption = Annotated[Path | None, typer.Option("--token-file", help="File holding a bearer token.")]
CaFileOption = Annotated[
    Path | None, typer.Option("--ca-file", help="CA bundle that signed the OCI registry's certificate.")
]


def _connection(
    username: str | None, password_file: Path | None, token_file: Path | None, ca_file: Path | None
) -> RegistryConnection:
    from pydantic import ValidationError

    try:
        return RegistryConnection(
            username=username, password_file=password_file, token_file=token_file, ca_file=ca_file
        )
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise EdgeAgentError(f"registry credentials: {problems}") from None


@registry_app.command("publish")
def registry_publish(
    file: Annotated[
        Path,
        typer.Argument(
            help="Model file (.onnx, .tflite, .xml), or an edge-agent release wheel (.whl).",
            exists=True,
            dir_okay=False,
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Model name.")],
    version: Annotated[str, typer.Option("--version", help="Version (immutable once published).")],
    registry: RegistryUrlOption,
    target: Annotated[str, typer.Option("--target", help="Artifact target, e.g. any, edgetpu.")] = "any",
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="JSON file of metadata for the manifest (labels, ...).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing version.")] = False,
    testdata: TestDataOption = None,
    rtol: RtolOption = None,
    atol: AtolOption = None,
    sign_key: Annotated[
        Path | None,
        typer.Option("--sign", help="Sign the manifest with this Ed25519 private key (registry keygen)."),
    ] = None,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    token_file: TokenFileOption = None,
    ca_file: CaFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Publish a model file as NAME@VERSION: copies it in (or pushes it to an OCI registry) with its
    manifest (sha256, size, format of every file)."""
    from agent.registry.publish import publish_version
    from agent.registry.signing import key_id, load_private_key

    with _user_errors(as_json):
        extra = _read_json_file(metadata) if metadata else None
        private_key = load_private_key(sign_key) if sign_key is not None else None  # before any copying
        manifest, digest = publish_version(
            registry,
            file,
            name,
            version,
            connection=_connection(username, password_file, token_file, ca_file),
            target=target,
            metadata=extra,
            force=force,
            testdata=testdata or [],
            sign_with=private_key,
            rtol=rtol,
            atol=atol,
        )
    signed_by = key_id(private_key.public_key()) if private_key is not None else None
    if as_json:
        _echo_json({**json.loads(manifest.to_bytes()), "signed_by": signed_by, "digest": digest})
    else:
        for artifact in manifest.artifacts:
            typer.echo(
                f"published {name}@{version} to {registry}: {artifact.file} "
                f"({artifact.format}, {artifact.size} bytes, sha256 {artifact.sha256})"
            )
        if signed_by:
            typer.echo(f"signed {name}@{version} with key {signed_by}")
        if digest:
            typer.echo(f"image manifest {digest} (pin it with model.digest)")


KeyOption = Annotated[Path, typer.Option("--key", help="Ed25519 private key file (registry keygen).")]


@registry_app.command("keygen")
def registry_keygen(
    key_file: Annotated[
        Path, typer.Argument(help="Private key file to write (its public key: KEY_FILE.pub).")
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace existing key files.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Make an Ed25519 signing key: KEY_FILE (private, mode 0600) and KEY_FILE.pub (for trusted_keys)."""
    from agent.registry.signing import generate_key

    with _user_errors(as_json):
        kid, public_path = generate_key(key_file, force=force)
    if as_json:
        _echo_json({"key_id": kid, "private_key": str(key_file), "public_key": str(public_path)})
    else:
        typer.echo(f"key {kid}: private {key_file} (keep it secret), public {public_path}")
        typer.echo(f"trust it on a box: registry.trusted_keys: [{{key: {public_path.name}, models: ['*']}}]")


@registry_app.command("sign")
def registry_sign(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION published in the registry.")],
    registry: RegistryUrlOption,
    key: KeyOption,
    username: UsernameOption = None,
    password_file: PasswordFileOption = None,
    token_file: TokenFileOption = None,
    ca_file: CaFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add a signature to a published version (manifest.json.sig); other keys' signatures are kept."""
    from agent.registry.publish import sign_version
    from agent.registry.signing import load_private_key

    with _user_errors(as_json):
        name, version = _split_ref(ref)
        connection = _connection(username, password_file, token_file, ca_file)
        kid, digest = sign_version(registry, name, version, load_private_key(key), connection)
    if as_json:
        _echo_json({"name": name, "version": version, "signed_by": kid, "digest": digest})
    else:
        typer.echo(f"signed {name}@{version} in {registry} with key {kid}")
        if digest:
            typer.echo(f"image manifest {digest} (the tag {version} now points to it)")


def _split_ref(ref: str) -> tuple[str, str]:
    name, _, version = ref.partition("@")
    if not name or not version:
        raise EdgeAgentError(f"{ref!r} is not NAME@VERSION")
    return name, version


def _read_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgeAgentError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise EdgeAgentError(f"{path}: metadata must be a JSON object")
    return data


# --- models -------------------------------------------------------------------------------


def _state_dir(config: Path, state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else _load(config).state_dir


def _model_state_dir(model: str, config: Path, state_dir: Path | None) -> Path | None:
    """Where MODEL is looked up: None for a model file, else the state dir (from the config unless given)."""
    if state_dir is not None or Path(model).is_file():
        return state_dir
    if "/" in model:  # a path, never a model name: say so, not that the config is missing
        raise EdgeAgentError(f"{model}: no such model file")
    return _state_dir(config, None)


@models_app.command("list")
def models_list(
    config: ConfigOption = DEFAULT_CONFIG, state_dir: StateDirOption = None, as_json: JsonOption = False
) -> None:
    """Model versions installed in the local store."""
    with _user_errors(as_json):
        installed = _store(config, state_dir).list()
    rows: list[dict[str, Any]] = [
        {
            "name": m.name,
            "version": m.version,
            "signed_by": m.signed_by,
            "artifacts": [
                {"file": a.file, "format": a.format, "size": a.size, "sha256": a.sha256, "target": a.target}
                for a in m.manifest.artifacts
            ],
        }
        for m in installed
    ]
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        typer.echo("no models installed")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "version", "file", "format", "size", "sha256", "signed by")
    for row in rows:
        for a in row["artifacts"]:
            size, digest = f"{a['size']:,}", a["sha256"][:16]
            table.add_row(
                row["name"], row["version"], a["file"], a["format"], size, digest, row["signed_by"] or ""
            )
    Console().print(table)


def _store(config: Path, state_dir: Path | None) -> ModelStore:
    """The store under --state-dir (no trust policy), else the config's (with its trusted keys)."""
    from agent.store import ModelStore, store_for

    if state_dir is not None:
        return ModelStore(state_dir / "store")
    return store_for(_load(config))


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
    with _user_errors(as_json):
        store = _store(config, state_dir)
        in_use = _pipeline_models(config) if state_dir is None else set()
        for ref in refs:
            name, version = _split_ref(ref)
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
        _echo_json(removed)


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
    with _user_errors(as_json):
        store = _store(config, state_dir)
        limits = _load(config).store if state_dir is None else None
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
        _echo_json(
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
    return {(p.model.name, p.model.version) for p in _load(config).pipelines}


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
    with _user_errors(as_json):
        store = _store(config, state_dir)
        wanted = [_split_ref(ref) for ref in refs] if refs else [(m.name, m.version) for m in store.list()]
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
        _echo_json(results)
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
    with _user_errors(as_json):
        cfg = _load(config)
        store = store_for(cfg)
        if refs:
            wanted = sorted({_split_ref(ref) for ref in refs})
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
            with contextlib.closing(registry), _download_bar(enabled=not as_json) as progress:
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
        _echo_json(results)
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


@contextmanager
def _download_bar(enabled: bool) -> Iterator[Progress | None]:
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


# --- backends -------------------------------------------------------------------------------


@app.command()
def providers(as_json: JsonOption = False) -> None:
    """The hardware found and every backend: available or not, why, and versions."""
    from agent.backend_choice import providers_report

    report = providers_report()
    if as_json:
        _echo_json(report)
        return
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
    with _user_errors(as_json):
        agent_config = None
        if config.is_file():
            try:
                agent_config = _load(config)
            except EdgeAgentError:
                if not Path(model).is_file():
                    raise  # a model file needs no config: only its backend settings would be used
        store_dir = _model_state_dir(model, config, state_dir)
        states = state_dir or (agent_config.state_dir if agent_config is not None else None)
        result = _validate(model, testdata or [], rtol, atol, agent_config, store_dir, states)
    if as_json:
        _echo_json(result.to_dict())
    else:
        _print_validation(result)
    if not result.usable:
        raise typer.Exit(1)


def _validate(
    model: str,
    testdata: list[Path],
    rtol: float | None,
    atol: float | None,
    agent_config: AgentConfig | None,
    store_dir: Path | None,
    states: Path | None,
) -> Validation:
    import tempfile

    from agent.backend_choice import Box, DecisionStore, current_choice, model_candidates, owns_state_dir
    from agent.infer import settings_for
    from agent.inventory import resolve_model
    from agent.store import ModelStore
    from agent.testdata import TestData, testdata_files
    from agent.validate import validate
    from providers import ModelArtifact, NoBackendError
    from providers.select import SelectionPolicy

    with tempfile.TemporaryDirectory(prefix="edge-agent-validate-") as work:
        resolved = resolve_model(model, ModelStore((store_dir or Path(".")) / "store"))
        tests = list(resolved.testdata)
        primary = resolved.artifacts[0]
        for file in testdata_files(testdata, primary.path, primary.format, Path(work) / "tests", rtol, atol):
            digest = hashlib.sha256(file.path.read_bytes()).hexdigest()
            tests.append(
                TestData(
                    ModelArtifact(file.path, "test-data", digest, name=file.name), None, file.rtol, file.atol
                )
            )
        if not tests:
            raise EdgeAgentError(
                f"{resolved.ref} has no test data to validate on",
                hint="publish it with --test-data, or pass --test-data here",
            )
        settings = settings_for(agent_config, states or Path(work) / "state")
        box = Box.here(settings)
        # The choice every start and tool takes for this model: its key, policy and candidates.
        try:
            choice = current_choice(settings, None, resolved.artifacts, resolved.ref, resolved.testdata, box)
        except NoBackendError:
            choice = None
        artifacts = choice.artifacts if choice else model_candidates(settings, resolved.artifacts, box)
        policy = replace(
            choice.policy if choice else SelectionPolicy(), warmup=2, runs=10, min_time_s=0.2, max_trials=99
        )
        result = validate(resolved.ref, artifacts, tests, policy, None, list(box.backends))
        keep = choice is not None and result.usable and result.proven is not None and states is not None
        if keep and owns_state_dir(settings):  # as another user (root): nothing written in its way
            assert choice is not None and result.proven is not None
            DecisionStore(settings.state_dir).put(choice.key, result.proven, None, resolved.ref)
            result.cached = True
    return result


def _print_validation(result: Validation) -> None:
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
            check.backend, check.artifact, _yes(check.loads), _yes(check.runs), correct,
            _num(worst_abs, ".3g"), _num(worst_rel, ".3g"), _num(check.median_ms), check.precision,
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


def _yes(value: bool) -> str:
    return "yes" if value else "no"


@models_app.command("check")
def models_check(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Which backends can run MODEL, and for those that cannot, why (naming unsupported operators)."""
    from agent.inventory import check_model, resolve_model
    from agent.store import ModelStore

    with _user_errors(as_json):
        store_dir = _model_state_dir(model, config, state_dir)
        resolved = resolve_model(model, ModelStore((store_dir or Path(".")) / "store"))
        ref, rows = resolved.ref, check_model(resolved.artifacts)
    if as_json:
        _echo_json({"model": ref, "backends": rows})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("backend", "artifact", "runs it", "why not", title=f"{ref}")
    for row in rows:
        table.add_row(row["backend"], row["artifact"], "yes" if row["supported"] else "no", row["reason"])
    Console().print(table)


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
    from agent.model_info import inspect_model
    from agent.store import ModelStore

    with _user_errors(as_json):
        store_dir = _model_state_dir(model, config, state_dir)
        info = inspect_model(model, ModelStore((store_dir or Path(".")) / "store"))
    if as_json:
        _echo_json(info)
    else:
        _print_inspection(info)


INSPECT_VALUE_CHARS = 60  # longer metadata values are cut in tables (--json has them whole)


def _cut(value: Any, limit: int = INSPECT_VALUE_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _inspect_table(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    """A rich table of plain text (no markup read from model data); long cells wrap, never cut."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
    return table


def _print_inspection(info: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    version = info["version"]
    if version is not None:
        _say(
            console,
            f"{info['model']} (created {version['created']}, signed by {version['signed_by'] or 'nobody'})",
        )
        if version["metadata"]:
            rows = [[key, _cut(value)] for key, value in version["metadata"].items()]
            console.print(_inspect_table("manifest metadata", ["metadata", "value"], rows))
        # Test-data columns only where some artifact has them: 80 columns are few.
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
        console.print(_inspect_table("artifacts", columns, rows))
    for model in info["models"]:
        _print_model_file(console, model)
    for test in info["test_sets"]:
        _print_test_set(console, test)


def _say(console: Any, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _print_model_file(console: Any, m: dict[str, Any]) -> None:
    from agent.model_formats import format_shape

    _say(console, "")
    _say(console, f"{m['file']}: {m['format']}, {m['size']:,} bytes, sha256 {m['sha256'][:16]}")
    if "weights_of" in m:
        _say(console, f"  the weights of {m['weights_of']}")
        return
    if m["format"] == "onnx":
        opsets = ", ".join(f"{domain or 'ai.onnx'} {v}" for domain, v in m["opsets"].items())
        producer = f"{m['producer_name']} {m['producer_version']}".strip() or "unknown"
        _say(console, f"  ir_version {m['ir_version']}, producer {producer}, opsets {opsets}")
        params = f"{m['initializers']} initializers, {m['parameters']:,} parameters"
        if m["parameters_in_constants"]:
            params += f" ({m['parameters_in_constants']:,} in Constant nodes)"
        _say(console, f"  {m['nodes']} nodes, {params}")
        if m["external_data"]:
            _say(console, f"  external data (not read): {', '.join(m['external_data'])}")
    elif m["format"] == "tflite":
        signatures = f", signatures {', '.join(m['signatures'])}" if m["signatures"] else ""
        _say(console, f"  read with {m['runtime']}{signatures}")
    else:
        _say(
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
            row.append(f"scale {_cut(q['scales'], 30)}, zero point {_cut(q['zero_points'], 30)}" if q else "")
        rows.append(row)
    columns = ["", "name", "dtype", "shape", *(["quantization"] if quantised else [])]
    console.print(_inspect_table("inputs and outputs", columns, rows))
    if m["operators"]:
        default_domain = "ai.onnx" if m["format"] == "onnx" else ""
        rows = [[op["op_type"], op["domain"] or default_domain, op["count"]] for op in m["operators"]]
        title = f"operators ({len(rows)} kinds)"
        console.print(_inspect_table(title, ["operator", "domain", "count"], rows))
    if m.get("operators_note"):
        _say(console, f"  {m['operators_note']}")
    if m.get("metadata_props"):
        rows = [[key, _cut(value)] for key, value in m["metadata_props"].items()]
        console.print(_inspect_table("metadata_props", ["key", "value"], rows))


def _print_test_set(console: Any, test: dict[str, Any]) -> None:
    from agent.model_formats import format_shape

    _say(console, "")
    tolerances = "".join(f", {key} {test[key]}" for key in ("rtol", "atol") if test[key] is not None)
    _say(
        console, f"test set {test['file']}: for {test['model_file'] or 'any model file it fits'}{tolerances}"
    )
    if test["error"]:
        _say(console, f"  unreadable: {test['error']}")
        return
    rows = [
        [array["name"], role, array["dtype"], format_shape(array["shape"])]
        for kind, role in (("inputs", "input"), ("expected", "expected output"))
        for array in test[kind]
    ]
    console.print(_inspect_table("", ["array", "role", "dtype", "shape"], rows))


@app.command()
def explain(
    name: Annotated[str, typer.Argument(help="A pipeline name, a model NAME[@VERSION], or a model file.")],
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a pipeline (or model) runs on its backend: every candidate, its verdict and numbers. From
    the running daemon when there is one; else where the next start would run it (the cached
    decision, or what a first start serves and the candidates it proves next)."""
    from agent.explain import explain as explain_records

    with _user_errors(as_json):
        from agent.infer import is_model_file_name

        # A model file needs no config (its backend settings are used when it is valid); a pipeline
        # or a stored model does.
        agent_config = None
        if not is_model_file_name(name) and (config.is_file() or state_dir is None):
            agent_config = _load(config)
        elif config.is_file():
            with contextlib.suppress(EdgeAgentError):
                agent_config = _load(config)
        records = explain_records(name, agent_config, config, state_dir)
    if as_json:
        _echo_json(records)
        return
    from rich.console import Console

    from providers import Decision
    from providers.select import CandidateReport

    console = Console()
    for record in records:
        title = f"[bold]{record['pipeline'] or record['model']}[/bold]" + (
            f" ({record['model']})" if record["pipeline"] else ""
        )
        if "refused" in record:
            console.print(f"{title}: no backend serves it")
            console.print(f"  {record['refused']}", markup=False)
            candidates = [CandidateReport(**c) for c in record["candidates"]]
            console.print(_candidate_table(candidates))
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
        if decision.note:
            console.print(f"  note: {decision.note}", markup=False)
        if not decision.checked and not record.get("prospective"):
            console.print("  [bold]unchecked[/bold]: no candidate's outputs were compared with a reference")
        console.print(_candidate_table(decision.candidates))


def _candidate_table(candidates: list[CandidateReport]) -> Table:
    from rich.table import Table

    from providers.select import spare_core_note

    unlock = any(c.unlock for c in candidates)
    columns = ["backend", "artifact", "verdict", "median ms", "precision", "max diff", "reason"]
    table = Table(*columns, *(["would pass with"] if unlock else []))
    for c in candidates:
        row = [
            c.backend,
            c.artifact,
            c.verdict,
            _num(c.median_ms),
            c.precision or "",
            _num(c.max_abs_diff, ".2g"),
            "; ".join(part for part in (c.reason, spare_core_note(c)) if part),
        ]
        table.add_row(*row, *([c.unlock] if unlock else []))
    return table


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "" if value is None else format(value, fmt)


@app.command()
def bench(
    model: Annotated[str, typer.Argument(help="A model file, or NAME[@VERSION] in the store.")],
    backend: Annotated[str, typer.Option("--backend", help="A backend name, or 'all'.")] = "all",
    runs: Annotated[int, typer.Option("--runs", min=1, help="Timed runs per backend.")] = 100,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 10,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            help="Shape of the random inputs: 1x3x48x192, or NAME=1x3x48x192 per input of several.",
        ),
    ] = None,
    inputs: Annotated[
        Path | None,
        typer.Option("--inputs", help="A test data .npz (arrays named after the model's inputs) to time on."),
    ] = None,
    pipeline: Annotated[
        str | None,
        typer.Option("--pipeline", help="Time on inputs of the size this pipeline of the config feeds."),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Latency (p50/p90/p99), throughput and peak memory of MODEL per backend, each in its own process.

    Inputs: --inputs, else the model's own test data (when its manifest has some), else random
    inputs of the size a pipeline feeds it (--pipeline, else the config's first pipeline on MODEL,
    else the size the model's manifest or metadata names), else random tensors of the model's input
    shapes (--shape; open batch dimension = 1, other open dimensions = 224).
    """
    from agent.backend_choice import current_choice
    from agent.infer import settings_for, state_or_scratch
    from agent.inventory import bench as run_bench
    from agent.inventory import bench_feeds, resolve_model
    from agent.store import ModelStore
    from providers import NoBackendError, all_backends

    with _user_errors(as_json):
        store_root = _model_state_dir(model, config, state_dir)
        store = ModelStore((store_root or Path(".")) / "store")
        resolved = resolve_model(model, store)
        ref, artifacts = resolved.ref, resolved.artifacts
        backends = all_backends()
        if backend != "all":
            backends = [b for b in backends if b.name == backend]
            if not backends:
                raise EdgeAgentError(f"unknown backend {backend!r}", hint="edge-agent providers lists them")
        agent = None
        if config.is_file():
            with contextlib.suppress(EdgeAgentError):  # without it: the defaults
                agent = _load(config)
        if pipeline is not None and agent is None:
            raise EdgeAgentError(f"--pipeline {pipeline}: no config at {config}", hint="give -c CONFIG")
        shaped = None
        if not shape and inputs is None and (pipeline is not None or not resolved.testdata):
            from agent.infer import pipeline_shaped_feeds

            shaped = pipeline_shaped_feeds(model, store, agent, pipeline, config)
        feeds, fed = shaped if shaped is not None else bench_feeds(resolved, shape or [], inputs)
        with state_or_scratch(store_root or (agent.state_dir if agent is not None else None)) as states:
            # What this box serves the model on (marked in the table), and the artifacts it chooses
            # among: an upgraded twin is timed too.
            try:
                choice = current_choice(settings_for(agent, states), None, artifacts, ref, resolved.testdata)
            except NoBackendError:
                choice = None
            if choice is not None:
                artifacts = choice.artifacts
            if as_json:
                rows = run_bench(artifacts, feeds, backends, runs, warmup)
            else:
                from rich.progress import Progress

                with Progress(transient=True) as progress:
                    task = progress.add_task("benchmarking", total=None)
                    rows = run_bench(
                        artifacts,
                        feeds,
                        backends,
                        runs,
                        warmup,
                        progress=lambda what: progress.update(task, description=what),
                    )
    serving = (choice.backend, choice.artifact) if choice is not None else None
    for row in rows:
        row["selected"] = (row["backend"], row["artifact"]) == serving
    if as_json:
        summary = choice.summary() if choice is not None else None
        _echo_json(
            {"model": ref, "runs": runs, "warmup": warmup, "inputs": fed, "choice": summary, "results": rows}
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "backend",
        "artifact",
        "precision",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "runtime p50 ms",
        "per s",
        "peak MB",
        "",
        title=f"{ref}: {runs} runs after {warmup} warm-up, on {fed}",
        caption="p50/p90/p99: wall time of each run from Python; runtime p50: the runtime's own timer "
        "(OpenVINO's, as its benchmark_app reports), where it has one",
    )
    for row in rows:
        if not row["ok"]:
            table.add_row(
                row["backend"], row["artifact"], "failed", "", "", "", "", "", "", row["error"][:60]
            )
            continue
        table.add_row(
            row["backend"],
            row["artifact"],
            row["precision"],
            _num(row["p50_ms"], ".3f"),
            _num(row["p90_ms"], ".3f"),
            _num(row["p99_ms"], ".3f"),
            _num(row.get("compute_p50_ms"), ".3f"),
            _num(row["throughput_per_s"], ".1f"),
            _num(row["peak_rss_mb"], ".0f"),
            "selected" if row["selected"] else "",
        )
    Console().print(table)


@app.command()
def infer(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A model file (.onnx, .tflite, .xml), or NAME@VERSION in the store."
        ),
    ],
    input_path: Annotated[
        Path,
        typer.Argument(
            metavar="INPUT",
            help="An image, a video file (--frame), a WAV file (audio pipelines), or a .npy/.npz tensor "
            "(fed to the model as it is).",
        ),
    ],
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            help="Process the input as this pipeline of -c CONFIG does (its preprocess, postprocess, "
            "state and report rules); default: the model's own hints, else plain image defaults.",
        ),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    state_dir: StateDirOption = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Run on this backend, e.g. onnxruntime/CPUExecutionProvider, openvino/CPU, tflite/cpu "
            "(default: the agent's choice for this model on this box).",
        ),
    ] = None,
    benchmark: Annotated[
        bool,
        typer.Option("--benchmark", help="Prove the candidate backends on this input first (seconds)."),
    ] = False,
    frame: Annotated[
        int | None, typer.Option("--frame", min=0, help="Video: the frame to run on (default 0).")
    ] = None,
    draw: Annotated[
        Path | None,
        typer.Option("--draw", help="Write the image (or video frame) with the boxes and labels drawn."),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="With --json: every output tensor's values too (can be large).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run MODEL once on INPUT with the pre- and postprocessing a pipeline would use: the backend,
    the time each step took, and the result (detections, classes, ...). Exit 1 on any problem."""
    from agent.infer import PICTURES, check_picture_path, infer, input_kind, is_model_file_name
    from agent.store import ModelStore, store_for

    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # a broken file is said once, as an error
    with _user_errors(as_json):
        if raw and not as_json:
            raise EdgeAgentError("--raw goes with --json (the values of every output)")
        if benchmark and backend is not None:
            raise EdgeAgentError("--benchmark chooses the backend, --backend names it: give one of them")
        if draw is not None:
            if input_kind(input_path) not in PICTURES:
                raise EdgeAgentError(
                    f"--draw needs an image or a video frame to draw on; {input_path} is neither"
                )
            check_picture_path(draw)
        from_store = not is_model_file_name(model)
        agent_config: AgentConfig | None = None
        if pipeline is not None or (from_store and state_dir is None):
            agent_config = _load(config)
        elif config.is_file():
            with contextlib.suppress(EdgeAgentError):  # only its backend settings would be used
                agent_config = _load(config)
        states = state_dir or (agent_config.state_dir if agent_config is not None else None)
        if state_dir is not None or agent_config is None:
            store = ModelStore((states or Path(".")) / "store")
        else:
            store = store_for(agent_config)
        result = infer(
            model,
            input_path,
            store,
            agent=agent_config,
            config_path=config,
            pipeline=pipeline,
            state_dir=states,
            backend=backend,
            benchmark=benchmark,
            frame=frame,
            raw=raw,
        )
        drawn = _draw_result(result, draw) if draw is not None else None
    data = result.to_dict()
    if drawn is not None:
        data["drawn"] = {"file": str(draw), "note": drawn}
    if as_json:
        _echo_json(data)
    else:
        _print_inference(data, result.summary)


def _draw_result(result: Any, path: Path) -> str:
    from agent.infer import draw, write_picture

    assert result.picture is not None and result.output is not None
    image, note = draw(result.picture, result.output)
    write_picture(path, image)
    return note


def _print_inference(data: dict[str, Any], summary: dict[str, Any] | None) -> None:
    from rich.console import Console

    console = Console()
    frame = f", frame {data['frame']}" if "frame" in data else ""
    how = f"pipeline {data['pipeline']}" if data["pipeline"] else "the model's own settings"
    _say(console, f"{data['model']} on {data['input']}{frame} ({how})")
    _say(
        console,
        f"backend: {data['backend']} ({data['precision']}) on {data['artifact']}: {data['backend_choice']}",
    )
    latency = data["latency_ms"]
    per = f" per window, {data['windows']} windows" if "windows" in data else ""
    _say(
        console,
        f"latency: preprocess {latency['preprocess']:.2f} ms, inference {latency['inference']:.2f} ms, "
        f"postprocess {latency['postprocess']:.2f} ms{per}",
    )
    if "results" in data:
        _print_windows(console, data)
    else:
        _print_output(console, data["output"], summary)
        if data.get("held_back_by"):
            _say(console, f"the pipeline would not publish it: held back by report.{data['held_back_by']}")
    if data.get("note"):
        _say(console, f"note: {data['note']}")
    if "drawn" in data:
        _say(console, f"wrote {data['drawn']['file']}: {data['drawn']['note']}")


def _print_output(console: Any, output: dict[str, Any], summary: dict[str, Any] | None) -> None:
    if "detections" in output:
        rows = [
            [d["label"] if d["label"] is not None else "", d["index"], f"{d['score']:.3f}",
             ", ".join(f"{v:.0f}" for v in d["box"])]
            for d in output["detections"]
        ]  # fmt: skip
        _say(console, f"{len(rows)} detection(s); boxes x1, y1, x2, y2 in source pixels:")
        console.print(_inspect_table("", ["label", "class", "score", "box"], rows))
    elif "top" in output:
        rows = [
            [d["label"] if d["label"] is not None else "", d["index"], f"{d['score']:.4f}"]
            for d in output["top"]
        ]
        console.print(_inspect_table("classification", ["label", "class", "score"], rows))
    elif "regions" in output:
        rows = [
            [f"{r['score']:.3f}", r["area"], ", ".join(f"{v:.0f}" for v in r["box"])]
            for r in output["regions"]
        ]
        _say(console, f"{len(rows)} region(s); boxes x1, y1, x2, y2 in source pixels:")
        console.print(_inspect_table("", ["score", "area", "box"], rows))
    elif "active" in output:
        _say(console, f"active: {output['active']}, score {output['score']}, event {output['event']}")
    elif "outputs" in output and summary is not None:
        columns = ["output", "shape", "dtype", "min", "max", "mean", "argmax"]
        rows = [
            [
                name,
                "x".join(map(str, s["shape"])),
                s["dtype"],
                s.get("min"),
                s.get("max"),
                s.get("mean"),
                s.get("argmax"),
            ]
            for name, s in summary["outputs"].items()
        ]
        console.print(_inspect_table("outputs", columns, rows))
    else:  # a plugin's own dict
        _say(console, json.dumps(output, indent=2, default=str))


def _print_windows(console: Any, data: dict[str, Any]) -> None:
    held = ", ".join(f"{rule} {n}" for rule, n in data["held_back"].items() if n)
    _say(
        console,
        f"{len(data['results'])} result(s) the pipeline would publish"
        + (f" (held back: {held})" if held else ""),
    )
    rows = [[r["frame"], f"{r['position_s']:.3f}", _cut(r["output"], 80)] for r in data["results"]]
    console.print(_inspect_table("", ["window", "at s", "output"], rows))


@app.command()
def source(
    target: Annotated[
        str,
        typer.Argument(
            help="A pipeline of the config (its source), or a source URI: video file, image folder, "
            "/dev/videoN, rtsp:// or http(s):// URL, gst:PIPELINE, alsa:DEVICE or a .wav file."
        ),
    ],
    config: ConfigOption = DEFAULT_CONFIG,
    seconds: Annotated[float, typer.Option("--seconds", min=0.5, max=600, help="How long to read.")] = 3.0,
    as_json: JsonOption = False,
) -> None:
    """Read a source for a few seconds and say what came: frames, rate, size, errors. Exit 1 if nothing."""
    from agent.sources.check import check_source, source_config_for

    with _user_errors(as_json):
        pipelines = {p.name: p for p in _load(config).pipelines} if config.is_file() else {}
        chosen = pipelines[target].source if target in pipelines else source_config_for(target)
        report = check_source(chosen, seconds)
    if as_json:
        _echo_json(report)
    else:
        stats = report["stats"]
        typer.echo(f"source: {report['uri']} ({report['kind']}), {stats['state']}")
        if report["ok"]:
            typer.echo(
                f"received: {report['received']} in {report['seconds']} s ({report['per_second']}/s), "
                f"the first after {report['first_after_s']} s; each {report['shape']} {report['dtype']}"
            )
        counters = {
            k: v for k, v in stats.items() if k not in ("uri", "state", "error") and v not in (None, 0)
        }
        if counters:
            typer.echo("counters: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
        if stats["error"]:
            typer.echo(f"error: {stats['error']}", err=True)
    if not report["ok"]:
        raise typer.Exit(1)


@app.command()
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
    from agent.doctor import exit_code, report, run_doctor

    # The rows say what went wrong; the libraries' own warnings would only break up the table.
    setup_logging("error")
    checks = run_doctor(config, timeout)
    if as_json:
        _echo_json(report(checks))
    else:
        _print_doctor(checks)
    raise typer.Exit(exit_code(checks))


_SHA256 = re.compile(r"\b[0-9a-f]{64}\b")


def _print_doctor(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from agent.doctor import summary

    def shown(text: str) -> Text:
        return Text(_SHA256.sub(lambda m: m.group(0)[:12] + "…", text))  # --json has them whole

    styles = {"OK": "green", "WARN": "yellow", "FAIL": "bold red"}
    table = Table()
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")  # long paths wrap, never cut
    for check in checks:
        status = Text(check.status, style=styles[check.status])
        table.add_row(Text(check.name), status, shown(check.detail), shown(check.fix))
    console = Console()
    console.print(table)
    counts = summary(checks)
    _say(console, f"{counts['ok']} OK, {counts['warn']} WARN, {counts['fail']} FAIL")


@app.command()
def version() -> None:
    """Print the agent's version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
