"""The OpenVINO backend with the real runtime and real models (PP-OCR, MediaPipe, scikit-learn).

onnxruntime CPU is the reference: OpenVINO must give the same answers at f32, and within a looser
tolerance at whatever precision it picks by default (bf16 on CPUs with avx512_bf16 or AMX, else f32).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest

from providers.base import BackendError, ModelArtifact, Session
from providers.openvino_backend import FORMATS, OpenVinoBackend, OpenVinoOptions, discover

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"
DET_OUTPUT = "sigmoid_0.tmp_0"
SIGNS = ["EDGE CAMERA 42", "Gate B open", "Parking bay 7", "EXIT ONLY"]
F32_TOLERANCE = 1e-3
BF16_TOLERANCE = 2e-2


def _package_dir(package: str) -> Path:
    """A package's install directory, without importing it (mediapipe 0.10.21 wants numpy<2)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"{package} is not installed; it provides the real models these tests use")
    return Path(spec.submodule_search_locations[0])


def _model(package: str, relative: str) -> Path:
    path = _package_dir(package) / relative
    if not path.is_file():
        pytest.fail(f"real test model {path} is missing")
    return path


def _artifact(path: Path, fmt: str) -> ModelArtifact:
    return ModelArtifact(path, fmt, hashlib.sha256(path.read_bytes()).hexdigest())


def _store_blob(path: Path, directory: Path) -> Path:
    """A copy named like the store names blobs: by sha256, without an extension."""
    blob = directory / hashlib.sha256(path.read_bytes()).hexdigest()
    shutil.copyfile(path, blob)
    return blob


@pytest.fixture(scope="module")
def cls_path() -> Path:
    return _model("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")


@pytest.fixture(scope="module")
def det_path() -> Path:
    return _model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")


@pytest.fixture(scope="module")
def mediapipe_dir() -> Path:
    return _package_dir("mediapipe") / "modules"


@pytest.fixture(scope="module")
def cls_batch() -> tuple[np.ndarray, np.ndarray]:
    """Demo signs rendered upright and upside down (BGR, camera noise), as the cls model's input."""
    if str(SCRIPTS_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPTS_DIR))
    import make_demo_video

    rng = np.random.default_rng(7)
    images, labels = [], []
    for text in SIGNS:
        for upside_down in (False, True):
            image = make_demo_video.render_sign(text, upside_down, rng)
            resized = cv2.resize(image, (192, 48), interpolation=cv2.INTER_LINEAR).astype(np.float32)
            images.append(((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))
            labels.append(int(upside_down))
    return np.stack(images).astype(np.float32), np.array(labels)


@pytest.fixture(scope="module")
def cls_reference(cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(cls_path), providers=["CPUExecutionProvider"])
    probs: np.ndarray = session.run([CLS_OUTPUT], {"x": cls_batch[0]})[0]
    # The reference itself must be right, or agreeing with it proves nothing.
    assert (probs.argmax(axis=1) == cls_batch[1]).all(), probs
    return probs


@pytest.fixture(scope="module")
def det_input() -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A 256x640 (multiples of 32) white canvas with "EDGE CAMERA 42"; its text box (x1, y1, x2, y2)."""
    image = np.full((256, 640, 3), 255, np.uint8)
    text, origin, scale, thickness = "EDGE CAMERA 42", (30, 80), 1.5, 3
    cv2.putText(image, text, origin, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thickness, cv2.LINE_AA)
    (width, height), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    box = (origin[0], origin[1] - height, origin[0] + width, origin[1] + baseline)
    tensor = ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None]
    return np.ascontiguousarray(tensor), box


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-np.clip(logits, -50, 50))))


def _cpu_capabilities() -> list[str]:
    return [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


# --- discover / probe ----------------------------------------------------------------------------


def test_discover_lists_cpu_and_auto_available_and_explains_missing_gpu_and_npu() -> None:
    backends = {b.name: b for b in discover()}
    assert {"openvino/CPU", "openvino/GPU", "openvino/NPU", "openvino/AUTO"} <= set(backends)
    for backend in backends.values():
        assert backend.runtime == "openvino"
        assert backend.name == f"openvino/{backend.device}"
        assert backend.formats == FORMATS == {"onnx", "openvino-ir", "tflite"}
        assert backend.options_model is OpenVinoOptions

    cpu = backends["openvino/CPU"].probe()
    assert cpu.available, cpu.reason
    assert cpu.versions == {"openvino": ov.__version__}
    assert cpu.reason == ov.Core().get_property("CPU", "FULL_DEVICE_NAME") != ""
    assert cpu.devices == ("CPU",)

    auto = backends["openvino/AUTO"].probe()
    assert auto.available, auto.reason
    assert "CPU" in auto.devices and "CPU" in auto.reason

    # This machine has neither: OpenVINO lists only the CPU, and the probes say what is missing.
    assert ov.Core().available_devices == ["CPU"]
    npu = backends["openvino/NPU"].probe()
    assert not npu.available
    assert npu.reason.startswith("no OpenVINO NPU device: the NPU user-space driver")
    assert "linux-npu-driver" in npu.reason and "/dev/accel" in npu.reason
    assert "OpenVINO sees: CPU" in npu.reason
    gpu = backends["openvino/GPU"].probe()
    assert not gpu.available
    assert gpu.reason.startswith("no OpenVINO GPU device") and "/dev/dri" in gpu.reason
    assert gpu.versions == {"openvino": ov.__version__}


def test_probe_of_unknown_device_never_raises() -> None:
    probe = OpenVinoBackend("MYRIAD").probe()
    assert not probe.available
    assert probe.reason == "no OpenVINO MYRIAD device (OpenVINO sees: CPU)"


# --- PP-OCR against onnxruntime ------------------------------------------------------------------


@pytest.mark.parametrize("device", ["CPU", "AUTO"])
def test_cls_at_f32_matches_onnxruntime(
    device: str, cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray], cls_reference: np.ndarray
) -> None:
    session = OpenVinoBackend(device).load(_artifact(cls_path, "onnx"), {"precision": "f32"})
    assert session.precision == "fp32"
    assert session.execution_devices == ("CPU",)  # type: ignore[attr-defined]
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [("x", (None, 3, None, None), "float32")]
    # The ONNX output name, not the "softmax_0.tmp_0" OpenVINO adds once it folds the scale away.
    assert [(s.name, s.shape, s.dtype) for s in session.outputs] == [(CLS_OUTPUT, (None, 2), "float32")]

    outputs = session.run({"x": cls_batch[0]})
    assert list(outputs) == [CLS_OUTPUT]
    probs = outputs[CLS_OUTPUT]
    assert probs.shape == (len(SIGNS) * 2, 2) and probs.dtype == np.float32
    assert (probs.argmax(axis=1) == cls_reference.argmax(axis=1)).all()
    assert (probs.argmax(axis=1) == cls_batch[1]).all()
    assert np.abs(probs - cls_reference).max() < F32_TOLERANCE


def test_cls_default_precision_is_reported_and_within_its_tolerance(
    cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray], cls_reference: np.ndarray
) -> None:
    artifact = _artifact(cls_path, "onnx")
    default = OpenVinoBackend("CPU").load(artifact)
    auto = OpenVinoBackend("AUTO").load(artifact)
    print(f"OpenVINO CPU default precision here: {default.precision} (capabilities {_cpu_capabilities()})")
    assert default.precision in {"fp32", "bf16"}
    assert auto.precision == default.precision  # AUTO picks the CPU here and reports its precision
    probs = default.run({"x": cls_batch[0]})[CLS_OUTPUT]
    assert (probs.argmax(axis=1) == cls_reference.argmax(axis=1)).all()
    f32 = OpenVinoBackend("CPU").load(artifact, {"precision": "f32"}).run({"x": cls_batch[0]})[CLS_OUTPUT]
    if default.precision == "fp32":  # a CPU without avx512_bf16/AMX: the default is f32 itself
        assert "BF16" not in _cpu_capabilities()
        assert np.abs(probs - f32).max() < 1e-6
        assert np.abs(probs - cls_reference).max() < F32_TOLERANCE
    else:
        assert np.abs(probs - cls_reference).max() < BF16_TOLERANCE


def test_requested_precision_the_cpu_lacks_is_reported_as_what_runs(
    cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray], cls_reference: np.ndarray
) -> None:
    session = OpenVinoBackend("CPU").load(_artifact(cls_path, "onnx"), {"precision": "bf16"})
    probs = session.run({"x": cls_batch[0]})[CLS_OUTPUT]
    if "BF16" in _cpu_capabilities():
        assert session.precision == "bf16"
        assert np.abs(probs - cls_reference).max() < BF16_TOLERANCE
    else:  # OpenVINO keeps f32 without saying so; the session reports what the compiled model uses
        assert session.precision == "fp32"
        assert np.abs(probs - cls_reference).max() < F32_TOLERANCE
    assert (probs.argmax(axis=1) == cls_batch[1]).all()


def test_det_probability_map_at_f32_matches_onnxruntime(
    det_path: Path, det_input: tuple[np.ndarray, tuple[int, int, int, int]]
) -> None:
    tensor, (x1, y1, x2, y2) = det_input
    reference = ort.InferenceSession(str(det_path), providers=["CPUExecutionProvider"]).run(
        [DET_OUTPUT], {"x": tensor}
    )[0]
    session = OpenVinoBackend("CPU").load(_artifact(det_path, "onnx"), {"precision": "f32"})
    assert session.precision == "fp32"
    assert [s.name for s in session.outputs] == [DET_OUTPUT]
    probs = session.run({"x": tensor})[DET_OUTPUT]
    assert probs.shape == reference.shape == (1, 1, 256, 640)
    assert np.abs(probs - reference).max() < F32_TOLERANCE
    # And the map is a real detection: text inside the putText box, nothing elsewhere.
    inside = probs[0, 0, y1:y2, x1:x2]
    outside = probs[0, 0].copy()
    outside[max(0, y1 - 10) : y2 + 10, max(0, x1 - 10) : x2 + 10] = 0
    assert inside.max() > 0.9 and inside.mean() > 0.2
    assert outside.max() < 0.3

    # At the default precision (bf16 on AMX CPUs) single pixels of the map move a lot (up to 0.9
    # was seen on a Sapphire Rapids Xeon) while the text regions stay: compare those, not the max.
    default = OpenVinoBackend("CPU").load(_artifact(det_path, "onnx"))
    probs = default.run({"x": tensor})[DET_OUTPUT]
    mask, reference_mask = probs[0, 0] > 0.3, reference[0, 0] > 0.3
    iou = (mask & reference_mask).sum() / (mask | reference_mask).sum()
    if default.precision == "fp32":
        assert np.abs(probs - reference).max() < F32_TOLERANCE
    else:
        assert default.precision == "bf16"
        assert iou > 0.95 and np.abs(probs - reference).mean() < F32_TOLERANCE


# --- TFLite ----------------------------------------------------------------------------------------


def test_tflite_face_detector_stored_by_hash_loads_and_finds_the_astronaut(
    mediapipe_dir: Path, tmp_path: Path
) -> None:
    import skimage.data

    source = mediapipe_dir / "face_detection/face_detection_short_range.tflite"
    blob = _store_blob(source, tmp_path)  # no ".tflite": OpenVINO's TFLite reader needs one
    artifact = ModelArtifact(blob, "tflite", blob.name, name=source.name)
    backend = OpenVinoBackend("CPU")
    assert "tflite" in backend.formats
    assert backend.supports(artifact).ok
    session = backend.load(artifact)
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [("input", (1, 128, 128, 3), "float32")]
    assert [(s.name, s.shape) for s in session.outputs] == [
        ("regressors", (1, 896, 16)),
        ("classificators", (1, 896, 1)),
    ]
    rgb = cv2.resize(skimage.data.astronaut(), (128, 128), interpolation=cv2.INTER_AREA)
    outputs = session.run({"input": (rgb.astype(np.float32) / 127.5 - 1.0)[None]})
    assert outputs["regressors"].shape == (1, 896, 16)
    assert outputs["classificators"].shape == (1, 896, 1)
    scores = _sigmoid(outputs["classificators"][0, :, 0])
    assert scores.max() > 0.8  # MODELS.md: 0.921 on LiteRT
    negative = cv2.resize(skimage.data.chelsea(), (128, 128), interpolation=cv2.INTER_AREA)
    cat = session.run({"input": (negative.astype(np.float32) / 127.5 - 1.0)[None]})["classificators"]
    assert _sigmoid(cat).max() < 0.5


def test_tflite_with_operator_openvino_lacks_is_unsupported(mediapipe_dir: Path) -> None:
    artifact = _artifact(mediapipe_dir / "selfie_segmentation/selfie_segmentation.tflite", "tflite")
    backend = OpenVinoBackend("CPU")
    support = backend.supports(artifact)
    assert not support.ok
    assert support.unsupported_ops == ("Convolution2DTransposeBias",)
    assert "selfie_segmentation.tflite" in support.reason
    assert "unsupported operators: Convolution2DTransposeBias" in support.reason
    with pytest.raises(BackendError, match="Convolution2DTransposeBias") as err:
        backend.load(artifact)
    assert "\n" not in str(err.value) and str(err.value).startswith("openvino/CPU cannot load")


# --- ONNX-ML (scikit-learn) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("estimator", "expected_ops"),
    [
        ("logistic_regression", ("LinearClassifier", "ZipMap")),
        ("random_forest", ("TreeEnsembleClassifier", "ZipMap")),
    ],
)
def test_sklearn_model_names_the_onnx_ml_operators_openvino_lacks(
    estimator: str, expected_ops: tuple[str, ...], tmp_path: Path
) -> None:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    model = (
        LogisticRegression(max_iter=500)
        if estimator == "logistic_regression"
        else RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0)
    ).fit(features, labels)
    path = tmp_path / f"{estimator}.onnx"
    path.write_bytes(to_onnx(model, features[:1]).SerializeToString())
    # A real model: onnxruntime runs it and gets iris right.
    predicted = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["output_label"], {"X": features}
    )[0]
    assert (predicted == labels).mean() > 0.9

    for device in ("CPU", "AUTO"):
        support = OpenVinoBackend(device).supports(_artifact(path, "onnx"))
        assert not support.ok
        assert support.unsupported_ops == expected_ops
        assert f"unsupported operators: {', '.join(expected_ops)}" in support.reason
        assert "\n" not in support.reason
    with pytest.raises(BackendError, match=f"openvino/CPU cannot load {estimator}.onnx: "):
        OpenVinoBackend("CPU").load(_artifact(path, "onnx"))


# --- options -------------------------------------------------------------------------------------


def test_unknown_option_names_the_key_and_the_known_options(cls_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        OpenVinoBackend("CPU").load(_artifact(cls_path, "onnx"), {"cache_dirr": "/tmp/x"})
    message = str(err.value)
    assert message.startswith("openvino/CPU: bad options: cache_dirr:")
    assert "known options: cache_dir, hint, precision, num_streams, threads, weights" in message
    with pytest.raises(BackendError, match="precision"):
        OpenVinoBackend("CPU").load(_artifact(cls_path, "onnx"), {"precision": "int4"})
    with pytest.raises(BackendError, match="threads"):
        OpenVinoBackend("CPU").load(_artifact(cls_path, "onnx"), {"threads": 0})
    with pytest.raises(BackendError, match="`threads` applies to the CPU only"):
        OpenVinoBackend("GPU").load(_artifact(cls_path, "onnx"), {"threads": 2})


def test_cache_dir_gets_compiled_blobs(cls_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "ov-cache"
    artifact = _artifact(cls_path, "onnx")
    OpenVinoBackend("CPU").load(artifact, {"cache_dir": str(cache)})
    blobs = sorted(p.name for p in cache.iterdir())
    assert blobs and all(name.endswith(".blob") for name in blobs)
    OpenVinoBackend("CPU").load(artifact, {"cache_dir": str(cache)})  # a cache hit adds nothing
    assert sorted(p.name for p in cache.iterdir()) == blobs


def test_throughput_hint_streams_and_threads_compile_and_agree(
    cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray], cls_reference: np.ndarray
) -> None:
    artifact = _artifact(cls_path, "onnx")
    for options in (
        {"hint": "throughput", "precision": "f32"},
        {"num_streams": 1, "threads": 1, "precision": "f32"},
        {"hint": "throughput", "threads": 1, "precision": "f32"},
    ):
        for device in ("CPU", "AUTO"):
            session = OpenVinoBackend(device).load(artifact, options)
            probs = session.run({"x": cls_batch[0]})[CLS_OUTPUT]
            assert np.abs(probs - cls_reference).max() < F32_TOLERANCE, (device, options)


# --- bad input -----------------------------------------------------------------------------------


def test_non_model_and_truncated_onnx_are_refused_in_one_line(cls_path: Path, tmp_path: Path) -> None:
    not_a_model = tmp_path / "notes.onnx"
    not_a_model.write_text("these are not the weights you are looking for\n")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(cls_path.read_bytes()[:200_000])
    backend = OpenVinoBackend("CPU")
    for path, fmt, why in (
        (not_a_model, "onnx", "Unable to read the model"),
        (not_a_model, "tflite", "Unable to read the model"),
        (truncated, "onnx", "Model can't be parsed"),
    ):
        artifact = _artifact(path, fmt)
        support = backend.supports(artifact)
        assert not support.ok and support.unsupported_ops == ()
        assert support.reason.startswith(f"openvino/CPU cannot read {path.name}: ")
        assert why in support.reason and "\n" not in support.reason
        with pytest.raises(BackendError) as err:
            backend.load(artifact)
        assert str(err.value).startswith(f"openvino/CPU cannot load {path.name}: ")
        assert why in str(err.value) and "\n" not in str(err.value)
    # Formats it does not read are refused before any reading.
    support = backend.supports(ModelArtifact(cls_path, "tensorrt-engine", "0" * 64))
    assert not support.ok and "not tensorrt-engine" in support.reason
    with pytest.raises(BackendError, match="not tensorrt-engine"):
        backend.load(ModelArtifact(cls_path, "tensorrt-engine", "0" * 64))


def test_run_with_wrong_input_names_raises_and_outputs_are_copies(
    cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray]
) -> None:
    session: Session = OpenVinoBackend("CPU").load(_artifact(cls_path, "onnx"))
    with pytest.raises(BackendError, match=r"openvino/CPU: run failed: inputs \['image'\] .* \['x'\]"):
        session.run({"image": cls_batch[0]})
    first = session.run({"x": cls_batch[0][:1]})[CLS_OUTPUT]
    kept = first.copy()
    session.run({"x": cls_batch[0][1:2]})  # the upside-down one: the request's buffer changes
    np.testing.assert_array_equal(first, kept)
    session.warm_up({"x": (1, 3, 48, 192)})


# --- IR and output names -------------------------------------------------------------------------


def test_openvino_ir_reads_weights_from_sibling_or_option(
    cls_path: Path, cls_batch: tuple[np.ndarray, np.ndarray], cls_reference: np.ndarray, tmp_path: Path
) -> None:
    ov.save_model(ov.Core().read_model(str(cls_path)), str(tmp_path / "cls.xml"), compress_to_fp16=False)
    # As the store keeps it: the graph as a blob named by hash, the weights as "<hash>.bin".
    xml = _store_blob(tmp_path / "cls.xml", tmp_path)
    shutil.copyfile(tmp_path / "cls.bin", xml.with_suffix(".bin"))
    backend = OpenVinoBackend("CPU")
    artifact = ModelArtifact(xml, "openvino-ir", xml.name, name="cls.xml")
    assert backend.supports(artifact).ok
    session = backend.load(artifact, {"precision": "f32"})
    assert [s.name for s in session.outputs] == [CLS_OUTPUT]
    assert np.abs(session.run({"x": cls_batch[0]})[CLS_OUTPUT] - cls_reference).max() < F32_TOLERANCE

    xml.with_suffix(".bin").rename(tmp_path / "weights-elsewhere")
    support = backend.supports(artifact)
    assert not support.ok and "IR weights not found" in support.reason
    session = backend.load(artifact, {"precision": "f32", "weights": str(tmp_path / "weights-elsewhere")})
    assert np.abs(session.run({"x": cls_batch[0]})[CLS_OUTPUT] - cls_reference).max() < F32_TOLERANCE
    with pytest.raises(BackendError, match="`weights` applies to openvino-ir artifacts only"):
        backend.load(_artifact(cls_path, "onnx"), {"weights": str(tmp_path / "weights-elsewhere")})


def test_outputs_keep_their_onnx_names_when_openvino_merges_tensors(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    # y = Identity(Relu(x)): compiled, OpenVINO's port for "y" answers to "r" as its any_name.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
    )
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    session = OpenVinoBackend("CPU").load(_artifact(path, "onnx"))
    assert [(s.name, s.shape) for s in session.outputs] == [("y", (1, None))]
    result = session.run({"x": np.array([[1.5, -2.0, 3.0]], np.float32)})
    assert list(result) == ["y"]
    np.testing.assert_array_equal(result["y"], [[1.5, 0.0, 3.0]])
