"""The TFLite/LiteRT backend on the real ai-edge-litert, MediaPipe's BlazeFace and scikit-image photos.

Models are read from the mediapipe 0.10.21 wheel (installed --no-deps, never imported). Small models
with one operator (a quantised input, an open dimension, an Edge TPU custom op) are written with the
TFLite schema module that ai-edge-litert ships, so they are valid flatbuffers the real runtime reads.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import skimage.data
from ai_edge_litert import schema_py_generated as schema

from agent.config import PreprocessConfig
from agent.processing import Preprocessor
from providers import registry
from providers import tflite_backend as tfl
from providers.base import BackendError, ModelArtifact, Session, TensorSpec
from providers.tflite_backend import EDGETPU_OP, TfliteBackend, TfliteOptions, TfliteSession
from tests.tflite_models import edgetpu_model, one_op_model, tflite_tensor

MEDIAPIPE = Path(importlib.util.find_spec("mediapipe").submodule_search_locations[0]) / "modules"  # type: ignore[union-attr,index]
SHORT_RANGE = MEDIAPIPE / "face_detection/face_detection_short_range.tflite"
FULL_RANGE = MEDIAPIPE / "face_detection/face_detection_full_range_sparse.tflite"
WITH_ATTENTION = MEDIAPIPE / "face_landmark/face_landmark_with_attention.tflite"
LITERT = importlib.metadata.version("ai-edge-litert")
ASTRONAUT_FACE = (178, 82, 271, 174)  # MODELS.md, short range on LiteRT
ASTRONAUT_FACE_FULL = (171, 66, 278, 172)  # MODELS.md, full range on LiteRT


def _artifact(path: Path, fmt: str = "tflite", name: str = "") -> ModelArtifact:
    return ModelArtifact(path, fmt, "0" * 64, name)


def _one_line(text: str, *parts: str) -> None:
    assert "\n" not in text
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    """Probes are cached per process: start and end a test that patches them with an empty cache."""
    tfl.clear_probe_cache()
    yield
    tfl.clear_probe_cache()


@pytest.fixture(scope="module")
def cpu() -> TfliteBackend:
    return TfliteBackend("cpu")


# --- models written with the official schema -----------------------------------------------------------


# --- BlazeFace ------------------------------------------------------------------------------------------


def _anchors(layers: list[tuple[int, int]]) -> np.ndarray:
    """SSD anchor centres: per layer a grid x grid raster, row by row, `per_cell` anchors per cell."""
    centres = [
        ((x + 0.5) / grid, (y + 0.5) / grid)
        for grid, per_cell in layers
        for y in range(grid)
        for x in range(grid)
        for _ in range(per_cell)
    ]
    return np.array(centres, dtype=np.float32)


BLAZEFACE = {  # model: (input size, anchors)
    SHORT_RANGE: (128, _anchors([(16, 2), (8, 6)])),
    FULL_RANGE: (192, _anchors([(48, 1)])),
}


def _best_face(session: Session, model: Path, image: np.ndarray) -> tuple[float, np.ndarray]:
    """Letterbox to a centred square, resize, RGB to [-1, 1]; the best anchor's score and box in pixels."""
    size, anchors = BLAZEFACE[model]
    h, w = image.shape[:2]
    side = max(h, w)
    top, left = (side - h) // 2, (side - w) // 2
    square = np.zeros((side, side, 3), np.uint8)
    square[top : top + h, left : left + w] = image
    x = cv2.resize(square, (size, size), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 127.5 - 1
    [inp] = session.inputs
    out = session.run({inp.name: x[None]})
    regressors, scores = (out[spec.name][0] for spec in session.outputs)
    scores = 1 / (1 + np.exp(-np.clip(scores[:, 0], -80, 80)))
    best = int(scores.argmax())
    cx, cy = regressors[best, :2] / size + anchors[best]
    bw, bh = regressors[best, 2:4] / size
    box = np.array([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]) * side - [left, top, left, top]
    return float(scores[best]), box


@pytest.fixture(scope="module")
def short_range(cpu: TfliteBackend) -> Session:
    return cpu.load(_artifact(SHORT_RANGE), {"threads": 1})


# --- discovery and probing ------------------------------------------------------------------------------


def test_discover_offers_cpu_available_and_edgetpu_with_the_reason_it_is_not() -> None:
    assert tfl.find_libedgetpu() is None  # this machine has no Edge TPU runtime
    cpu, edgetpu = tfl.discover()
    assert (cpu.name, cpu.runtime, cpu.device) == ("tflite/cpu", "tflite", "cpu")
    assert (edgetpu.name, edgetpu.runtime, edgetpu.device) == ("tflite/edgetpu", "tflite", "edgetpu")
    assert cpu.formats == edgetpu.formats == frozenset({"tflite"})

    probe = cpu.probe()
    assert probe.available and probe.backend == "tflite/cpu" and probe.devices == ("cpu",)
    assert probe.versions["ai-edge-litert"] == LITERT
    assert probe.versions["numpy"] == np.__version__
    assert cpu.probe() is probe  # cached per process

    probe = edgetpu.probe()
    assert not probe.available and probe.devices == ()
    assert probe.reason == "Edge TPU runtime libedgetpu not installed (apt-get install libedgetpu1-std)"
    assert probe.versions["ai-edge-litert"] == LITERT


def test_the_registry_imports_this_module_for_the_tflite_runtime() -> None:
    assert [b.name for b in registry.runtime_backends("tflite")] == ["tflite/cpu", "tflite/edgetpu"]


def test_the_probe_model_is_a_valid_tflite_file_that_adds_x_to_itself() -> None:
    data = tfl.tiny_model()
    assert len(data) < 1024 and schema.Model.ModelBufferHasIdentifier(data, 0)
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    [code] = model.operatorCodes
    assert code.builtinCode == schema.BuiltinOperator.ADD
    [subgraph] = model.subgraphs
    assert [t.name for t in subgraph.tensors] == [b"x", b"y"]
    assert all(t.type == schema.TensorType.FLOAT32 and list(t.shape) == [2] for t in subgraph.tensors)
    [op] = subgraph.operators
    assert (list(op.inputs), list(op.outputs)) == ([0, 0], [1])

    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    interpreter.allocate_tensors()
    interpreter.set_tensor(0, np.array([0.25, 7.0], np.float32))
    interpreter.invoke()
    assert interpreter.get_tensor(1).tolist() == [0.5, 14.0]


def test_a_source_that_imports_but_cannot_build_an_interpreter_does_not_count(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tflite-runtime 2.14 under numpy 2 imports, then fails in Interpreter(); a model the real
    # Interpreter cannot build fails at the same step.
    real = tfl.tiny_model()
    monkeypatch.setattr(tfl, "tiny_model", lambda: real[:40])
    probe = TfliteBackend("cpu").probe()
    assert not probe.available
    _one_line(
        probe.reason,
        "ai-edge-litert: cannot build an Interpreter: ValueError",
        "tflite-runtime: not installed",
        "pip install ai-edge-litert",
    )
    assert "ai-edge-litert" not in probe.versions
    assert not TfliteBackend("edgetpu").probe().available


def test_the_first_source_that_works_is_used_and_named(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tflite-runtime is not installed here: listed first, it is passed over.
    monkeypatch.setattr(tfl, "_SOURCES", tfl._SOURCES[::-1])
    assert tfl._SOURCES[0][1] == "tflite-runtime"
    probe = TfliteBackend("cpu").probe()
    assert probe.available and "tflite-runtime" not in probe.versions
    assert probe.versions["ai-edge-litert"] == LITERT


def test_edgetpu_probe_names_a_found_library_that_cannot_give_a_delegate(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    libc = ctypes.util.find_library("c")
    assert libc
    monkeypatch.setattr(tfl, "find_libedgetpu", lambda: libc)
    probe = TfliteBackend("edgetpu").probe()
    assert not probe.available
    _one_line(probe.reason, libc, "not a TFLite delegate library")
    assert TfliteBackend("cpu").probe().available


# --- real models on real photos -------------------------------------------------------------------------


def test_blazeface_short_range_finds_the_astronaut_and_not_the_cat(short_range: Session) -> None:
    assert short_range.backend == "tflite/cpu"
    [inp] = short_range.inputs
    assert (inp.name, inp.shape, inp.dtype) == ("input", (1, 128, 128, 3), "float32")
    assert [(o.name, o.shape, o.dtype) for o in short_range.outputs] == [
        ("regressors", (1, 896, 16), "float32"),
        ("classificators", (1, 896, 1), "float32"),
    ]
    # Weights are stored as float16 and DEQUANTIZEd once; the kernels compute in float32.
    assert short_range.precision == "fp32"
    assert isinstance(short_range, TfliteSession) and short_range.quantization == {}

    score, box = _best_face(short_range, SHORT_RANGE, skimage.data.astronaut())
    assert score > 0.9
    np.testing.assert_allclose(box, ASTRONAUT_FACE, atol=10)

    # The cat's best anchor scores 0.49 with bilinear resizing (0.58 with INTER_AREA): keep bilinear.
    score, _ = _best_face(short_range, SHORT_RANGE, skimage.data.chelsea())
    assert score < 0.5


def test_blazeface_full_range_sparse_finds_the_astronaut_and_not_the_cat(cpu: TfliteBackend) -> None:
    session = cpu.load(_artifact(FULL_RANGE))
    assert session.inputs[0].shape == (1, 192, 192, 3)
    assert [o.shape for o in session.outputs] == [(1, 2304, 16), (1, 2304, 1)]
    assert session.precision == "fp32"  # float16 weights pass DENSIFY then DEQUANTIZE: still constants

    score, box = _best_face(session, FULL_RANGE, skimage.data.astronaut())
    assert score > 0.88
    np.testing.assert_allclose(box, ASTRONAUT_FACE_FULL, atol=10)
    score, _ = _best_face(session, FULL_RANGE, skimage.data.chelsea())
    assert score < 0.1


def test_outputs_are_copies_and_warm_up_runs(short_range: Session) -> None:
    short_range.warm_up()
    first = short_range.run({"input": np.zeros((1, 128, 128, 3), np.float32)})
    kept = {name: value.copy() for name, value in first.items()}
    short_range.run({"input": np.ones((1, 128, 128, 3), np.float32)})
    for name, value in first.items():
        np.testing.assert_array_equal(value, kept[name])


def test_threads_option_sets_the_interpreters_thread_pool(cpu: TfliteBackend) -> None:
    def os_threads() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    image = skimage.data.astronaut()
    results, added = [], []
    sessions = []  # keep every interpreter (and its pool) alive while counting
    for threads in (1, 2):
        before = os_threads()
        session = cpu.load(_artifact(SHORT_RANGE), {"threads": threads})
        results.append(_best_face(session, SHORT_RANGE, image))
        # The threads that appeared: a thread an earlier test left may end meanwhile (later on a busy
        # machine), which a plain count would take off.
        added.append(len(os_threads() - before))
        sessions.append(session)
        assert isinstance(session, TfliteSession) and session.threads == threads
    assert added == [0, 1]  # XNNPACK's pool: the caller plus threads - 1 workers
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-3)


def test_bad_options_are_refused_naming_the_known_ones(cpu: TfliteBackend) -> None:
    with pytest.raises(BackendError) as error:
        cpu.load(_artifact(SHORT_RANGE), {"num_threads": 2})
    _one_line(str(error.value), "tflite/cpu", "num_threads", "known options: threads")
    with pytest.raises(BackendError) as error:
        cpu.load(_artifact(SHORT_RANGE), {"threads": 0})
    _one_line(str(error.value), "tflite/cpu", "threads", "greater than or equal to 1")
    assert TfliteBackend("edgetpu").options_model().model_dump() == {"threads": None, "device": None}
    assert TfliteOptions.model_validate({"threads": 2}).threads == 2


# --- what the backend refuses ---------------------------------------------------------------------------


def test_an_unsupported_custom_op_is_named(cpu: TfliteBackend) -> None:
    support = cpu.supports(_artifact(WITH_ATTENTION))
    assert not support.ok
    assert support.unsupported_ops == ("Landmarks2TransformMatrix",)
    _one_line(
        support.reason, "tflite/cpu", "face_landmark_with_attention.tflite", "Landmarks2TransformMatrix"
    )
    with pytest.raises(BackendError) as error:
        cpu.load(_artifact(WITH_ATTENTION))
    _one_line(
        str(error.value),
        "tflite/cpu cannot load face_landmark_with_attention.tflite: "
        f"unsupported operator Landmarks2TransformMatrix (no kernel in ai-edge-litert {LITERT})",
        "also uses custom ops TransformTensorBilinear, TransformLandmarks, not checked",
    )
    assert cpu.supports(_artifact(SHORT_RANGE)).ok


def test_other_formats_are_refused(cpu: TfliteBackend) -> None:
    onnx_file = (
        Path(importlib.util.find_spec("onnx").submodule_search_locations[0])  # type: ignore[union-attr,index]
        / "backend/test/data/light/light_squeezenet.onnx"
    )
    assert onnx_file.is_file()
    support = cpu.supports(_artifact(onnx_file, "onnx"))
    assert not support.ok
    _one_line(support.reason, "tflite/cpu runs .tflite files, not onnx")
    with pytest.raises(BackendError, match="not onnx"):
        cpu.load(_artifact(onnx_file, "onnx"))


@pytest.mark.parametrize("kind", ["truncated", "text", "empty", "missing"])
def test_broken_files_are_refused_in_one_line(cpu: TfliteBackend, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "blob-1234"
    if kind == "truncated":
        path.write_bytes(SHORT_RANGE.read_bytes()[:5000])
    elif kind == "text":
        path.write_text(Path(__file__).read_text())
    elif kind == "empty":
        path.write_bytes(b"")
    artifact = _artifact(path, name="face.tflite")  # the store names blobs by hash; messages use the name
    support = cpu.supports(artifact)
    assert not support.ok and support.unsupported_ops == ()
    _one_line(support.reason, "tflite/cpu", "face.tflite")
    with pytest.raises(BackendError) as error:
        cpu.load(artifact)
    _one_line(str(error.value), "tflite/cpu", "face.tflite")
    if kind in ("truncated", "text"):
        assert "not a valid Flatbuffer" in str(error.value)


def test_an_edgetpu_compiled_model_is_for_the_edgetpu_only(cpu: TfliteBackend, tmp_path: Path) -> None:
    compiled = edgetpu_model(tmp_path)
    assert tfl.is_edgetpu_model(compiled)
    assert tfl.custom_ops(compiled) == (EDGETPU_OP,)
    assert not tfl.is_edgetpu_model(SHORT_RANGE)
    assert tfl.custom_ops(WITH_ATTENTION) == (
        "Landmarks2TransformMatrix",
        "TransformTensorBilinear",
        "TransformLandmarks",
    )
    # The op name as bytes in a file that is not a model (this test's source) is not a compiled model.
    assert EDGETPU_OP.encode() in Path(__file__).read_bytes()
    assert not tfl.is_edgetpu_model(Path(__file__))

    support = cpu.supports(_artifact(compiled))
    assert not support.ok and support.unsupported_ops == (EDGETPU_OP,)
    _one_line(support.reason, "detector_edgetpu.tflite", "compiled for the Edge TPU", "tflite/edgetpu")
    # The marker check agrees with the runtime, which has no kernel for the op.
    with pytest.raises(BackendError) as error:
        cpu._open(_artifact(compiled), TfliteOptions())
    _one_line(str(error.value), "unsupported operator edgetpu-custom-op")

    edgetpu = TfliteBackend("edgetpu")
    support = edgetpu.supports(_artifact(compiled))
    assert not support.ok
    _one_line(support.reason, "tflite/edgetpu is not available", "libedgetpu not installed")
    support = edgetpu.supports(_artifact(SHORT_RANGE))
    assert not support.ok
    _one_line(support.reason, "face_detection_short_range.tflite is not compiled for the Edge TPU")
    with pytest.raises(BackendError, match="libedgetpu not installed"):
        edgetpu.load(_artifact(compiled))


# --- sessions -------------------------------------------------------------------------------------------


def test_a_quantised_model_reports_scale_zero_point_and_int8(cpu: TfliteBackend, tmp_path: Path) -> None:
    path = one_op_model(
        tmp_path / "dequantize.tflite",
        schema.BuiltinOperator.DEQUANTIZE,
        [tflite_tensor("q", [2], schema.TensorType.UINT8, quant=(0.5, 128))],
        tflite_tensor("y", [2]),
    )
    session = cpu.load(_artifact(path))
    assert isinstance(session, TfliteSession)
    assert session.precision == "int8"
    assert session.quantization == {"q": (0.5, 128)}
    assert [(s.name, s.dtype) for s in session.inputs] == [("q", "uint8")]
    out = session.run({"q": np.array([130, 120], np.uint8)})
    assert out["y"].tolist() == [1.0, -4.0]  # 0.5 * (q - 128)
    assert session.inputs[0].quantization == (0.5, 128)


# Scales as a converter picks them: -1..1 fits the integer range.
@pytest.mark.parametrize(("dtype", "quant"), [("int8", (0.0079, 0)), ("uint8", (0.0079, 128))])
def test_int_inputs_are_quantised_with_the_models_own_parameters(
    cpu: TfliteBackend, tmp_path: Path, dtype: str, quant: tuple[float, int]
) -> None:
    """Preprocessing gives the real values the float model wanted ((pixel/255 - 0.5) / 0.5, in -1..1),
    quantised with the scale and zero point stored in the model; the model's own DEQUANTIZE gets
    them back within half a step."""
    tensor_type = schema.TensorType.INT8 if dtype == "int8" else schema.TensorType.UINT8
    path = one_op_model(
        tmp_path / f"{dtype}.tflite",
        schema.BuiltinOperator.DEQUANTIZE,
        [tflite_tensor("image", [1, 8, 10, 3], tensor_type, quant=quant)],
        tflite_tensor("real", [1, 8, 10, 3]),
    )
    session = cpu.load(_artifact(path))
    config = PreprocessConfig(layout="nhwc", dtype=dtype, mean=[0.5], std=[0.5])  # type: ignore[arg-type]
    preprocess = Preprocessor(config, session.inputs)
    frame = np.random.default_rng(5).integers(0, 256, (16, 20, 3), dtype=np.uint8)
    tensor = preprocess(frame)
    assert tensor.dtype == np.dtype(dtype)
    real = session.run({"image": tensor})["real"]
    float_config = PreprocessConfig(layout="nhwc", mean=[0.5], std=[0.5])
    wanted = Preprocessor(float_config, [TensorSpec("image", (1, 8, 10, 3), "float32")])(frame)
    assert np.abs(real - wanted).max() <= quant[0] / 2 + 1e-6  # within half a quantisation step


def test_an_open_dimension_is_resized_to_the_fed_shape(cpu: TfliteBackend, tmp_path: Path) -> None:
    path = one_op_model(
        tmp_path / "double.tflite",
        schema.BuiltinOperator.ADD,
        [tflite_tensor("x", [1], signature=[-1])],
        tflite_tensor("y", [1], signature=[-1]),
    )
    session = cpu.load(_artifact(path))
    assert session.inputs[0].shape == (None,) and session.outputs[0].shape == (None,)
    assert session.run({"x": np.arange(3, dtype=np.float32)})["y"].tolist() == [0.0, 2.0, 4.0]
    assert session.run({"x": np.ones(5, np.float32)})["y"].tolist() == [2.0] * 5
    session.warm_up()


def test_run_errors_name_the_backend_and_the_model(short_range: Session, cpu: TfliteBackend) -> None:
    good = np.zeros((1, 128, 128, 3), np.float32)
    cases: list[tuple[dict[str, np.ndarray], str]] = [
        ({"image": good}, "inputs missing ['input'], unknown ['image']"),
        (
            {"input": np.zeros((1, 64, 64, 3), np.float32)},
            "has shape (1, 64, 64, 3), the model takes (1, 128, 128, 3)",
        ),
        ({"input": good.astype(np.float64)}, "FLOAT64"),
    ]
    for feeds, why in cases:
        with pytest.raises(BackendError) as error:
            short_range.run(feeds)
        _one_line(str(error.value), "tflite/cpu: run on face_detection_short_range.tflite failed", why)
    short_range.run({"input": good})  # a failed run leaves the session usable

    session = cpu.load(_artifact(SHORT_RANGE))
    session.close()
    with pytest.raises(BackendError, match="closed"):
        session.run({"input": good})
