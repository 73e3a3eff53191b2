"""Deploy specs (the operator's file) and the desired-state documents built from them.

A spec is YAML or JSON::

    pipelines:            # a list as in agent.yaml, or a mapping name -> pipeline (null removes)
      - name: door-cam
        model: {name: mobilenet, version: "2.1.0"}
        ...
    priority: 0           # optional
    health: {window_s: 30}
    expires_in_s: 604800

Every pipeline is validated with the agent's own models before anything is published, and errors
name JSON paths the way devices name them in a refusal (`$.pipelines.door-cam.source.uri: ...`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agent.clock import iso_utc
from agent.config import PipelineConfig

# The agent.yaml error wording (unknown keys with suggestions, missing 'type' with the choices),
# so a spec reads the same as `edge-agent config validate`.
from agent.config_loader import _data_path, _message
from agent.errors import ConfigError
from agent.fleet.protocol import MAX_DOCUMENT_BYTES, SCHEMA_VERSION

SPEC_KEYS = ("pipelines", "priority", "health", "expires_in_s")
Pipelines = dict[str, dict[str, Any] | None]


@dataclass(frozen=True)
class DeploySpec:
    """A validated spec: pipelines as they go into the document (name -> pipeline without `name`,
    None removes), and the document's optional settings."""

    pipelines: Pipelines
    priority: int = 0
    health: dict[str, Any] | None = None
    expires_in_s: float | None = None
    source: str = "<spec>"


def load_spec(path: Path) -> DeploySpec:
    """Read and validate a spec file; ConfigError listing every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read the deploy spec: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML or JSON: {exc}"]) from None
    return parse_spec(data, str(path))


def parse_spec(data: Any, source: str = "<spec>") -> DeploySpec:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: a deploy spec is a mapping with 'pipelines'"])
    problems = [
        f"{source}: $.{key}: unknown key (allowed: {', '.join(SPEC_KEYS)})"
        for key in data
        if key not in SPEC_KEYS
    ]
    pipelines = _pipelines(data.get("pipelines"), source, problems)
    priority = data.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        problems.append(f"{source}: $.priority: must be an integer (got {priority!r})")
    health = data.get("health")
    if health is not None and not isinstance(health, dict):
        problems.append(f"{source}: $.health: must be a mapping such as {{window_s: 30}}")
    expires = data.get("expires_in_s")
    if expires is not None and (
        not isinstance(expires, (int, float)) or isinstance(expires, bool) or expires <= 0
    ):
        problems.append(f"{source}: $.expires_in_s: must be a positive number of seconds")
    if problems:
        raise ConfigError(problems, hint="pipelines use the schema of agent.yaml's pipelines:")
    return DeploySpec(pipelines, priority, health, expires, source)


def _pipelines(raw: Any, source: str, problems: list[str]) -> Pipelines:
    """name -> pipeline (without `name`) from a list or a mapping; problems appended, not raised,
    so one run lists every mistake."""
    entries: list[tuple[str, Any]] = []
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str):
                problems.append(f"{source}: $.pipelines[{i}].name: required key is missing")
                continue
            if any(name == seen for seen, _ in entries):
                problems.append(f"{source}: $.pipelines[{i}].name: pipeline name {name!r} is used twice")
                continue
            entries.append((name, {k: v for k, v in item.items() if k != "name"}))
    elif isinstance(raw, dict):
        for name, item in raw.items():
            if isinstance(item, dict) and "name" in item and item["name"] != name:
                problems.append(f"{source}: $.pipelines.{name}.name: differs from its key; leave it out")
                continue
            entries.append((str(name), None if item is None else _without_name(item)))
    else:
        problems.append(f"{source}: $.pipelines: required: a list of pipelines or a mapping name -> pipeline")
    pipelines: Pipelines = {}
    for name, item in entries:
        if item is not None:
            problems.extend(_check_pipeline(name, item, source))
        pipelines[name] = item
    return pipelines


def _without_name(item: Any) -> Any:
    return {k: v for k, v in item.items() if k != "name"} if isinstance(item, dict) else item


def _check_pipeline(name: str, item: Any, source: str) -> list[str]:
    where = f"{source}: $.pipelines.{name}"
    if not isinstance(item, dict):
        return [f"{where}: must be a mapping (a pipeline) or null (remove it)"]
    candidate = {"name": name, **item}
    try:
        PipelineConfig.model_validate(candidate)
    except ValidationError as exc:
        # Paths are walked from agent.yaml's top so the error wording knows each model's keys.
        wrapper = {"pipelines": [candidate]}
        problems = []
        for error in exc.errors(include_url=False):
            path, missing_leaf = _data_path(("pipelines", 0, *error["loc"]), wrapper)
            inner = path[2:]
            dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in inner)
            if inner == ("name",):  # the key is the name
                dotted = ""
            problems.append(f"{where}{dotted}: {_message(error, path, missing_leaf, wrapper)}")
        return problems
    return []


# --- documents ---------------------------------------------------------------------------------


def build_document(
    layer: str,
    generation: int,
    pipelines: Mapping[str, Any],
    *,
    priority: int = 0,
    health: Mapping[str, Any] | None = None,
    expires_in_s: float | None = None,
    rollout: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """A desired-state document (docs/fleet.md) for `layer` ("group:<g>" or "device:<id>")."""
    issued = time.time() if now is None else now
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "target": layer,
        "generation": generation,
        "priority": priority,
        "issued_at": iso_utc(issued),
        "pipelines": dict(pipelines),
    }
    if expires_in_s is not None:
        document["expires_at"] = iso_utc(issued + expires_in_s)
    if health is not None:
        document["health"] = dict(health)
    if rollout is not None:
        document["rollout"] = dict(rollout)
    return document


def lifetime_s(document: Mapping[str, Any]) -> float | None:
    """expires_at - issued_at of a document (None without both), so a rollback keeps the lifetime."""
    try:
        issued = _parse_time(document["issued_at"])
        expires = _parse_time(document["expires_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return max(expires - issued, 1.0)


def _parse_time(value: Any) -> float:
    if not isinstance(value, str):
        raise TypeError(value)
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def check_size(payload: bytes, what: str) -> None:
    if len(payload) > MAX_DOCUMENT_BYTES:
        raise ConfigError(
            [f"{what} is {len(payload)} bytes; devices refuse documents over {MAX_DOCUMENT_BYTES}"],
            hint="deploy fewer pipelines per document (a group and device documents layer)",
        )
