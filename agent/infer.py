"""`edge-agent infer MODEL INPUT`: one input through a model with the pre- and postprocessing a
pipeline would give it, to try a model (or a pipeline's settings) before the daemon runs it.

The input goes through the daemon's own code: a `Stage` (agent/pipeline.py) built from the
pipeline's config completed by the model's hints (agent/model_hints.py), each frame through
`Stage.run_frame`, the pipeline's per-frame path, and the pipeline's report rules. Inputs:

- an image (OpenCV reads it) or one frame of a video file (decoded with OpenCV): one result;
- a WAV file, for a pipeline with an audio source: the file cut into that source's windows as a
  file source cuts them, every window run in order (recurrent state carried), and the results the
  pipeline would publish (its report rules decide, on the windows' positions in the file);
- a .npy array (a single-input model) or a .npz of arrays named after the model's inputs: fed to
  the model as they are, with no preprocessing; postprocessing applies (boxes in model-input pixels).

Without a pipeline, the model's own hints decide (labels and preprocessing: a YOLO export carries
both): an output shaped like YOLOv8 detections or class scores for those labels is read as such.
Otherwise the image defaults apply (the model's input size, layout and dtype; RGB scaled to 0..1)
and each output is summarised (shape, dtype, min, max, mean, argmax of a vector).

The backend: the one asked for; else where this box runs the model (`current_choice`: the agent's
cached decision, else the full-precision reference a first start serves); the candidates are proven
on this input first with `benchmark`, or where that choice would be an unchecked guess.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.backend_choice import Box, Choice, current_choice, load_choice, model_candidates, prove_on
from agent.config import (
    AgentConfig,
    AudioPreprocessConfig,
    AudioSourceConfig,
    ClassificationPostprocess,
    PipelineConfig,
)
from agent.errors import EdgeAgentError, ModelError
from agent.inventory import resolve_model
from agent.model_hints import embedded_hints, with_model_hints
from agent.pipeline import FrameRun, LoadedModel, Stage
from agent.processing import Postprocessor, build_postprocessor
from agent.processing.feed import AudioFeeder, ImageFeeder
from agent.registry.file_registry import SUFFIX_FORMATS
from agent.registry.manifest import Manifest
from agent.rules import ReportRules
from agent.sources import read_wav
from agent.sources.audio import audio_windows
from agent.store import ModelStore
from agent.testdata import TestData, load_testdata
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
from providers.select import feeds_problem, reference_session

log = logging.getLogger(__name__)

INPUT_KINDS: dict[str, tuple[str, ...]] = {
    "image": (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm", ".pnm"),
    "video": (".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".gif"),
    "audio": (".wav",),
    "tensor": (".npy", ".npz"),
}
PICTURES = ("image", "video")  # inputs there is something to draw on
_NAMED = {"image": "an image", "video": "a video", "audio": "a WAV file", "tensor": "a tensor file"}
_IMAGE_DTYPES = ("float32", "float16", "uint8", "int8")  # what preprocess.dtype can be
DEFAULT_TOP_K = 5


@dataclass
class InferResult:
    """What one `infer` gave: `output` for an image, a video frame or tensors (the dict a pipeline
    result's `output` holds); `results` for a WAV file (what the pipeline would publish)."""

    model: str
    input: str
    kind: str
    backend: str
    precision: str
    backend_choice: str
    latency_ms: dict[str, float]
    artifact: str = ""  # the model file run (an upgraded twin is named so)
    proven: bool = False  # the backend's outputs were checked on this box (test data, an input)
    rejected: str | None = None  # --backend X: why proving the candidates here rejected it
    output: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None  # every output tensor summarised (of the last run)
    pipeline: str | None = None
    frame: int | None = None
    held_back_by: str | None = None  # the report rule that would keep this result from publishing
    results: list[dict[str, Any]] | None = None
    windows: int | None = None
    held_back: dict[str, int] | None = None
    raw_outputs: dict[str, Any] | None = None
    note: str = ""
    picture: np.ndarray | None = None  # the image the model saw (BGR), for --draw

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "input": self.input,
            "kind": self.kind,
            "pipeline": self.pipeline,
            "backend": self.backend,
            "precision": self.precision,
            "artifact": self.artifact,
            "proven": self.proven,
            "backend_choice": self.backend_choice,
            "latency_ms": self.latency_ms,
        }
        if self.rejected is not None:
            data["rejected"] = self.rejected
        if self.frame is not None:
            data["frame"] = self.frame
        if self.results is not None:
            data.update(windows=self.windows, results=self.results, held_back=self.held_back)
        else:
            data.update(output=self.output, held_back_by=self.held_back_by)
        if self.note:
            data["note"] = self.note
        if self.raw_outputs is not None:
            data["raw_outputs"] = self.raw_outputs
        return data


def input_kind(path: Path) -> str:
    """image, video, audio or tensor, by the file's suffix; EdgeAgentError for anything else."""
    if not path.exists():
        raise EdgeAgentError(f"input {path} does not exist")
    if not path.is_file():
        raise EdgeAgentError(f"input {path} is not a file")
    suffix = path.suffix.lower()
    for kind, suffixes in INPUT_KINDS.items():
        if suffix in suffixes:
            return kind
    raise EdgeAgentError(
        f"{path}: unknown input type {suffix or '(no suffix)'!r}",
        hint="infer takes an image (.jpg, .png, ...), a video (.mp4, .mkv, ...), a WAV file (.wav) "
        "or a tensor (.npy, .npz)",
    )


def is_model_file_name(spec: str) -> bool:
    """MODEL names a file (a path, or a model suffix) rather than a store NAME[@VERSION]."""
    return Path(spec).is_file() or "/" in spec or Path(spec).suffix.lower() in SUFFIX_FORMATS


def read_image(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise EdgeAgentError(f"{path}: OpenCV cannot read this image (a damaged file, or not an image)")
    return image


def read_video_frame(path: Path, index: int) -> np.ndarray:
    """Frame `index` (0 = the first) of a video file, decoded with OpenCV frame by frame (exact,
    unlike a seek to a keyframe)."""
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise EdgeAgentError(f"{path}: OpenCV cannot open this video (a damaged file, or no codec)")
        for decoded in range(index):
            if not capture.grab():
                raise EdgeAgentError(f"{path} has {decoded} frames: there is no frame {index}")
        ok, frame = capture.read()
        if not ok or frame is None:
            raise EdgeAgentError(f"{path} has {index} frames: there is no frame {index}")
        return np.asarray(frame)
    finally:
        capture.release()


def read_tensors(path: Path, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """A .npy (the one input of a single-input model) or a .npz (arrays named after the inputs),
    checked against the model's inputs; floats are cast to the float type the model takes."""
    if path.suffix.lower() == ".npy":
        if len(inputs) != 1:
            names = ", ".join(spec.name for spec in inputs)
            raise EdgeAgentError(
                f"{path}: one array, but the model has {len(inputs)} inputs ({names})",
                hint="give a .npz with an array named after each input",
            )
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise EdgeAgentError(f"{path} is not a NumPy .npy array: {exc}") from None
        if not isinstance(array, np.ndarray):  # a .npz archive named .npy
            raise EdgeAgentError(f"{path} is not a .npy array", hint="name a .npz archive .npz")
        feeds = {inputs[0].name: array}
    else:
        feeds = dict(load_testdata(path).feeds)  # expected:* arrays (test data) are left out
    by_name = {spec.name: spec for spec in inputs}
    for name, value in feeds.items():
        spec = by_name.get(name)
        if spec is not None and value.dtype.kind == "f" and np.dtype(spec.dtype).kind == "f":
            feeds[name] = value.astype(spec.dtype, copy=False)
    problem = feeds_problem(inputs, feeds)
    if problem:
        raise EdgeAgentError(f"{path} does not fit the model: {problem}")
    return feeds


# --- the model, the pipeline settings and the backend ---------------------------------------------


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
                f"pipeline {name} takes {config.source.type} windows, not {_NAMED[kind]}: give it {wants}"
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


def _proven_here(
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
    sample = _first_feeds(config, loaded.session, kind, input_path, picture)
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


def _pipeline_on(agent: AgentConfig | None, model: ResolvedModel) -> PipelineConfig | None:
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


def _artifact_run(loaded: Loaded, backend: str) -> str:
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


# --- running --------------------------------------------------------------------------------------


def infer(
    model_spec: str,
    input_path: Path,
    store: ModelStore,
    *,
    agent: AgentConfig | None = None,
    config_path: Path | None = None,
    pipeline: str | None = None,
    state_dir: Path | None = None,
    backend: str | None = None,
    benchmark: bool = False,
    frame: int | None = None,
    raw: bool = False,
) -> InferResult:
    """Run MODEL on INPUT as the pipeline `pipeline` of `agent` (or with the model's defaults)."""
    kind = input_kind(input_path)
    if frame is not None and kind != "video":
        raise EdgeAgentError(f"--frame is for a video input; {input_path} is {_NAMED[kind]}")
    model = resolve(model_spec, store)
    base = pipeline_config(agent, pipeline, config_path, kind, input_path)
    embedded = embedded_hints(model.artifacts)
    config = with_model_hints(base, model.manifest, embedded)
    picture = None
    if kind == "image":
        picture = read_image(input_path)
    elif kind == "video":
        picture = read_video_frame(input_path, frame or 0)
    # Where the daemon runs this model: under the named pipeline's backend settings, else those of
    # the config's pipeline on this version, else the agent's.
    ruled_by = config if pipeline is not None else _pipeline_on(agent, model)
    with state_or_scratch(state_dir) as states:
        settings = settings_for(agent, states)
        loaded = load_backend(model, settings, ruled_by, backend)
        try:
            session = loaded.session
            if pipeline is None:
                labels = model_labels(model, embedded)
                config = default_processing(config, session.inputs, session.outputs, labels)
            choice = loaded.choice
            guess = choice.policy.benchmark and not (choice.proven or choice.full_precision_reference)
            if backend is None and (benchmark or guess):
                # Never an unchecked reduced-precision guess: prove the candidates on this input
                # first, as the daemon proves them on its first frame.
                loaded = _proven_here(loaded, settings, config, model, kind, input_path, picture)
            defaults = pipeline is None
            try:
                result = _run(config, model, loaded, kind, input_path, picture, defaults=defaults, raw=raw)
            except BackendError as exc:
                if backend is not None or loaded.choice.proven:
                    raise ModelError(f"{model.ref}: {exc}") from None
                # What a first start serves cannot run this input (onnxruntime's PReLU on some
                # shapes): the candidates are proven on it, as the daemon proves them on a frame
                # its first choice fails.
                log.info("%s; proving the candidates on this input", exc)
                loaded = _proven_here(loaded, settings, config, model, kind, input_path, picture)
                try:
                    result = _run(
                        config, model, loaded, kind, input_path, picture, defaults=defaults, raw=raw
                    )
                except BackendError as again:
                    raise ModelError(f"{model.ref}: {again}") from None
        finally:
            loaded.session.close()
    result.pipeline = pipeline
    result.frame = (frame or 0) if kind == "video" else None
    return result


def pipeline_shaped_feeds(
    model_spec: str,
    store: ModelStore,
    agent: AgentConfig | None,
    pipeline: str | None,
    config_path: Path | None = None,
) -> tuple[dict[str, np.ndarray], str] | None:
    """Inputs of the shapes a pipeline feeds the model (`edge-agent bench`): the named pipeline's, else
    the config's first pipeline on this model, else the model's own hints (manifest, file metadata);
    random pixels or samples, the constants and initial state as they are. None when nothing says
    an open input size (the caller falls back to its defaults)."""
    model = resolve(model_spec, store)
    if pipeline is not None:
        chosen: PipelineConfig | None = named_pipeline(agent, pipeline, config_path)
    else:
        pipelines = agent.pipelines if agent is not None else []
        chosen = next((p for p in pipelines if p.model.name == model.name), None)
    base = chosen or bare_pipeline("bench", "bench")
    embedded = embedded_hints(model.artifacts)
    config = with_model_hints(base, model.manifest, embedded)
    session = reference_session(model.artifacts)
    try:
        if chosen is None:
            config = default_processing(config, session.inputs, session.outputs, None)
        try:
            stage = Stage(config, LoadedModel("bench", "bench", "", session))
        except EdgeAgentError:
            if chosen is not None:
                raise  # the pipeline does not fit its model: say so, as the daemon would
            return None  # an open input size nothing names
        feeds = stage.feeder.warm_up_feeds()
        live = stage.feeder.preprocess.input.name if isinstance(stage.feeder, ImageFeeder) else None
        if isinstance(stage.feeder, AudioFeeder):
            live = stage.feeder.input.name
    finally:
        session.close()
    if live is not None:
        feeds[live] = _random_like(feeds[live])
    shapes = ", ".join(f"{name} {'x'.join(map(str, value.shape))}" for name, value in feeds.items())
    origin = f"pipeline {chosen.name}" if chosen is not None else "the model's hints"
    return feeds, f"inputs shaped as {origin} feeds them ({shapes})"


def _random_like(value: np.ndarray) -> np.ndarray:
    """Random values of `value`'s shape and dtype: pixels over their range, floats in [-1, 1)."""
    rng = np.random.default_rng(0)
    if np.issubdtype(value.dtype, np.integer):
        limits = np.iinfo(value.dtype)
        return rng.integers(limits.min, limits.max, value.shape, dtype=value.dtype, endpoint=True)
    return (rng.random(value.shape, dtype=np.float32) * 2 - 1).astype(value.dtype)


def _first_feeds(
    config: PipelineConfig, session: Session, kind: str, path: Path, picture: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The model's inputs for the first frame of the input: what --benchmark proves backends on."""
    if kind == "tensor":
        return read_tensors(path, session.inputs)
    stage = Stage(config, LoadedModel("sample", "sample", "", session))
    if picture is not None:
        return stage.feeder.feeds(picture, gap=True)[0]
    source = config.source
    assert isinstance(source, AudioSourceConfig)
    first = next(
        audio_windows(read_wav(path, source.sample_rate), source.window, source.hop or source.window), None
    )
    if first is None:
        raise _too_short(path, source)
    return stage.feeder.feeds(first[1], gap=True)[0]


def _run(
    config: PipelineConfig,
    model: ResolvedModel,
    loaded: Loaded,
    kind: str,
    path: Path,
    picture: np.ndarray | None,
    defaults: bool,
    raw: bool,
) -> InferResult:
    session = loaded.session
    result = InferResult(
        model=model.ref,
        input=str(path),
        kind=kind,
        backend=session.backend,
        precision=session.precision,
        backend_choice=loaded.how,
        latency_ms={},
        artifact=_artifact_run(loaded, session.backend),
        proven=loaded.choice.proven,
        rejected=loaded.rejected,
        picture=picture,
    )
    if kind == "tensor":
        outputs = _run_tensors(config, session, path, result)
    else:
        try:
            stage = Stage(
                config, LoadedModel(model.name, model.version, loaded.decision.artifact_sha256, session)
            )
        except ModelError as exc:
            if not defaults or exc.hint:
                raise
            raise ModelError(
                exc.message, hint="the model does not say how to feed it: give --pipeline NAME -c CONFIG"
            ) from None
        problem = feeds_problem(session.inputs, stage.feeder.warm_up_feeds())
        if problem:
            raise ModelError(
                f"{model.ref}: the pipeline's preprocessing does not feed this model: {problem}",
                hint="preprocess.input names the input frames go to; state links feed the others",
            )
        stage.warm_up()  # as the daemon does before a stage serves: the first run pays for compiling
        if kind == "audio":
            outputs = _run_audio(stage, config, path, result)
        else:
            assert picture is not None
            run = stage.run_frame(picture, gap=True)
            if defaults:
                _maybe_without_softmax(stage, config, run)
            outputs = run.outputs
            result.output = run.output
            result.latency_ms = _latency(run.preprocess_ms, run.inference_ms, run.postprocess_ms)
            result.held_back_by = stage.rules.check(run.output, time.time())
    result.summary = summarise(outputs)
    if defaults and config.postprocess.type == "raw" and result.output is not None:
        result.output = result.summary  # the bare values would be a dump; the summary says what they are
    if raw:
        result.raw_outputs = {
            name: {
                "shape": list(np.shape(value)),
                "dtype": str(np.asarray(value).dtype),
                "values": _values(value),
            }
            for name, value in outputs.items()
        }
    return result


def _run_tensors(
    config: PipelineConfig, session: Session, path: Path, result: InferResult
) -> Mapping[str, np.ndarray]:
    """The arrays straight into the model; the pipeline's postprocessing (no geometry: boxes stay
    in model-input pixels) and report rules."""
    feeds = read_tensors(path, session.inputs)
    postprocess: Postprocessor = build_postprocessor(config.postprocess, session.outputs)
    session.run(feeds)  # warm-up, as the daemon runs a stage once before it serves
    t1 = time.perf_counter()
    outputs = session.run(feeds)
    t2 = time.perf_counter()
    result.output = postprocess(outputs, None)
    t3 = time.perf_counter()
    result.latency_ms = _latency(0.0, (t2 - t1) * 1000, (t3 - t2) * 1000)
    result.held_back_by = ReportRules(config.report).check(result.output, time.time())
    if "detections" in result.output or "regions" in result.output:
        result.note = "no preprocessing for tensor inputs: boxes are in model-input pixels"
    return outputs


def _run_audio(
    stage: Stage, config: PipelineConfig, path: Path, result: InferResult
) -> Mapping[str, np.ndarray]:
    """Every window of the file in order, as its audio source would cut them; the results the
    pipeline's report rules let through, each with its window (counted from 1, as the daemon's
    results count frames) and its position in the file (the rules' clock: min_interval_s is in
    seconds of audio)."""
    source = config.source
    assert isinstance(source, AudioSourceConfig)
    rate, hop = source.sample_rate, source.hop or source.window
    published: list[dict[str, Any]] = []
    totals = np.zeros(3)
    windows = 0
    outputs: Mapping[str, np.ndarray] = {}
    for start, samples in audio_windows(read_wav(path, rate), source.window, hop):
        run = stage.run_frame(samples, gap=windows == 0)
        windows += 1
        totals += (run.preprocess_ms, run.inference_ms, run.postprocess_ms)
        outputs = run.outputs
        position = start / rate
        if stage.rules.check(run.output, position) is None:
            published.append(
                {
                    "frame": windows,
                    "position_s": round(position, 3),
                    "output": run.output,
                    "held_back": stage.rules.take_held_count(),
                }
            )
    if windows == 0:
        raise _too_short(path, source)
    result.latency_ms = _latency(*(totals / windows))  # per window, on average
    result.results, result.windows = published, windows
    result.held_back = dict(stage.rules.held_back)
    return outputs


def _too_short(path: Path, source: AudioSourceConfig) -> EdgeAgentError:
    return EdgeAgentError(
        f"{path} is shorter than one window ({source.window} samples at {source.sample_rate} Hz)"
    )


def _maybe_without_softmax(stage: Stage, config: PipelineConfig, run: FrameRun) -> None:
    """A default classification whose model already gives probabilities: read them as they are."""
    post = config.postprocess
    if not isinstance(post, ClassificationPostprocess) or not post.softmax:
        return
    scores = run.outputs[post.output or stage.model.session.outputs[0].name]
    if looks_like_probabilities(scores):
        stage.postprocess = build_postprocessor(
            post.model_copy(update={"softmax": False}), stage.model.session.outputs
        )
        run.output = stage.postprocess(run.outputs, run.geometry)


def _latency(preprocess: float, inference: float, postprocess: float) -> dict[str, float]:
    return {
        "preprocess": round(float(preprocess), 3),
        "inference": round(float(inference), 3),
        "postprocess": round(float(postprocess), 3),
    }


def _number(value: Any) -> float | int | None:
    number = value.item() if isinstance(value, np.generic) else value
    if isinstance(number, float):
        return float(f"{number:.6g}") if math.isfinite(number) else None
    return int(number) if isinstance(number, (int, bool)) else None


def summarise(outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """{"outputs": {name: {shape, dtype, min, max, mean, argmax (of a vector)}}}: what each output
    is without its values (a detector's raw output is tens of thousands of numbers)."""
    summary: dict[str, Any] = {}
    for name, value in outputs.items():
        array = np.asarray(value)
        entry: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
        if array.size and array.dtype.kind in "biuf":
            finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
            if finite.size < array.size:
                entry["non_finite"] = int(array.size - finite.size)
            if finite.size:
                entry.update(
                    min=_number(finite.min()),
                    max=_number(finite.max()),
                    mean=_number(finite.astype(np.float64).mean()),
                )
            if array.size > 1 and sum(1 for d in array.shape if d > 1) == 1:  # a vector, maybe [1, C]
                entry["argmax"] = int(np.argmax(np.where(np.isnan(array), -np.inf, array).reshape(-1)))
        summary[name] = entry
    return {"outputs": summary}


def _values(value: np.ndarray) -> list[Any]:
    array = np.asarray(value).reshape(-1)
    if array.dtype.kind == "f":
        return [v if math.isfinite(v) else None for v in array.tolist()]
    return list(array.tolist())


# --- drawing --------------------------------------------------------------------------------------

# BGR colours of boxes by class index: bright, and far from each other.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (0, 255, 0),  # green
    (255, 0, 255),  # magenta
    (255, 255, 0),  # cyan
    (0, 255, 255),  # yellow
    (0, 128, 255),  # orange
    (255, 128, 0),  # azure
    (128, 0, 255),  # pink
    (0, 0, 255),  # red
)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def box_colour(index: int) -> tuple[int, int, int]:
    return PALETTE[index % len(PALETTE)]


def line_width(image: np.ndarray) -> int:
    """Box lines 2 px wide up to 800 px images, wider on larger ones."""
    return max(2, round(max(image.shape[:2]) / 400))


def draw(image: np.ndarray, output: Mapping[str, Any]) -> tuple[np.ndarray, str]:
    """A copy of `image` with the output drawn (detections and regions: boxes and labels in their
    class colour; classification: the top label), and what was drawn."""
    canvas = image.copy()
    if "detections" in output:
        for detection in output["detections"]:
            label = detection["label"] if detection["label"] is not None else f"class {detection['index']}"
            _box(
                canvas, detection["box"], f"{label} {detection['score']:.2f}", box_colour(detection["index"])
            )
        return canvas, f"{len(output['detections'])} detection(s) drawn"
    if "regions" in output:
        for region in output["regions"]:
            _box(canvas, region["box"], f"{region['score']:.2f}", box_colour(0))
        return canvas, f"{len(output['regions'])} region(s) drawn"
    if output.get("top"):
        top = output["top"][0]
        label = top["label"] if top["label"] is not None else f"class {top['index']}"
        _banner(canvas, f"{label} {top['score']:.2f}")
        return canvas, f"top label {label!r} written"
    return canvas, "nothing to draw for this output: the image is as it came"


def _text_size(image: np.ndarray) -> tuple[float, int]:
    scale = max(0.5, max(image.shape[:2]) / 1000)
    return scale, max(1, round(scale * 2))


def _box(image: np.ndarray, box: Sequence[float], label: str, colour: tuple[int, int, int]) -> None:
    x1, y1, x2, y2 = (round(float(v)) for v in box)
    width = line_width(image)
    cv2.rectangle(image, (x1, y1), (x2, y2), colour, width)
    scale, thickness = _text_size(image)
    (text_w, text_h), baseline = cv2.getTextSize(label, _FONT, scale, thickness)
    top = y1 - text_h - baseline - 2 * width
    if top < 0:  # no room above: inside, under the top edge
        top = y1
    right = x1 + text_w + 2 * width
    cv2.rectangle(image, (x1, top), (right, top + text_h + baseline + 2 * width), colour, cv2.FILLED)
    origin = (x1 + width, top + text_h + width)
    cv2.putText(image, label, origin, _FONT, scale, (0, 0, 0), thickness, cv2.LINE_AA)


def _banner(image: np.ndarray, text: str) -> None:
    scale, thickness = _text_size(image)
    (text_w, text_h), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    pad = 4
    cv2.rectangle(image, (0, 0), (text_w + 2 * pad, text_h + baseline + 2 * pad), (0, 0, 0), cv2.FILLED)
    cv2.putText(image, text, (pad, pad + text_h), _FONT, scale, (255, 255, 255), thickness, cv2.LINE_AA)


def check_picture_path(path: Path) -> None:
    """EdgeAgentError unless an image can be written at `path` (checked before the model runs)."""
    if not cv2.haveImageWriter(str(path)):
        raise EdgeAgentError(
            f"--draw {path}: OpenCV writes no such image type", hint="use a .jpg or .png name"
        )
    if not path.parent.is_dir():
        raise EdgeAgentError(f"--draw {path}: folder {path.parent} does not exist")


def write_picture(path: Path, image: np.ndarray) -> None:
    """Write an image file (its type by suffix: .jpg at quality 95, .png, ...); EdgeAgentError when
    it cannot be."""
    check_picture_path(path)
    try:
        written = cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    except cv2.error as exc:
        raise EdgeAgentError(f"--draw {path}: cannot write it: {exc}") from None
    if not written:
        raise EdgeAgentError(f"--draw {path}: cannot write it (permissions?)")
