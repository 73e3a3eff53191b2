"""`edge-agent explain NAME`: where a pipeline's (or a model's) backend is, and why.

The answer comes from where the truth is:
1. a running daemon (its control socket): the decision each serving stage follows now, after any
   background proof, fleet swap, rollback or fallback;
2. else the current choice (agent/backend_choice.py `current_choice`), the one every start and
   tool takes: the cached proven decision, or what a first start would serve, with the candidates
   it would prove next in their order;
3. else the decision records the daemon left for pipelines no longer in the config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, PipelineConfig
from agent.errors import EdgeAgentError

Record = dict[str, Any]


def explain(name: str, config: AgentConfig | None, config_path: Path, state_dir: Path | None) -> list[Record]:
    """The records `edge-agent explain` shows for NAME: a pipeline, a model NAME[@VERSION] in the
    store, or a model file. EdgeAgentError when NAME is none of them."""
    from agent.backend_choice import DecisionStore
    from agent.tools.infer.inputs import is_model_file_name

    if is_model_file_name(name):
        if not Path(name).is_file():
            raise EdgeAgentError(f"{name}: no such model file")
        with _settings(config, state_dir) as settings:
            return [_prospective(settings, None, name, name)]
    if config is None and state_dir is None:
        raise EdgeAgentError(f"no config at {config_path}", hint="give -c CONFIG or --state-dir DIR")
    states = state_dir or (config.state_dir if config is not None else Path("."))
    live = _live(states)
    if live is not None:
        found = [r for r in live if _names(r, name)]
        if found:
            return found
    pipelines = {p.name: p for p in config.pipelines} if config is not None else {}
    named = [p for p in pipelines.values() if name in (p.name, _spec(p), p.model.name)]
    if config is not None and named:
        with _settings(config, states) as settings:
            return [_prospective(settings, p, _spec(p), p.name) for p in named]
    recorded = [r for r in DecisionStore(states).all_pipelines() if _names(r, name)]
    if recorded:
        return recorded
    if config is not None or state_dir is not None:
        from agent.store import ModelStore
        from agent.tools.inventory import resolve_model

        try:
            resolve_model(name, ModelStore(states / "store"))
        except EdgeAgentError:
            known = ", ".join(sorted(pipelines)) or "none"
            raise EdgeAgentError(
                f"no pipeline {name!r} in {config_path} and no model {name!r} in the store "
                f"(its pipelines: {known})",
                hint="give a pipeline name from the config, a model NAME@VERSION, or a model file",
            ) from None
        with _settings(config, states) as settings:
            return [_prospective(settings, None, name, name)]
    raise EdgeAgentError(f"nothing named {name!r}")


def _spec(pipeline: PipelineConfig) -> str:
    """The pipeline's model as `resolve_model` takes it: a file, or NAME@VERSION."""
    model = pipeline.model
    return str(model.path) if model.path is not None else f"{model.name}@{model.version}"


def _names(record: Record, name: str) -> bool:
    model = str(record.get("model", ""))
    return name in (record.get("pipeline"), model, model.split("@")[0])


def _live(state_dir: Path) -> list[Record] | None:
    """The running daemon's serving records; None when no daemon answers."""
    from agent.control import NotRunning, ask, socket_path

    if not socket_path(state_dir).exists():
        return None
    try:
        reply = ask(socket_path(state_dir), "explain", timeout=5.0)
    except NotRunning:
        return None
    records = reply.get("explain", {}).get("pipelines")
    return records if isinstance(records, list) else None


@contextlib.contextmanager
def _settings(config: AgentConfig | None, state_dir: Path | None) -> Iterator[AgentConfig]:
    """The agent's settings at `state_dir` (else the config's); the defaults in a scratch dir when
    there is neither."""
    from agent.tools.infer.choice import settings_for, state_or_scratch

    with state_or_scratch(state_dir or (config.state_dir if config is not None else None)) as states:
        yield settings_for(config, states)


def _prospective(settings: AgentConfig, pipeline: PipelineConfig | None, spec: str, label: str) -> Record:
    """Where the model would run on this box now: the cached decision, else what a first start
    serves and the candidates ranked behind it (what a sample proves next)."""
    from agent.backend_choice import current_choice
    from agent.store import ModelStore
    from agent.tools.inventory import resolve_model
    from providers import NoBackendError

    try:
        resolved = resolve_model(spec, ModelStore(settings.state_dir / "store"))
    except EdgeAgentError as exc:
        raise EdgeAgentError(
            f"{'pipeline ' + label if pipeline is not None else label}: {exc.message}",
            hint="a registry model is pulled when `edge-agent run` starts the pipeline (edge-agent models "
            "pull -c CONFIG fetches it now)",
        ) from None
    record: Record = {"pipeline": pipeline.name if pipeline is not None else None, "model": resolved.ref}
    try:
        choice = current_choice(
            settings, pipeline, resolved.artifacts, resolved.ref, resolved.testdata, screen_all=True
        )
    except NoBackendError as exc:
        record.update(refused=str(exc), candidates=[asdict(c) for c in exc.candidates])
        return record
    record.update(decision=choice.decision.to_dict(), prospective=not choice.cached, serving=choice.summary())
    return record
