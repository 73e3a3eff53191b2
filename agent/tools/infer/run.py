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

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from agent.config import (
    AgentConfig,
    AudioSourceConfig,
    ClassificationPostprocess,
    PipelineConfig,
)
from agent.errors import EdgeAgentError, ModelError
from agent.filter_counts import drops_text
from agent.model_hints import embedded_hints, with_model_hints
from agent.processing import Postprocessor, build_postprocessor
from agent.processing.feed import AudioFeeder, ImageFeeder
from agent.processing.object_filter import Filtered
from agent.rules import ReportRules
from agent.sources import read_wav, redact_uri
from agent.sources.audio import audio_windows
from agent.stage import FrameRun, LoadedModel, Stage
from agent.store import ModelStore
from agent.tools.infer.choice import (
    Loaded,
    ResolvedModel,
    artifact_run,
    bare_pipeline,
    default_processing,
    load_backend,
    looks_like_probabilities,
    model_labels,
    named_pipeline,
    pipeline_config,
    pipeline_on,
    proven_here,
    resolve,
    settings_for,
    state_or_scratch,
)
from agent.tools.infer.inputs import NAMED, input_kind, read_image, read_tensors, read_video_frame, too_short
from providers import (
    BackendError,
    Session,
)
from providers.select import feeds_problem, reference_session

log = logging.getLogger(__name__)
T = TypeVar("T")


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


@dataclass(frozen=True)
class InferRequest:
    """What `infer` and `infer --track` run: MODEL (a model file, or NAME@VERSION in `store`) on
    INPUT, as the pipeline `pipeline` of `agent` (the config read from `config_path`) processes it,
    else with the model's own hints; on `backend`, else where the daemon would run it (`benchmark`:
    the candidates proven on this input first). `state_dir` holds the agent's backend decisions
    (None: a scratch folder)."""

    model_spec: str
    input_path: Path
    store: ModelStore
    agent: AgentConfig | None = None
    config_path: Path | None = None
    pipeline: str | None = None
    state_dir: Path | None = None
    backend: str | None = None
    benchmark: bool = False
    camera: str | None = None  # INPUT is this camera or stream (rtsp://, /dev/videoN, ...), not a file

    @property
    def input_name(self) -> str:
        """INPUT as results say it (a camera's URL without its password)."""
        return redact_uri(self.camera) if self.camera is not None else str(self.input_path)


# --- running --------------------------------------------------------------------------------------


def model_and_pipeline(
    request: InferRequest, kind: str
) -> tuple[ResolvedModel, PipelineConfig, dict[str, Any]]:
    """The model MODEL names, the pipeline settings it runs with (the named pipeline's, else bare)
    filled in by its hints, and the hints its files carry (for `on_model`)."""
    model = resolve(request.model_spec, request.store)
    base = pipeline_config(request.agent, request.pipeline, request.config_path, kind, request.input_path)
    embedded = embedded_hints(model.artifacts)
    return model, with_model_hints(base, model.manifest, embedded), embedded


def infer(request: InferRequest, *, frame: int | None = None, raw: bool = False) -> InferResult:
    """Run MODEL on INPUT as the pipeline `pipeline` of `agent` (or with the model's defaults): on
    `frame` of a video (default 0); `raw`: every output tensor's values in the result too."""
    input_path, pipeline = request.input_path, request.pipeline
    picture: np.ndarray | None = None
    if request.camera is not None:
        if frame is not None:
            raise EdgeAgentError("--frame is for a video file; a camera's frame is the one it gives now")
        from agent.tools.infer.camera import camera_frame

        # The camera's first frame, run as an image (it answers, or says why, before the model loads).
        picture = camera_frame(request.camera)
        kind = "image"
    else:
        kind = input_kind(input_path)
        if frame is not None and kind != "video":
            raise EdgeAgentError(f"--frame is for a video input; {input_path} is {NAMED[kind]}")
        if kind == "image":
            picture = read_image(input_path)
        elif kind == "video":
            picture = read_video_frame(input_path, frame or 0)
    model, config, embedded = model_and_pipeline(request, kind)
    defaults = pipeline is None

    def run(completed: PipelineConfig, loaded: Loaded) -> InferResult:
        return _run(completed, model, loaded, kind, input_path, picture, defaults=defaults, raw=raw)

    result = on_model(request, model, config, embedded, run, kind=kind, picture=picture)
    result.pipeline = pipeline
    result.frame = (frame or 0) if kind == "video" else None
    if request.camera is not None:
        result.input, result.kind = request.input_name, "camera"
    if config.attributes:  # second models read tracked objects: one frame's boxes are not that
        names = ", ".join(attribute.name for attribute in config.attributes)
        said = f"the pipeline's attributes ({names}) read tracked objects: --track runs them"
        result.note = "; ".join(filter(None, [result.note, said]))
    return result


def on_model(
    request: InferRequest,
    model: ResolvedModel,
    config: PipelineConfig,
    embedded: Mapping[str, Any],
    body: Callable[[PipelineConfig, Loaded], T],
    *,
    kind: str,
    picture: np.ndarray | None,
) -> T:
    """`body(config, loaded)`: the model loaded where the daemon would run it (or on `backend`), and
    `config` (after the model's hints) completed for it when no pipeline names the settings. The
    session is closed after. A first choice that cannot run this input (a BackendError from `body`)
    is replaced by the candidates proven on it, and `body` runs again."""
    agent, pipeline, backend, input_path = (
        request.agent,
        request.pipeline,
        request.backend,
        request.input_path,
    )
    # Where the daemon runs this model: under the named pipeline's backend settings, else those of
    # the config's pipeline on this version, else the agent's.
    ruled_by = config if pipeline is not None else pipeline_on(agent, model)
    with state_or_scratch(request.state_dir) as states:
        settings = settings_for(agent, states)
        loaded = load_backend(model, settings, ruled_by, backend)
        try:
            session = loaded.session
            if pipeline is None:
                labels = model_labels(model, embedded)
                config = default_processing(config, session.inputs, session.outputs, labels)
            choice = loaded.choice
            guess = choice.policy.benchmark and not (choice.proven or choice.full_precision_reference)
            if backend is None and (request.benchmark or guess):
                # Never an unchecked reduced-precision guess: prove the candidates on this input
                # first, as the daemon proves them on its first frame.
                loaded = proven_here(loaded, settings, config, model, kind, input_path, picture)
            try:
                return body(config, loaded)
            except BackendError as exc:
                if backend is not None or loaded.choice.proven:
                    raise ModelError(f"{model.ref}: {exc}") from None
                # What a first start serves cannot run this input (onnxruntime's PReLU on some
                # shapes): the candidates are proven on it, as the daemon proves them on a frame
                # its first choice fails.
                log.info("%s; proving the candidates on this input", exc)
                loaded = proven_here(loaded, settings, config, model, kind, input_path, picture)
                try:
                    return body(config, loaded)
                except BackendError as again:
                    raise ModelError(f"{model.ref}: {again}") from None
        finally:
            loaded.session.close()


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
        artifact=artifact_run(loaded, session.backend),
        proven=loaded.choice.proven,
        rejected=loaded.rejected,
        picture=picture,
    )
    if kind == "tensor":
        outputs = _run_tensors(config, session, path, result)
    else:
        stage = ready_stage(config, model, loaded, defaults)
        if kind == "audio":
            outputs = _run_audio(stage, config, path, result)
        else:
            assert picture is not None
            run = stage.run_frame(picture, gap=True)
            if defaults:
                _maybe_without_softmax(stage, config, run)
            outputs = run.outputs
            result.output = run.output
            result.latency_ms = latency(run.preprocess_ms, run.inference_ms, run.postprocess_ms)
            result.held_back_by = stage.rules.check(run.output, time.time())
            result.note = "; ".join(filter(None, [result.note, filters_note(stage)]))
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


def ready_stage(config: PipelineConfig, model: ResolvedModel, loaded: Loaded, defaults: bool) -> Stage:
    """The pipeline's stage on the loaded model, checked to feed it and warmed up (as the daemon does
    before a stage serves: the first run pays for compiling)."""
    session = loaded.session
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
    stage.warm_up()
    if config.filters is not None:  # what the pipeline's filter step would drop (its steps do not run here)
        stage.postprocess = Filtered(stage.postprocess, config.filters)
    return stage


def filters_note(stage: Stage) -> str:
    """What the pipeline's object filters dropped of the frames run ('' when they dropped nothing)."""
    post = stage.postprocess
    if not isinstance(post, Filtered) or not post.drops.dropped:
        return ""
    return f"filters {drops_text(post.drops.to_dict())}"


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
    result.latency_ms = latency(0.0, (t2 - t1) * 1000, (t3 - t2) * 1000)
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
        raise too_short(path, source)
    result.latency_ms = latency(*(totals / windows))  # per window, on average
    result.results, result.windows = published, windows
    result.held_back = dict(stage.rules.held_back)
    return outputs


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


def latency(preprocess: float, inference: float, postprocess: float) -> dict[str, float]:
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
