"""`edge-agent explain NAME`: where a pipeline's (or a model's) backend is, and why.

The answer comes from where the truth is:
1. a running daemon (its control socket): the decision each serving stage follows now, after any
   background proof, fleet swap, rollback or fallback;
2. else the current choice (agent/backend_choice.py `current_choice`), the one every start and
   tool takes: the cached proven decision, or what a first start would serve, with the candidates
   it would prove next in their order;
3. else the decision records the daemon left for pipelines no longer in the config.

A pipeline with `attributes:` has a record for each second model after its own (`attribute`: the
attribute's name): the daemon's status says where it serves now (and why one could not load), the
decision it follows is the record the build left under `<pipeline>.<attribute>`; without a daemon,
where the next start would run it, as for the primary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, AttributeConfig, ModelRef, PipelineConfig
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
            return _with_live_attributes(found, states, config)
    pipelines = {p.name: p for p in config.pipelines} if config is not None else {}
    named = [p for p in pipelines.values() if name in (p.name, _spec(p), p.model.name)]
    if config is not None and named:
        with _settings(config, states) as settings:
            records = []
            for pipeline in named:
                records.append(_prospective(settings, pipeline, _spec(pipeline), pipeline.name))
                records += [_prospective_attribute(settings, pipeline, a) for a in pipeline.attributes]
            return records
    every = DecisionStore(states).all_pipelines()
    recorded = [r for r in every if _names(r, name)]
    if recorded:
        return _with_recorded_attributes(recorded, every)
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


def _model_spec(model: ModelRef) -> str:
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


def _live_attributes(state_dir: Path) -> dict[str, dict[str, Any]]:
    """Per running pipeline, its second models as the daemon's status shows them (`steps.attributes`:
    model, backend, precision, why; or the error that left one out); {} when no daemon answers."""
    from agent.control import NotRunning, ask, socket_path

    try:
        reply = ask(socket_path(state_dir), "status", timeout=5.0)
    except NotRunning:
        return {}
    pipelines = reply.get("status", {}).get("pipelines") or {}
    return {
        name: dict((status.get("steps") or {}).get("attributes") or {})
        for name, status in pipelines.items()
        if isinstance(status, dict)
    }


def _with_live_attributes(records: list[Record], state_dir: Path, config: AgentConfig | None) -> list[Record]:
    """The daemon's records, each pipeline's followed by its second models' (`_live_attributes`, in the
    config's order where it names them), with the decision each one's build recorded."""
    from agent.backend_choice import DecisionStore

    attributes = _live_attributes(state_dir)
    configured = {p.name: {a.name: a for a in p.attributes} for p in config.pipelines} if config else {}
    store = DecisionStore(state_dir)
    out: list[Record] = []
    for record in records:
        out.append(record)
        pipeline = str(record.get("pipeline"))
        shown = attributes.get(pipeline, {})
        named = configured.get(pipeline, {})
        for attribute in sorted(shown, key=lambda a: list(named).index(a) if a in named else len(named)):
            said = shown[attribute]
            model = said.get("model") or (_model_spec(named[attribute].model) if attribute in named else None)
            entry: Record = {"pipeline": pipeline, "attribute": attribute, "model": model, "live": True}
            if "error" in said:
                entry["error"] = said["error"]
            else:
                entry["serving"] = {k: said.get(k) for k in ("backend", "precision", "why")}
                decided = store.for_pipeline(f"{pipeline}.{attribute}")
                if decided is not None and "decision" in decided:
                    entry["decision"] = decided["decision"]
            out.append(entry)
    return out


def _with_recorded_attributes(records: list[Record], every: list[Record]) -> list[Record]:
    """The records the daemon left, each pipeline's followed by those of its second models (recorded
    under `<pipeline>.<attribute>`)."""
    out: list[Record] = []
    for record in records:
        if record in out:
            continue
        out.append(record)
        prefix = f"{record.get('pipeline')}."
        for other in every:
            name = str(other.get("pipeline"))
            if name.startswith(prefix) and other not in out:
                out.append({**other, "pipeline": record.get("pipeline"), "attribute": name[len(prefix) :]})
    return out


def _prospective_attribute(
    settings: AgentConfig, pipeline: PipelineConfig, attribute: AttributeConfig
) -> Record:
    """Where the attribute's model would run on this box now, chosen under the pipeline config the
    daemon chooses it under (`attribute_pipeline`); its `error` when it is not to be had."""
    from agent.attribute_models import attribute_pipeline

    spec = _model_spec(attribute.model)
    base: Record = {"pipeline": pipeline.name, "attribute": attribute.name}
    try:
        record = _prospective(
            settings,
            attribute_pipeline(pipeline, attribute),
            spec,
            f"{pipeline.name} attribute {attribute.name}",
        )
    except EdgeAgentError as exc:
        return {**base, "model": spec, "error": exc.message}
    return {**base, **{k: v for k, v in record.items() if k != "pipeline"}}


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
