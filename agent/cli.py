"""`edge-agent`: run, validate, publish and inspect. A thin layer over `agent/` functions.

Every command maps the agent's typed errors to a one-line message (plus hint) and exit 1;
`--json` prints machine-readable output for scripts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from agent import __version__
from agent.config import AgentConfig
from agent.errors import ConfigError, EdgeAgentError

DEFAULT_CONFIG = Path(os.environ.get("EDGE_AGENT_CONFIG", "/etc/edge-agent/agent.yaml"))

app = typer.Typer(
    help="edge-agent: run ML pipelines on edge boxes and report over MQTT.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Check agent.yaml files.", no_args_is_help=True)
registry_app = typer.Typer(help="Publish models to a registry.", no_args_is_help=True)
models_app = typer.Typer(help="Models in the local store.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(registry_app, name="registry")
app.add_typer(models_app, name="models")

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="Agent config file (env EDGE_AGENT_CONFIG).", show_default=True)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


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


def setup_logging(level: str) -> None:
    # Under systemd, journald adds the time and unit; elsewhere the time helps.
    with_time = "JOURNAL_STREAM" not in os.environ
    fmt = ("%(asctime)s " if with_time else "") + "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr, force=True)


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
) -> None:
    """Run every pipeline until SIGTERM/SIGINT (or --duration), then stop gracefully."""
    with _user_errors():
        cfg = _load(config)
    setup_logging(log_level or cfg.log_level)
    from agent.daemon import Agent

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("agent").info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with _user_errors():
        Agent(cfg).run(stop, duration_s=duration)


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


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of agent.yaml (for editors such as yaml-language-server)."""
    from agent.config_loader import config_json_schema

    _echo_json(config_json_schema())


# --- registry -----------------------------------------------------------------------------


@registry_app.command("publish")
def registry_publish(
    file: Annotated[
        Path, typer.Argument(help="Model file (.onnx, .tflite, .xml).", exists=True, dir_okay=False)
    ],
    name: Annotated[str, typer.Option("--name", help="Model name.")],
    version: Annotated[str, typer.Option("--version", help="Version (immutable once published).")],
    registry: Annotated[str, typer.Option("--registry", help="Registry URL, e.g. file:///srv/registry.")],
    target: Annotated[str, typer.Option("--target", help="Artifact target, e.g. any, edgetpu.")] = "any",
    metadata: Annotated[
        Path | None, typer.Option("--metadata", help="JSON file of metadata for the manifest (labels, ...).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing version.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Publish a model file as NAME@VERSION: copies it in and writes its manifest (sha256, size, format)."""
    from agent.registry import FileRegistry

    with _user_errors(as_json):
        extra = _read_json_file(metadata) if metadata else None
        manifest = FileRegistry.from_url(registry).publish(
            file, name, version, target=target, metadata=extra, force=force
        )
    if as_json:
        _echo_json(json.loads(manifest.to_bytes()))
    else:
        for artifact in manifest.artifacts:
            typer.echo(
                f"published {name}@{version} to {registry}: {artifact.file} "
                f"({artifact.format}, {artifact.size} bytes, sha256 {artifact.sha256})"
            )


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


StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="State directory (default: from the config).")
]


@models_app.command("list")
def models_list(
    config: ConfigOption = DEFAULT_CONFIG, state_dir: StateDirOption = None, as_json: JsonOption = False
) -> None:
    """Model versions installed in the local store."""
    from agent.store import ModelStore

    with _user_errors(as_json):
        installed = ModelStore(_state_dir(config, state_dir) / "store").list()
    rows: list[dict[str, Any]] = [
        {
            "name": m.name,
            "version": m.version,
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

    table = Table("model", "version", "file", "format", "size", "sha256")
    for row in rows:
        for a in row["artifacts"]:
            size, digest = f"{a['size']:,}", a["sha256"][:16]
            table.add_row(row["name"], row["version"], a["file"], a["format"], size, digest)
    Console().print(table)


@models_app.command("pull")
def models_pull(config: ConfigOption = DEFAULT_CONFIG, as_json: JsonOption = False) -> None:
    """Pull every model version the config's pipelines name into the store (verified)."""
    from agent.registry import open_registry
    from agent.store import ModelStore

    pulled = []
    with _user_errors(as_json):
        cfg = _load(config)
        if cfg.registry is None:
            raise EdgeAgentError(f"{config}: no registry configured")
        registry = open_registry(cfg.registry.url)
        store = ModelStore(cfg.state_dir / "store")
        for ref in {(p.model.name, p.model.version) for p in cfg.pipelines}:
            installed = store.pull(registry, *ref)
            pulled.append({"name": installed.name, "version": installed.version})
            if not as_json:
                typer.echo(f"ok: {installed.name}@{installed.version}")
    if as_json:
        _echo_json(pulled)


@app.command()
def version() -> None:
    """Print the agent's version."""
    typer.echo(__version__)


def main() -> None:
    app()
