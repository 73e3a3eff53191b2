"""The model `infer` runs (a file, or NAME[@VERSION] in the store, with its hints), the pipeline
settings it is processed with, and the backend: asked for, chosen as the agent would, or proven here."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.backend_choice import Box, Choice, current_choice, load_choice, model_candidates, prove_on
from agent.config import (
    AgentConfig,
    AudioPreprocessConfig,
    AudioSourceConfig,
    PipelineConfig,
)
from agent.errors import EdgeAgentError, ModelError
from agent.registry.manifest import Manifest
from agent.store import ModelStore
from agent.testdata import TestData
from agent.tools.infer.inputs import NAMED, PICTURES, first_feeds, is_model_file_name
from agent.tools.inventory import resolve_model
from providers import (
    Backend,
    BackendError,
    Decision,
    ModelArtifact,
    NoBackendError,
    SelectionPolicy,
    Session,
    TensorSpec,
    decide,
    get_backend,
)

_IMAGE_DTYPES = ("float32", "float16", "uint8", "int8")  # what preprocess.dtype can be
DEFAULT_TOP_K = 5


@dataclass(frozen=True)
class ResolvedModel:
    ref: str
    name: str
    version: str
    artifacts: list[ModelArtifact]
    testdata: list[TestData]
    manifest: Manifest | None  # None: a bare model file


def resolve(spec: str, store: ModelStore) -> ResolvedModel:
    """A model file, or NAME[@VERSION] installed in `store` (with its manifest's hints)."""
    if is_model_file_name(spec) and not Path(spec).is_file():
        raise EdgeAgentError(f"{spec}: no such model file")
    found = resolve_model(spec, store)
    if Path(spec).is_file():
        return ResolvedModel(found.ref, Path(spec).name, "file", found.artifacts, found.testdata, None)
    name, _, version = found.ref.partition("@")
    installed = store.get(name, version)
    return ResolvedModel(found.ref, name, version, found.artifacts, found.testdata, installed.manifest)


def pipeline_config(
    agent: AgentConfig | None, name: str | None, config_path: Path | None, kind: str, input_path: Path
) -> PipelineConfig:
    """The named pipeline's settings (checked against the kind of input), else a bare one whose
    processing the model's hints and defaults fill in (`default_processing`)."""
    if name is not None:
        config = named_pipeline(agent, name, config_path)
        audio = isinstance(config.preprocess, AudioPreprocessConfig)
        if kind in PICTURES and audio:
            wants = "a WAV file" if isinstance(config.source, AudioSourceConfig) else "a .npy or .npz"
            raise EdgeAgentError(
                f"pipeline {name} takes {config.source.type} windows, not {NAMED[kind]}: give it {wants}"
            )
        if kind == "audio" and not isinstance(config.source, AudioSourceConfig):
            raise EdgeAgentError(
                f"pipeline {name} reads a {config.source.type} source: a WAV file is for a pipeline "
                "with an audio source"
            )
        return config
    if kind == "audio":
        raise EdgeAgentError(
            f"{input_path}: a WAV file needs an audio pipeline for its windows, context and state",
            hint="give --pipeline NAME -c CONFIG, NAME a pipeline with an audio source",
        )
    return bare_pipeline("infer", str(input_path))


def named_pipeline(agent: AgentConfig | None, name: str, config_path: Path | None) -> PipelineConfig:
    """The config's pipeline called `name`; EdgeAgentError listing the ones it has."""
    pipelines = {p.name: p for p in agent.pipelines} if agent is not None else {}
    if name not in pipelines:
        known = ", ".join(sorted(pipelines)) or "none"
        raise EdgeAgentError(f"no pipeline named {name!r} in {config_path} (its pipelines: {known})")
    return pipelines[name]


def bare_pipeline(name: str, uri: str) -> PipelineConfig:
    """A pipeline with no settings of its own: the model's hints and defaults fill it in."""
    return PipelineConfig.model_validate(
        {
            "name": name,
            "model": {"name": name, "version": "1"},
            "source": {"type": "video", "uri": uri},
            "postprocess": {"type": "raw"},
        }
    )


def model_labels(model: ResolvedModel, embedded: Mapping[str, Any]) -> list[str] | None:
    """Class names the version's manifest gives, else the model file's own metadata."""
    for source in (model.manifest.metadata if model.manifest is not None else {}, embedded):
        labels = source.get("labels")
        if isinstance(labels, list) and labels:
            return [str(label) for label in labels]
    return None


def default_processing(
    config: PipelineConfig,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    labels: list[str] | None,
) -> PipelineConfig:
    """A bare pipeline (after the hints) completed for this model: preprocess keys nobody set taken
    from the image input (which input, layout, grey or colour, dtype), and the postprocess the
    outputs and labels suggest (`default_postprocess`)."""
    raw = config.model_dump(exclude_unset=True)
    preprocess: dict[str, Any] = raw.setdefault("preprocess", {})
    images = [spec for spec in inputs if len(spec.shape) == 4]
    if len(images) == 1:
        image = images[0]
        if len(inputs) > 1:
            preprocess.setdefault("input", image.name)
        channels_last = image.fixed_dim(3) in (1, 3) and image.fixed_dim(1) not in (1, 3)
        layout = preprocess.setdefault("layout", "nhwc" if channels_last else "nchw")
        if image.fixed_dim(3 if layout == "nhwc" else 1) == 1:
            preprocess.setdefault("color", "gray")
        if image.dtype in _IMAGE_DTYPES:
            preprocess.setdefault("dtype", image.dtype)
    raw["postprocess"] = default_postprocess(outputs, labels)
    return PipelineConfig.model_validate(raw)


def default_postprocess(outputs: Sequence[TensorSpec], labels: list[str] | None) -> dict[str, Any]:
    """detection (YOLOv8: [1, 4 + classes, N]) or classification ([1, classes]) when the model's
    labels fit its first output so; else raw (summarised)."""
    if labels and outputs:
        shape = outputs[0].shape
        if len(outputs) == 1 and len(shape) == 3 and shape[1] == 4 + len(labels):
            return {"type": "detection", "format": "yolov8", "labels": labels}
        classes = [d for d in shape[1:] if d != 1] if len(shape) > 1 else list(shape)
        if classes == [len(labels)]:
            return {"type": "classification", "labels": labels, "top_k": min(DEFAULT_TOP_K, len(labels))}
    return {"type": "raw"}


def looks_like_probabilities(values: np.ndarray) -> bool:
    """Scores that already sum to 1 (a softmax inside the model): softmax again would flatten them."""
    scores = np.asarray(values, dtype=np.float64).reshape(-1)
    return bool(
        scores.size > 1
        and np.isfinite(scores).all()
        and scores.min() >= 0
        and scores.max() <= 1
        and abs(scores.sum() - 1) < 1e-3
    )


@dataclass
class Loaded:
    session: Session
    choice: Choice  # what this box runs the model on (the forced backend's, with --backend)
    how: str  # how the backend was chosen, for people
    rejected: str | None = None  # --backend X that proving the candidates rejected: why

    @property
    def decision(self) -> Decision:
        return self.choice.decision


@contextlib.contextmanager
def state_or_scratch(state_dir: Path | None) -> Iterator[Path]:
    """The state dir decisions are cached in; a scratch one (nothing kept) without one."""
    if state_dir is not None:
        yield state_dir
        return
    with tempfile.TemporaryDirectory(prefix="edge-agent-state-") as scratch:
        yield Path(scratch)


def proven_here(
    loaded: Loaded,
    settings: AgentConfig,
    config: PipelineConfig,
    model: ResolvedModel,
    kind: str,
    input_path: Path,
    picture: np.ndarray | None,
) -> Loaded:
    """The candidates proven on this input (and the version's test data), the fastest correct one
    loaded in place of `loaded` (closed). The proof is cached only under the policy it was made by
    (not one with benchmarking off)."""
    choice = loaded.choice
    sample = first_feeds(config, loaded.session, kind, input_path, picture)
    proving = replace(choice, policy=replace(choice.policy, benchmark=True))
    try:
        proven = prove_on(
            settings,
            config,
            proving,
            sample,
            model.testdata,
            "this input",
            False,
            cache=choice.policy.benchmark,
        )
        session, proven = load_choice(proven, f"infer {model.ref}")
    except BackendError as exc:
        raise ModelError(f"{model.ref}: proving the candidates on this input: {exc}") from None
    loaded.session.close()
    return Loaded(session, proven, _how(proven))


def pipeline_on(agent: AgentConfig | None, model: ResolvedModel) -> PipelineConfig | None:
    """The config's first pipeline on this model version (its backend settings rule where it runs)."""
    for candidate in agent.pipelines if agent is not None else []:
        path = candidate.model.path
        if model.manifest is None:  # a model file: the pipeline that names it by path
            if path is not None and model.artifacts and Path(path).resolve() == model.artifacts[0].path:
                return candidate
        elif (candidate.model.name, candidate.model.version) == (model.name, model.version):
            return candidate
    return None


def settings_for(agent: AgentConfig | None, state_dir: Path) -> AgentConfig:
    """The agent's settings (selection policy, where decisions are cached), or the defaults with
    `state_dir` for a model run without a config."""
    if agent is not None:
        return agent if agent.state_dir == state_dir else agent.model_copy(update={"state_dir": state_dir})
    return AgentConfig.model_validate({"device": {"id": "local"}, "state_dir": str(state_dir)})


def load_backend(
    model: ResolvedModel,
    settings: AgentConfig,
    pipeline: PipelineConfig | None,
    wanted: str | None,
) -> Loaded:
    """Load the model where this box runs it (`current_choice`: the cached proven decision, else
    what a first start serves), or on `wanted` (--backend), on the artifact it reads (an upgraded
    twin where it refuses the file as it is)."""
    box = Box.here(settings)
    try:
        if wanted is not None:
            return _load_forced(model, settings, pipeline, wanted, box)
        choice = current_choice(settings, pipeline, model.artifacts, model.ref, model.testdata, box)
        session, choice = load_choice(choice, f"infer {model.ref}")
    except BackendError as exc:
        raise ModelError(str(exc)) from None
    return Loaded(session, choice, _how(choice))


def _load_forced(
    model: ResolvedModel, settings: AgentConfig, pipeline: PipelineConfig | None, wanted: str, box: Box
) -> Loaded:
    backend = _available(wanted)
    try:
        current: Choice | None = current_choice(
            settings, pipeline, model.artifacts, model.ref, model.testdata, box
        )
    except NoBackendError:
        current = None
    artifacts = current.artifacts if current is not None else model_candidates(settings, model.artifacts, box)
    try:
        decision = decide(artifacts, SelectionPolicy(benchmark=False), None, [backend])
    except NoBackendError as exc:
        reasons = "; ".join(f"{c.artifact}: {c.reason}" for c in exc.candidates)
        raise ModelError(f"{wanted} cannot run {model.ref}: {reasons}") from None
    decision.note = "as asked (--backend)"
    rejected = None
    if current is not None:
        report = next(
            (c for c in current.decision.candidates if c.backend == wanted and c.verdict == "rejected"), None
        )
        if report is not None and current.proven:
            rejected = f"{report.artifact}: {report.reason}"
    policy = current.policy if current is not None else SelectionPolicy()
    forced = Choice(model.ref, decision, artifacts, policy, box, key="")
    session, forced = load_choice(forced, f"infer {model.ref}")
    how = "as asked (--backend)"
    if rejected:
        how += f"; proving the candidates on this box rejected it: {rejected}"
    return Loaded(session, forced, how, rejected)


def artifact_run(loaded: Loaded, backend: str) -> str:
    """The artifact the session runs: the decision's, or its fallback's when another backend loaded."""
    return loaded.decision.artifact_on(backend) or loaded.decision.artifact


def _how(choice: Choice) -> str:
    """How the choice came about, in one line (`edge-agent explain` has the table)."""
    decision = choice.decision
    if choice.proven:
        chosen = next((c for c in decision.candidates if c.verdict == "chosen"), None)
        speed = f", {chosen.median_ms:.2f} ms median" if chosen and chosen.median_ms is not None else ""
        correct = sum(1 for c in decision.candidates if c.verdict in ("chosen", "passed"))
        how = f"the fastest of {correct} candidate(s) whose outputs match {decision.proof()}{speed}"
    else:
        how = decision.note
    if choice.cached:
        return f"the agent's decision for this model on this box (cached): {how}"
    if choice.proven:
        return f"benchmarked on {decision.inputs or 'a sample'}: {how}"
    if choice.full_precision_reference and choice.policy.benchmark:
        return (
            "not proven yet: the full-precision CPU reference, as the daemon serves on a first start "
            "(--benchmark proves the candidates on this input)"
        )
    return f"not proven: {how}"


def _available(name: str) -> Backend:
    try:
        backend = get_backend(name)
    except KeyError as exc:
        raise EdgeAgentError(str(exc.args[0]), hint="edge-agent providers lists them") from None
    probe = backend.probe()
    if not probe.available:
        raise EdgeAgentError(
            f"backend {name} is not available here: {probe.reason}",
            hint="edge-agent providers says which backends this box has",
        )
    return backend
