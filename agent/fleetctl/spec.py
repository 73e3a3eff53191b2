"""Deploy specs (the operator's file) and the desired-state documents built from them.

A spec is YAML or JSON::

    pipelines:            # a list as in agent.yaml, or a mapping name -> pipeline (null removes)
      - name: door-cam
        model: {name: mobilenet, version: "2.1.0"}
        ...
    priority: 0           # optional
    health: {window_s: 30}
    expires_in_s: 604800
    agent: {version: 0.2.0}   # optional: the edge-agent release to run (docs/fleet.md)

Every document is checked with the devices' own parser (agent/fleet/document.py: the pipelines by
agent.yaml's models, plus what a document may not do, such as local model files) before it is
published, so the controller refuses what the devices would refuse, with the same messages
(`group:lobby: $.pipelines.door-cam.source.uri: ...`). Signatures are the devices' business.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from agent.clock import iso_utc
from agent.errors import ConfigError, DesiredStateError
from agent.fleet.document import parse_document
from agent.fleet.protocol import MAX_DOCUMENT_BYTES, SCHEMA_VERSION, encode
from agent.registry.signing import TrustPolicy

SPEC_KEYS = ("pipelines", "priority", "health", "expires_in_s", "agent")
Pipelines = dict[str, Any]  # name -> pipeline (as written, without `name`) or None (removes it)


@dataclass(frozen=True)
class DeploySpec:
    """A spec's pipelines as they go into the document, and the document's optional settings."""

    pipelines: Pipelines
    priority: Any = 0  # checked with the document
    health: Any = None
    expires_in_s: float | None = None
    source: str = "<spec>"
    problems: tuple[str, ...] = ()  # of its shape; `check_spec` reports them with the document's
    agent: Any = None  # the release to run; checked with the document


def load_spec(path: Path) -> DeploySpec:
    """Read a spec file: ConfigError when it is not YAML or JSON; any other problem is reported by
    `check_spec`, all of them at once."""
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
    raw = data.get("pipelines")
    pipelines: Pipelines = {}
    if isinstance(raw, dict):
        pipelines = dict(raw)  # keys are the names; the document check reads the rest
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str):
                problems.append(f"{source}: $.pipelines[{i}].name: required key is missing")
            elif name in pipelines:
                problems.append(f"{source}: $.pipelines[{i}].name: pipeline name {name!r} is used twice")
            else:
                pipelines[name] = {k: v for k, v in item.items() if k != "name"}
    else:
        problems.append(f"{source}: $.pipelines: required: a list of pipelines or a mapping name -> pipeline")
    expires = data.get("expires_in_s")
    if expires is not None and (type(expires) not in (int, float) or not 0 < expires < 10 * 365 * 86400):
        problems.append(f"{source}: $.expires_in_s: must be a positive number of seconds")
    if problems:
        expires = None
    return DeploySpec(
        pipelines,
        data.get("priority", 0),
        data.get("health"),
        expires,
        source,
        tuple(problems),
        agent=data.get("agent"),
    )


def check_spec(spec: DeploySpec, layer: str) -> None:
    """ConfigError naming the spec and listing every problem, unless it is well formed and the
    devices would accept its document for `layer`: checked before connecting, so an invalid spec
    publishes nothing."""
    document = build_document(
        layer,
        1,
        spec.pipelines,
        priority=spec.priority,
        health=spec.health,
        expires_in_s=spec.expires_in_s,
        agent=spec.agent,
    )
    try:
        check_document(encode(document), layer, f"{spec.source}: ")
    except ConfigError as exc:
        raise ConfigError([*spec.problems, *exc.problems], exc.hint) from None
    if spec.problems:
        raise ConfigError(
            list(spec.problems), hint="a spec has pipelines: and optionally " + ", ".join(SPEC_KEYS[1:])
        )


def check_document(payload: bytes, layer: str, where: str = "") -> None:
    """ConfigError unless a device would accept `payload` on `layer`'s topic (signatures aside):
    the devices' own parser, size limit included."""
    try:
        parse_document(payload, layer, TrustPolicy(), MAX_DOCUMENT_BYTES, time.time())
    except DesiredStateError as exc:
        raise ConfigError(
            [where + problem for problem in exc.problems],
            hint=exc.hint or "pipelines use the schema of agent.yaml's pipelines: (docs/fleet.md)",
        ) from None


def build_document(
    layer: str,
    generation: int,
    pipelines: Mapping[str, Any],
    *,
    priority: Any = 0,
    health: Any = None,
    expires_in_s: float | None = None,
    rollout: Mapping[str, Any] | None = None,
    agent: Any = None,
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
        document["health"] = health
    if rollout is not None:
        document["rollout"] = dict(rollout)
    if agent is not None:
        document["agent"] = agent
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
