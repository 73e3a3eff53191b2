"""INT8 variants: a float ONNX model statically quantized (onnxruntime's QDQ, per-channel weights),
kept only where it reports what the float model reports.

A quantized detector can be fast and wrong: YOLOv8n quantized whole gave class scores above 1 and
lost a face (its output head, the box decode and the sigmoid, was quantized too). So the variant is
judged on the reports (agent/processing/judge.py: the same detections at IoU >= match_iou, the same
top-k) of the float model and the variant on the calibration inputs; where they differ, the head
(the nodes after the last Conv of each output path) is kept in float and the model quantized again,
then the head one Conv deeper. What was kept in float is said, and written into the variant's own
metadata (`edge_agent.*` metadata_props), so the file says what it is wherever it is copied: selection
(agent/transform.py) reads it there.

Calibration inputs are prepared as the pipeline would prepare frames (agent/processing/preprocess.py):
a pipeline's preprocess where one is named, else the model's own metadata (an Ultralytics export:
letterbox to `imgsz`, RGB, 0..1), else a plain letterbox to the model's fixed input size, RGB, 0..1.
OpenVINO's NNCF is not used: it is not installed here, and onnxruntime's quantizer serves both
onnxruntime and OpenVINO (which reads QDQ models). onnxruntime's `quant_pre_process` is not run
either: on YOLOv8n its variant reported the same and ran as fast (22.2 against 23.0 ms, interleaved,
on the loaded 2-core box), and its symbolic shape inference needs sympy, which is not installed.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ModelError
from agent.transform import META_KEPT_FLOAT, META_MADE_FROM, META_PRECISION
from providers.base import one_line

if TYPE_CHECKING:
    import numpy as np

    from agent.config import PipelineConfig, PostprocessConfig, PreprocessConfig
    from agent.processing.judge import Judge
    from providers import TensorSpec

log = logging.getLogger(__name__)

PRECISION = "int8"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MAX_CALIBRATION = 64  # inputs: calibration's cost grows with them, its ranges hardly past a few dozen

Feeds = dict[str, "np.ndarray"]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Preparation:
    """How calibration images become model inputs and how outputs are read as reports."""

    preprocess: PreprocessConfig
    postprocess: PostprocessConfig | None
    origin: str  # in words, for --help's promise and the progress lines


@dataclass
class Quantized:
    """A variant that reports what the float model reports on `checked` inputs."""

    path: Path
    kept_float: str  # "nothing" or "the output head: 109 nodes after the last Conv (Concat, Sigmoid, ...)"
    checked: int
    max_diff: float | None  # the largest difference of the reports (box pixels, scores)
    tries: list[str] = field(default_factory=list)  # each refused try and what differed
    judged_on: str = ""  # "detections", "top-k": what max_diff measures (Decision.judged_on)

    def within(self) -> str:
        """ "boxes within 2.6 px" """
        from providers.select import reports_within

        return reports_within(self.judged_on, self.max_diff)


def preparation(model: Path, specs: list[TensorSpec], pipeline: PipelineConfig | None = None) -> Preparation:
    """The pipeline's preprocess and postprocess, else the model's own metadata, else a plain
    letterbox (RGB, 0..1) with no report to judge by."""
    from agent.config import (
        ClassificationPostprocess,
        DetectionPostprocess,
        PreprocessConfig,
        ResizeConfig,
    )
    from agent.model_hints import embedded_hints
    from providers import ModelArtifact

    if pipeline is not None:
        if not isinstance(pipeline.preprocess, PreprocessConfig):
            raise ModelError(f"pipeline {pipeline.name} feeds audio: int8 variants are made for image models")
        return Preparation(
            pipeline.preprocess, pipeline.postprocess, f"pipeline {pipeline.name}'s preprocess"
        )
    hints = embedded_hints([ModelArtifact(model, "onnx", "", name=model.name)])
    postprocess: PostprocessConfig | None = None
    task = _task(model)
    labels = hints.get("labels")
    if task == "detect":
        postprocess = DetectionPostprocess(type="detection", labels=labels)
    elif task == "classify":
        postprocess = ClassificationPostprocess(type="classification", labels=labels)
    if "preprocess" in hints:
        config = PreprocessConfig.model_validate(hints["preprocess"])
        size = config.resize
        origin = f"the model's metadata: {size.mode if size else 'no resize'} to {_size(config)}, RGB, 0..1"
        return Preparation(config, postprocess, origin)
    image = next((s for s in specs if len(s.shape) == 4), None)
    height, width = (image.shape[2], image.shape[3]) if image is not None else (None, None)
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ModelError(
            f"{model.name}: its image input has no fixed size to prepare calibration images for",
            hint="name a pipeline whose preprocess says how: -c CONFIG --pipeline NAME",
        )
    resize = ResizeConfig(width=width, height=height, mode="letterbox")
    config = PreprocessConfig(resize=resize, color="rgb", scale=1 / 255)
    return Preparation(config, postprocess, f"a plain letterbox to {width}x{height}, RGB, 0..1")


def _task(model: Path) -> str:
    from agent.onnx_wire import onnx_metadata_props

    try:
        return onnx_metadata_props(model).get("task", "")
    except (OSError, ValueError):
        return ""


def _size(config: PreprocessConfig) -> str:
    return f"{config.resize.width}x{config.resize.height}" if config.resize else "the input size"


def calibration_inputs(
    source: Path | None,
    testdata: Sequence[Path],
    specs: list[TensorSpec],
    prep: Preparation,
    limit: int = MAX_CALIBRATION,
) -> tuple[list[Feeds], str]:
    """The inputs to calibrate and check on, and where they came from: a folder of images (frames
    `edge-agent source --save` wrote, photos), an .npz of inputs, or else the version's test data."""
    if source is None:
        if not testdata:
            raise ModelError(
                "no calibration data: --quantize needs inputs to calibrate on",
                hint="pass --calibration DIR (images) or an .npz of inputs, or publish with --test-data",
            )
        feeds = [f for path in testdata for f in _npz_inputs(path, specs)]
        return feeds[:limit], f"the test data ({', '.join(p.name for p in testdata)})"
    if source.is_dir():
        images = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise ModelError(
                f"--calibration {source}: no images in it ({', '.join(IMAGE_SUFFIXES)})",
                hint="save frames with `edge-agent source TARGET --save DIR/frame.jpg`, or pass an .npz",
            )
        return image_inputs(images[:limit], specs, prep), f"{min(len(images), limit)} images in {source}"
    if source.suffix.lower() == ".npz":
        return _npz_inputs(source, specs)[:limit], f"{source.name}"
    raise ModelError(f"--calibration {source}: neither a folder of images nor an .npz of inputs")


def image_inputs(images: list[Path], specs: list[TensorSpec], prep: Preparation) -> list[Feeds]:
    import cv2

    from agent.processing.preprocess import Preprocessor

    if len(specs) != 1:
        names = ", ".join(s.name for s in specs)
        raise ModelError(f"images calibrate a model of one input; this one has {names}: pass an .npz")
    preprocessor = Preprocessor(prep.preprocess, specs)
    feeds = []
    for path in images:
        frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if frame is None:
            raise ModelError(f"--calibration: {path} is not an image OpenCV can read")
        tensor, _geometry = preprocessor.prepare(frame)
        feeds.append({preprocessor.input.name: tensor})
    return feeds


def _npz_inputs(path: Path, specs: list[TensorSpec]) -> list[Feeds]:
    """Each row of an .npz's input arrays is one input (its expected outputs are left out)."""
    from agent.testdata import load_testdata
    from providers.select import feeds_problem

    sample = load_testdata(path, path.name)
    problem = feeds_problem(specs, sample.feeds)
    if problem:
        raise ModelError(f"{path.name} does not fit the model's inputs: {problem}")
    rows = {len(v) for v in sample.feeds.values() if v.ndim}
    batch_fixed = any(isinstance(s.shape[0], int) and s.shape[0] > 1 for s in specs if s.shape)
    if len(rows) != 1 or batch_fixed:
        return [dict(sample.feeds)]
    count = rows.pop()
    return [{k: v[i : i + 1] for k, v in sample.feeds.items()} for i in range(count)]


def make_variant(
    model: Path,
    out: Path,
    calibration: Path | None,
    testdata: Sequence[Path],
    pipeline: PipelineConfig | None = None,
    match_iou: float = 0.5,
    say: Say | None = None,
) -> Quantized:
    """An int8 variant of `model` in `out` (`quantize_int8`), calibrated on `calibration` or the test
    data, prepared and judged as `pipeline` would (else as the model's metadata says)."""
    from agent.processing.judge import judged_on, report_judge
    from providers import BackendError, ModelArtifact
    from providers.select import reference_session

    tell = say or (lambda _text: None)
    try:
        session = reference_session([ModelArtifact(model, "onnx", "", name=model.name)])
    except BackendError as exc:
        raise ModelError(f"{model.name} cannot be quantized: it does not load: {exc}") from None
    try:
        specs, outputs = session.inputs, session.outputs
    finally:
        session.close()
    prep = preparation(model, specs, pipeline)
    inputs, origin = calibration_inputs(calibration, testdata, specs, prep)
    tell(f"calibration: {origin}, prepared with {prep.origin}")
    judge = report_judge(prep.postprocess, outputs, match_iou) if prep.postprocess else None
    made = quantize_int8(model, out, inputs, judge, model.name, say)
    if prep.postprocess is not None:
        made.judged_on = judged_on(prep.postprocess)
    return made


def quantize_int8(
    model: Path,
    out: Path,
    inputs: list[Feeds],
    judge: Judge | None,
    made_from: str,
    say: Say | None = None,
) -> Quantized:
    """Quantize `model` into `out` on `inputs`, proven on the reports `judge` compares; the head kept
    in float (then one Conv deeper) where quantizing it changes them. ModelError when the model
    cannot be quantized, or when no try reports what the float model reports."""
    import onnx

    tell = say or (lambda _text: None)
    if not inputs:
        raise ModelError("no calibration inputs to quantize on")
    if judge is None:
        raise ModelError(
            f"{model.name}: no report to prove an int8 variant on (the model's metadata names no "
            "detect or classify task)",
            hint="name the pipeline that reads it: -c CONFIG --pipeline NAME",
        )
    try:
        graph = onnx.load(str(model))
    except Exception as exc:  # DecodeError, OSError: not an ONNX file
        raise ModelError(
            f"{model.name} is not an ONNX model onnxruntime can quantize: {one_line(exc)}"
        ) from None
    reference = _run(model, inputs)
    tries: list[str] = []
    with tempfile.TemporaryDirectory(prefix="edge-agent-quantize-") as scratch:
        for depth in (0, 1, 2):
            excluded = head_nodes(graph, depth)
            if depth and not excluded:
                break
            kept = _kept_words(graph, excluded, depth)
            tell(f"quantizing {model.name} to int8 ({kept} kept in float) on {len(inputs)} inputs")
            candidate = Path(scratch) / f"try{depth}.onnx"
            quantize_qdq(model, candidate, inputs, excluded)
            tell(f"checking its reports against the float model's on {len(inputs)} inputs")
            worst, problem = _compare(candidate, inputs, reference, judge)
            if not problem:
                stamp_variant(candidate, out, made_from, kept)
                return Quantized(out, kept, len(inputs), worst, tries)
            tries.append(f"{kept} kept in float: {problem}")
            tell(f"refused: {problem}")
    raise ModelError(
        f"{model.name}: no int8 variant reports what the float model reports ({'; '.join(tries)})",
        hint="publish the float model alone, or calibrate on inputs more like the pipeline's",
    )


def head_nodes(graph: Any, depth: int) -> list[str]:
    """The names of the nodes between the outputs and the last Conv of each output path (depth 1:
    YOLOv8's box decode, sigmoid and concat), or `depth` Convs back (those Convs included); [] at 0."""
    if depth <= 0:
        return []
    producer = {name: node for node in graph.graph.node for name in node.output}
    found: dict[str, None] = {}
    seen: set[tuple[str, int]] = set()
    stack = [(o.name, 0) for o in graph.graph.output]
    while stack:
        tensor, convs = stack.pop()
        node = producer.get(tensor)
        if node is None or (node.name, convs) in seen:
            continue
        seen.add((node.name, convs))
        if node.op_type == "Conv":
            if convs + 1 >= depth:
                continue
            convs += 1
        found[node.name] = None
        stack.extend((name, convs) for name in node.input)
    return list(found)


def _kept_words(graph: Any, excluded: list[str], depth: int) -> str:
    if not excluded:
        return "nothing"
    kinds = {n.name: n.op_type for n in graph.graph.node}
    ops = sorted({kinds[n] for n in excluded if n in kinds})
    where = "after the last Conv" if depth == 1 else f"from {depth - 1} Conv(s) before the last on"
    shown = ", ".join(ops[:6]) + (", ..." if len(ops) > 6 else "")
    return f"the output head: {len(excluded)} nodes {where} ({shown})"


def quantize_qdq(model: Path, out: Path, inputs: list[Feeds], excluded: list[str]) -> None:
    """onnxruntime's static quantization, QDQ, per-channel int8 weights and uint8 activations, the
    `excluded` nodes left in float. Unchecked: `quantize_int8` proves what it makes."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows: Iterator[Feeds] = iter(inputs)

        def get_next(self) -> Feeds | None:
            return next(self.rows, None)

    # The quantizer logs advice ("consider pre-processing") at WARNING on the root logger: quiet it.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_static(
            str(model),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=excluded,
        )
    except Exception as exc:  # the quantizer's own errors: unsupported graphs, shape inference, ...
        raise ModelError(f"{model.name} cannot be quantized: {one_line(exc)}") from None
    finally:
        root.setLevel(level)


def _run(model: Path, inputs: list[Feeds]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return [dict(zip(names, session.run(None, feeds), strict=True)) for feeds in inputs]
    except Exception as exc:  # onnxruntime's Fail/InvalidArgument: the inputs do not fit, ...
        raise ModelError(f"{model.name} does not run on the calibration inputs: {one_line(exc)}") from None


def _compare(
    candidate: Path, inputs: list[Feeds], reference: list[dict[str, np.ndarray]], judge: Judge
) -> tuple[float | None, str]:
    """The largest difference of the reports and "" or what differs (on which input)."""
    worst: float | None = None
    for i, (outputs, wanted) in enumerate(zip(_run(candidate, inputs), reference, strict=True)):
        verdict = judge(outputs, wanted)
        if verdict is None:
            continue
        diff, problem = verdict
        if problem:
            return diff, f"on input {i + 1} of {len(inputs)}, {problem}"
        if diff is not None:
            worst = diff if worst is None else max(worst, diff)
    return worst, ""


def stamp_variant(candidate: Path, out: Path, made_from: str, kept: str) -> None:
    """Write the variant to `out` with what it is in its own metadata."""
    import onnx

    graph = onnx.load(str(candidate))
    props = {p.key: p.value for p in graph.metadata_props}
    props.update({META_PRECISION: PRECISION, META_MADE_FROM: made_from, META_KEPT_FLOAT: kept})
    del graph.metadata_props[:]
    for key, value in props.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(out))
