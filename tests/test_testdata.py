"""A model version's test data: NumPy .npz archives of inputs (and expected outputs) shipped as
"test-data" artifacts, checked when published, pulled with the model, and used by backend selection
and `edge-agent bench`. Real models (PP-OCR cls on a rendered sign, BlazeFace on a photo), the real
backends of this box, real files; every trial runs in a child process as it does in the daemon.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from skimage import data as skimage_data
from typer.testing import CliRunner

from agent.backend_choice import choose_and_load
from agent.cli import app
from agent.config import (
    AgentConfig,
    BackendChoiceConfig,
    ClassificationPostprocess,
    DeviceConfig,
    ModelRef,
    PipelineConfig,
    RegistryConfig,
    SelectionConfig,
    VideoSourceConfig,
)
from agent.errors import EdgeAgentError, ModelError, RegistryError
from agent.registry import FileRegistry, Manifest, PublishOptions
from agent.store import ModelStore
from agent.testdata import TestData, load_testdata
from agent.testdata import testdata_samples as samples_from_testdata
from agent.tools.bench import bench_feeds, parse_shapes
from agent.tools.inventory import ResolvedModel
from providers import (
    Decision,
    ModelArtifact,
    NoBackendError,
    SelectionPolicy,
    TensorSpec,
    TrialRequest,
    TrialResult,
    all_backends,
    decide,
    run_trial_isolated,
)
from providers.select import Sample, reference_session
from tests.cpu_precision import assert_judged_on_its_numbers
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, demo_video_module
from tests.selection_fixtures import (
    CLS_OUTPUT,
    QUICK,
    artifact_of,
    explained_others,
    preprocessed_sign,
    run_cls,
)
from tests.store_fixtures import CLS_NAME, CLS_VERSION

ORT_CPU = "onnxruntime/CPUExecutionProvider"
NOT_FITTING = "not tried: no test input fits this artifact"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.fixture(scope="module")
def cls_input(cls_model_path: Path) -> np.ndarray:
    """An upside-down rendered sign, preprocessed for the cls model."""
    return preprocessed_sign(cls_model_path, "Gate B open", True, 3)


@pytest.fixture(scope="module")
def cls_probs(cls_model_path: Path, cls_input: np.ndarray) -> np.ndarray:
    probs = run_cls(cls_model_path, cls_input)
    assert probs.shape == (1, 2) and int(probs.argmax()) == 1, probs  # upside down
    assert float(probs.max()) > 0.8, probs  # far from 50/50: swapping the two is clearly wrong
    return probs


@pytest.fixture(scope="module")
def good_npz(tmp_path_factory: pytest.TempPathFactory, cls_input: np.ndarray, cls_probs: np.ndarray) -> Path:
    """Test data for the cls model: its input and the outputs onnxruntime computes on it."""
    folder = tmp_path_factory.mktemp("testdata")
    return _savez(folder / "inputs.npz", {"x": cls_input, f"expected:{CLS_OUTPUT}": cls_probs})


@pytest.fixture(scope="module")
def blazeface() -> tuple[ModelArtifact, dict[str, np.ndarray]]:
    """mediapipe's BlazeFace .tflite and the astronaut photo letterboxed for it."""
    spec = importlib.util.find_spec("mediapipe")  # located, never imported (it wants numpy < 2)
    assert spec is not None and spec.submodule_search_locations
    model = (
        Path(spec.submodule_search_locations[0]) / "modules/face_detection/face_detection_short_range.tflite"
    )
    return artifact_of(model, "tflite"), {"input": _letterbox(skimage_data.astronaut(), 128)}


def _letterbox(image: np.ndarray, size: int) -> np.ndarray:
    """RGB uint8 -> float32 [1, size, size, 3] in [-1, 1], aspect kept, padded with black."""
    scale = size / max(image.shape[:2])
    h, w = round(image.shape[0] * scale), round(image.shape[1] * scale)
    canvas = np.zeros((size, size, 3), np.uint8)
    top, left = (size - h) // 2, (size - w) // 2
    canvas[top : top + h, left : left + w] = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
    return (canvas.astype(np.float32) / 127.5 - 1.0)[None]


# --- 1. reading a test data archive ------------------------------------------------------------------


def test_a_valid_archive_splits_into_inputs_and_expected_outputs(
    good_npz: Path, cls_input: np.ndarray, cls_probs: np.ndarray
) -> None:
    sample = load_testdata(good_npz)
    assert sample.origin == "test data inputs.npz" and sample.fits is None
    assert set(sample.feeds) == {"x"}
    np.testing.assert_array_equal(sample.feeds["x"], cls_input)
    assert sample.feeds["x"].dtype == np.float32
    assert sample.expected is not None and set(sample.expected) == {CLS_OUTPUT}
    np.testing.assert_array_equal(sample.expected[CLS_OUTPUT], cls_probs)

    labelled = load_testdata(good_npz, "cls.npz (from pp-ocr-cls@2.0)")
    assert labelled.origin == "test data cls.npz (from pp-ocr-cls@2.0)"


def test_an_archive_without_expected_outputs_has_none(tmp_path: Path) -> None:
    ints = np.arange(12, dtype=np.int64).reshape(3, 4)
    sample = load_testdata(_savez(tmp_path / "ids.npz", {"ids": ints, "mask": ints > 5}))
    assert sample.expected is None and set(sample.feeds) == {"ids", "mask"}
    assert sample.feeds["mask"].dtype == np.bool_


def _bad_random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(512))


def _bad_single_npy(path: Path) -> None:
    with path.open("wb") as f:
        np.save(f, np.zeros((1, 3), np.float32))


def _bad_object_array(path: Path) -> None:
    np.savez(path, x=np.array([{"a": 1}, None], dtype=object))


def _bad_dates_array(path: Path) -> None:
    np.savez(path, x=np.array(["2026-11-23"], dtype="datetime64[D]"))


def _bad_only_expected(path: Path) -> None:
    np.savez(path, **{"expected:y": np.ones((1, 2), np.float32)})  # type: ignore[arg-type]


def _bad_empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize(
    ("write", "problem"),
    [
        (_bad_random_bytes, "is not valid test data: not a NumPy .npz archive (no zip structure)"),
        (_bad_single_npy, "is not valid test data: a single .npy array, not an .npz archive"),
        (_bad_object_array, "is not valid test data (a NumPy .npz archive): Object arrays cannot be loaded"),
        (_bad_dates_array, "is not valid test data: array 'x' holds datetime64[D], not numbers or strings"),
        (_bad_only_expected, "is not valid test data: no input arrays (it has 'y'; name each input array"),
        (_bad_empty, "is not valid test data: not a NumPy .npz archive (no zip structure)"),
    ],
    ids=["random-bytes", "single-npy", "object-array", "dates-array", "only-expected", "empty"],
)
def test_a_bad_archive_is_a_model_error_naming_file_and_problem(
    tmp_path: Path, write: Any, problem: str
) -> None:
    path = tmp_path / "bad.npz"
    write(path)
    with pytest.raises(ModelError) as caught:
        load_testdata(path)
    message = str(caught.value)
    assert message.startswith("bad.npz " + problem), message
    assert "\n" not in message
    with pytest.raises(ModelError) as caught:
        load_testdata(path, "inputs.npz of m@1")
    assert str(caught.value).startswith("inputs.npz of m@1 " + problem), str(caught.value)


# --- 2. the manifest -----------------------------------------------------------------------------------


def _manifest(*artifacts: dict[str, object]) -> bytes:
    doc = {
        "schema_version": 1,
        "name": "m",
        "version": "1",
        "created": "2024-05-01T12:00:00Z",
        "artifacts": list(artifacts),
    }
    return json.dumps(doc).encode()


def _entry(file: str, fmt: str, **extra: object) -> dict[str, object]:
    return {"file": file, "sha256": "a" * 64, "size": 10, "format": fmt, **extra}


def _manifest_error(data: bytes) -> str:
    with pytest.raises(RegistryError) as caught:
        Manifest.parse_bytes(data, "/reg/m/1/manifest.json")
    message = str(caught.value)
    assert message.startswith("invalid model manifest /reg/m/1/manifest.json: "), message
    return message


def test_model_file_is_for_test_data_artifacts_only() -> None:
    message = _manifest_error(
        _manifest(_entry("model.onnx", "onnx"), _entry("other.onnx", "onnx", model_file="model.onnx"))
    )
    assert "artifact 'other.onnx': model_file is for test-data artifacts only" in message


def test_model_file_must_name_a_model_file_of_the_version() -> None:
    message = _manifest_error(
        _manifest(
            _entry("model.onnx", "onnx"),
            _entry("model.tflite", "tflite"),
            _entry("a.npz", "test-data"),
            _entry("inputs.npz", "test-data", model_file="a.npz"),
        )
    )
    assert (
        "artifact 'inputs.npz': model_file 'a.npz' is not a model file of this version "
        "(it has: model.onnx, model.tflite)"
    ) in message
    message = _manifest_error(
        _manifest(_entry("model.onnx", "onnx"), _entry("inputs.npz", "test-data", model_file="nope.onnx"))
    )
    assert "model_file 'nope.onnx' is not a model file of this version (it has: model.onnx)" in message


def test_a_version_of_test_data_only_is_refused() -> None:
    message = _manifest_error(_manifest(_entry("inputs.npz", "test-data")))
    assert "no model file among the artifacts (only test data)" in message


def test_unknown_artifact_format_names_the_key_path() -> None:
    message = _manifest_error(_manifest(_entry("model.onnx", "onnx"), _entry("inputs.npy", "test-inputs")))
    assert "artifacts[1].format: " in message and "'test-data'" in message


def test_a_manifest_with_test_data_splits_models_and_test_data() -> None:
    manifest = Manifest.parse_bytes(
        _manifest(
            _entry("model.onnx", "onnx"),
            _entry("cls.npz", "test-data", model_file="model.onnx"),
            _entry("model.tflite", "tflite"),
            _entry("any.npz", "test-data"),
        ),
        "manifest.json",
    )
    assert [a.file for a in manifest.models()] == ["model.onnx", "model.tflite"]
    assert [(a.file, a.model_file) for a in manifest.testdata()] == [
        ("cls.npz", "model.onnx"),
        ("any.npz", None),
    ]
    assert manifest.primary("test-data").file == "cls.npz"
    again = Manifest.parse_bytes(manifest.to_bytes(), "again")
    assert again == manifest


# --- 3. publishing and pulling test data ---------------------------------------------------------------


def test_publish_with_test_data_lists_it_and_a_pull_installs_it(
    tmp_path: Path, cls_model_path: Path, good_npz: Path
) -> None:
    registry = FileRegistry(tmp_path / "registry")
    manifest = registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(testdata=[good_npz]))

    assert [(a.file, a.format) for a in manifest.artifacts] == [
        (cls_model_path.name, "onnx"),
        ("inputs.npz", "test-data"),
    ]
    [data] = manifest.testdata()
    assert data.sha256 == _sha(good_npz) and data.size == good_npz.stat().st_size
    assert data.model_file is None
    assert registry.get_manifest(CLS_NAME, CLS_VERSION) == manifest
    assert (registry.root / CLS_NAME / CLS_VERSION / "inputs.npz").read_bytes() == good_npz.read_bytes()

    installed = ModelStore(tmp_path / "store").pull(registry, CLS_NAME, CLS_VERSION)
    [data_file] = installed.testdata_artifacts()
    artifact = data_file.artifact
    assert data_file.model_file is None and data_file.rtol is None and data_file.atol is None
    assert (artifact.format, artifact.sha256, artifact.label) == ("test-data", data.sha256, "inputs.npz")
    assert artifact.path.read_bytes() == good_npz.read_bytes()
    [model] = installed.model_artifacts()
    assert (model.format, model.label) == ("onnx", cls_model_path.name)
    assert model.path.read_bytes() == cls_model_path.read_bytes()
    sample = load_testdata(artifact.path, artifact.label)
    assert sample.origin == "test data inputs.npz" and sample.expected is not None


def test_expected_outputs_of_another_sign_computed_by_onnxruntime_are_accepted(
    tmp_path: Path, cls_model_path: Path
) -> None:
    upright = preprocessed_sign(cls_model_path, "EDGE CAMERA 42", False, 1)
    probs = run_cls(cls_model_path, upright)
    assert int(probs.argmax()) == 0, probs
    npz = _savez(tmp_path / "upright.npz", {"x": upright, f"expected:{CLS_OUTPUT}": probs})
    registry = FileRegistry(tmp_path / "registry")
    manifest = registry.publish(cls_model_path, CLS_NAME, "2.1", PublishOptions(testdata=[npz]))
    assert [a.file for a in manifest.testdata()] == ["upright.npz"]


def _refused_publish(tmp_path: Path, model: Path, arrays: Mapping[str, np.ndarray]) -> str:
    npz = _savez(tmp_path / "bad-inputs.npz", arrays)
    registry = FileRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError) as caught:
        registry.publish(model, CLS_NAME, CLS_VERSION, PublishOptions(testdata=[npz]))
    message = str(caught.value)
    assert message.startswith(f"refusing to publish test data {npz.name}: it fits no model file"), message
    # Nothing is published: no manifest, no version (nor model) directory, no staged files.
    assert not (registry.root / CLS_NAME).exists()
    assert registry.list_models() == []
    with pytest.raises(RegistryError, match="not found"):
        registry.get_manifest(CLS_NAME, CLS_VERSION)
    return message


def test_publish_refuses_test_data_for_an_input_the_model_does_not_have(
    tmp_path: Path, cls_model_path: Path, cls_input: np.ndarray
) -> None:
    message = _refused_publish(tmp_path, cls_model_path, {"image": cls_input})
    assert message.endswith("missing input 'x'; no model input named 'image' (the model's inputs: x))")


def test_publish_refuses_test_data_of_the_wrong_dtype(
    tmp_path: Path, cls_model_path: Path, cls_input: np.ndarray
) -> None:
    message = _refused_publish(tmp_path, cls_model_path, {"x": cls_input.astype(np.float64)})
    assert message.endswith("input 'x' is float64, the model wants float32)")


def test_publish_refuses_test_data_with_a_wrong_fixed_dimension(tmp_path: Path, cls_model_path: Path) -> None:
    # The cls model's channels (3) are fixed; batch, height and width are open.
    wrong = np.zeros((1, 4, 48, 192), np.float32)
    message = _refused_publish(tmp_path, cls_model_path, {"x": wrong})
    assert message.endswith("input 'x' has shape [1, 4, 48, 192], the model wants ['?', 3, '?', '?'])")


def test_publish_refuses_test_data_whose_expected_outputs_are_wrong(
    tmp_path: Path, cls_model_path: Path, cls_input: np.ndarray, cls_probs: np.ndarray
) -> None:
    swapped = np.ascontiguousarray(cls_probs[:, ::-1])
    npz = _savez(tmp_path / "swapped.npz", {"x": cls_input, f"expected:{CLS_OUTPUT}": swapped})
    registry = FileRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError) as caught:
        registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(testdata=[npz]))
    message = caught.value.message
    assert message.startswith(
        f"refusing to publish {CLS_NAME}@{CLS_VERSION}: no backend of this box gives the expected outputs"
    ), message
    # Each backend that ran it, with the numbers.
    for backend in (ORT_CPU, "openvino/CPU"):
        assert (
            f"{backend} on {cls_model_path.name}: test data swapped.npz: output '{CLS_OUTPUT}' differs from "
            "the reference: 100.0% of values off"
        ) in message, message
    assert "TensorrtExecutionProvider" not in message  # backends this box lacks are no reason about the model
    assert not (registry.root / CLS_NAME).exists()


def test_publish_refuses_a_test_data_file_that_is_no_archive(tmp_path: Path, cls_model_path: Path) -> None:
    npz = tmp_path / "inputs.npz"
    npz.write_bytes(b"not a zip at all, just text\n" * 10)
    registry = FileRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError) as caught:
        registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(testdata=[npz]))
    assert str(caught.value) == (
        f"refusing to publish {npz} as {CLS_NAME}@{CLS_VERSION}: inputs.npz is not valid test data: not a "
        "NumPy .npz archive (no zip structure)"
    )
    assert not (registry.root / CLS_NAME).exists()


# --- 4. decide() with samples ------------------------------------------------------------------------


def _tried(decision: Decision) -> list[Any]:
    return [c for c in decision.candidates if c.median_ms is not None]


def test_expected_outputs_are_the_reference(
    cls_model_path: Path, cls_input: np.ndarray, cls_probs: np.ndarray
) -> None:
    artifact = artifact_of(cls_model_path)
    sample = Sample({"x": cls_input}, "test data inputs.npz", {CLS_OUTPUT: cls_probs})
    policy = SelectionPolicy(max_trials=2, **QUICK)
    decision = decide([artifact], policy, [sample])

    assert decision.checked is True
    assert decision.reference == "the expected outputs in test data inputs.npz"
    assert decision.inputs == sample.origin == "test data inputs.npz"
    tried = _tried(decision)
    assert len(tried) == 2
    for candidate in tried:  # OpenVINO at the CPU's default precision: judged on its numbers
        assert_judged_on_its_numbers(candidate, policy)
    text = decision.explain()
    assert decision.proof() == "the expected outputs in test data inputs.npz"  # names its inputs once
    checked = "; outputs checked against the expected outputs in test data inputs.npz; timed side by side"
    assert checked in text, text


def test_wrong_expected_outputs_reject_every_candidate(
    cls_model_path: Path, cls_input: np.ndarray, cls_probs: np.ndarray
) -> None:
    artifact = artifact_of(cls_model_path)
    swapped = {CLS_OUTPUT: np.ascontiguousarray(cls_probs[:, ::-1])}
    sample = Sample({"x": cls_input}, "test data wrong.npz", swapped)
    with pytest.raises(NoBackendError) as caught:
        decide([artifact], SelectionPolicy(max_trials=1, **QUICK), [sample])
    tried = [c for c in caught.value.candidates if c.median_ms is not None]
    # The first is wrong, so selection keeps going down the ranking: every CPU candidate ran.
    assert {c.backend for c in tried} == {ORT_CPU, "openvino/CPU", "openvino/AUTO"}
    for candidate in tried:
        assert candidate.verdict == "rejected"
        assert candidate.reason.startswith(f"output '{CLS_OUTPUT}' differs from the reference: "), candidate
        assert candidate.max_abs_diff is not None and candidate.max_abs_diff > 0.5
    assert "differs from the reference" in str(caught.value)


def _recording(calls: list[tuple[str, str, dict[str, tuple[int, ...]]]]) -> Any:
    """The real isolated trial, recording what each was run on."""

    def trial(request: TrialRequest, timeout_s: float) -> TrialResult:
        shapes = {name: tuple(np.asarray(v).shape) for name, v in request.feeds.items()}
        calls.append((request.backend, request.artifact.label, shapes))
        return run_trial_isolated(request, timeout_s)

    return trial


def test_each_artifact_is_proven_on_the_sample_made_for_it(
    cls_model_path: Path,
    cls_input: np.ndarray,
    blazeface: tuple[ModelArtifact, dict[str, np.ndarray]],
) -> None:
    cls, tflite = artifact_of(cls_model_path), blazeface[0]
    face = blazeface[1]
    samples = [
        Sample({"x": cls_input}, "test data cls.npz", fits=frozenset({cls.sha256})),
        Sample(face, "test data face.npz", fits=frozenset({tflite.sha256})),
    ]
    calls: list[tuple[str, str, dict[str, tuple[int, ...]]]] = []
    # OpenVINO pinned to f32: at its default precision (bf16 on CPUs that have it) BlazeFace's raw
    # scores move by several units and it is rightly rejected; this test is about the samples.
    f32 = {"precision": "f32"}
    policy = SelectionPolicy(max_trials=10, **QUICK, options={"openvino/CPU": f32, "openvino/AUTO": f32})
    decision = decide([cls, tflite], policy, samples, trial=_recording(calls))

    assert decision.checked is True
    tried = _tried(decision)
    assert {(c.backend, c.artifact) for c in tried} == {
        (ORT_CPU, cls.label),
        ("openvino/CPU", cls.label),
        ("openvino/AUTO", cls.label),
        ("tflite/cpu", tflite.label),
        ("openvino/CPU", tflite.label),
        ("openvino/AUTO", tflite.label),
    }
    for candidate in tried:
        assert candidate.verdict in {"chosen", "passed"}, candidate
        assert candidate.max_abs_diff is not None and candidate.max_abs_diff < 1e-2, candidate
    assert all(c.reason == "" for c in tried)
    # Each ran on its own artifact's input; the references were the trials of the plain CPU backends.
    assert len(calls) == 6, calls
    for backend, label, shapes in calls:
        wanted = {"x": (1, 3, 48, 192)} if label == cls.label else {"input": (1, 128, 128, 3)}
        assert shapes == wanted, (backend, label, shapes)
    chosen = next(c for c in decision.candidates if c.verdict == "chosen")
    assert decision.inputs == ("test data cls.npz" if chosen.artifact == cls.label else "test data face.npz")
    assert decision.reference == (ORT_CPU if chosen.artifact == cls.label else "tflite/cpu")


def test_an_artifact_no_sample_fits_is_not_tried(
    cls_model_path: Path,
    cls_input: np.ndarray,
    cls_probs: np.ndarray,
    blazeface: tuple[ModelArtifact, dict[str, np.ndarray]],
) -> None:
    cls, tflite = artifact_of(cls_model_path), blazeface[0]
    sample = Sample({"x": cls_input}, "test data cls.npz", {CLS_OUTPUT: cls_probs}, frozenset({cls.sha256}))
    calls: list[tuple[str, str, dict[str, tuple[int, ...]]]] = []
    decision = decide(
        [cls, tflite], SelectionPolicy(max_trials=1, **QUICK), [sample], trial=_recording(calls)
    )

    assert decision.checked is True and decision.artifact == cls.label
    assert decision.inputs == "test data cls.npz"
    assert [label for _backend, label, _shapes in calls] == [cls.label]  # one trial, no reference run
    on_tflite = [c for c in decision.candidates if c.artifact == tflite.label]
    assert {c.backend for c in on_tflite} >= {"tflite/cpu", "openvino/CPU", "openvino/AUTO"}
    for candidate in on_tflite:
        if candidate.backend in {"tflite/cpu", "openvino/CPU", "openvino/AUTO"}:
            assert (candidate.verdict, candidate.reason) == ("untried", NOT_FITTING), candidate
            assert candidate.median_ms is None
    assert explained_others(decision)[("tflite/cpu", tflite.label)][1] == f"untried: {NOT_FITTING}"
    # Untried on the cls artifact (beyond max_trials) is not "no input fits".
    others = [c for c in decision.candidates if c.artifact == cls.label and c.verdict == "untried"]
    assert others and all(c.reason == "" for c in others)


def test_testdata_samples_are_marked_with_the_artifacts_they_fit(
    tmp_path: Path,
    cls_model_path: Path,
    good_npz: Path,
    blazeface: tuple[ModelArtifact, dict[str, np.ndarray]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.testdata")
    cls = ModelArtifact(cls_model_path, "onnx", _sha(cls_model_path), "cls.onnx")
    tflite = ModelArtifact(blazeface[0].path, "tflite", blazeface[0].sha256, "face.tflite")
    face = _savez(tmp_path / "face.npz", blazeface[1])
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"")
    testdata = [
        TestData(
            artifact_of(good_npz, "test-data", "inputs.npz"), None
        ),  # any model file it fits: the cls one
        TestData(artifact_of(face, "test-data", "face.npz"), "face.tflite"),
        TestData(
            artifact_of(face, "test-data", "face-for-cls.npz"), "cls.onnx"
        ),  # bound to one it does not fit
        TestData(artifact_of(face, "test-data", "face-for-nothing.npz"), "nope.onnx"),
        TestData(artifact_of(broken, "test-data", "broken.npz"), None),
    ]
    samples = samples_from_testdata(testdata, [cls, tflite], all_backends())

    assert [(s.origin, s.fits) for s in samples] == [
        ("test data inputs.npz", frozenset({cls.sha256})),
        ("test data face.npz", frozenset({tflite.sha256})),
    ]
    assert samples[0].expected is not None and samples[1].expected is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith(
        "ignoring test data face-for-cls.npz: it fits no model file (cls.onnx: missing input 'x'; "
        "no model input named 'input'"
    ), warnings
    assert warnings[1] == (
        "ignoring test data face-for-nothing.npz: it fits no model file "
        "(no model file 'nope.onnx' in this version)"
    )
    assert warnings[2].startswith("ignoring test data broken.npz: broken.npz is not valid test data"), (
        warnings
    )


# --- 5. choose_and_load with test data ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sign_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "signs.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=10, seconds_per_sign=0.5)
    assert truth[0]["orientation"] == "upright"
    return path


def _config(state_dir: Path, uri: str, **selection: object) -> AgentConfig:
    pipeline = PipelineConfig(
        name="signs",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        backend=BackendChoiceConfig(),
        source=VideoSourceConfig(type="video", uri=uri),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(type="classification", labels=CLS_LABELS),
    )
    settings: dict[str, Any] = {
        "runs": 3,
        "warmup": 1,
        "min_time_s": 0.0,
        "budget_s": 1.0,
        "max_trials": 1,
        "sample_timeout_s": 5.0,
        **selection,
    }
    return AgentConfig(
        device=DeviceConfig(id="box-1"),
        state_dir=state_dir,
        registry=RegistryConfig(url=f"file://{state_dir.parent / 'registry'}"),  # never read here
        backends=SelectionConfig(**settings),
        pipelines=[pipeline],
    )


def test_test_data_proves_the_model_before_the_source_has_a_frame(
    tmp_path: Path,
    cls_model_path: Path,
    good_npz: Path,
    cls_input: np.ndarray,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    config = _config(tmp_path / "state", str(tmp_path / "no-such-camera.mp4"))
    testdata = [TestData(artifact_of(good_npz, "test-data", "inputs.npz"), None)]
    session, chosen = choose_and_load(
        config, config.pipelines[0], [artifact_of(cls_model_path)], "pp-ocr-cls@2.0", testdata
    )
    decision = chosen.decision
    try:
        [probs] = session.run({"x": cls_input}).values()
        assert int(probs.argmax()) == 1
    finally:
        session.close()
    assert decision.checked is True
    assert decision.inputs == "test data inputs.npz"
    assert decision.reference == "the expected outputs in test data inputs.npz"
    assert "no frame from its source" not in caplog.text
    assert "benchmarking the top candidates on test data inputs.npz" in caplog.text
    assert len(list((tmp_path / "state" / "decisions").glob("*.json"))) == 1


def test_test_data_that_fits_nothing_is_ignored_and_a_frame_is_used(
    tmp_path: Path,
    cls_model_path: Path,
    cls_input: np.ndarray,
    sign_video: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    npz = _savez(tmp_path / "wrong.npz", {"image": cls_input})
    config = _config(tmp_path / "state", str(sign_video))
    testdata = [TestData(artifact_of(npz, "test-data", "wrong.npz"), None)]
    session, chosen = choose_and_load(
        config, config.pipelines[0], [artifact_of(cls_model_path)], "pp-ocr-cls@2.0", testdata
    )
    decision = chosen.decision
    session.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        w.startswith("ignoring test data wrong.npz: it fits no model file (")
        and "missing input 'x'; no model input named 'image'" in w
        for w in warnings
    ), warnings
    assert decision.inputs == "a frame from the pipeline's source"
    assert decision.checked is True and decision.reference == ORT_CPU
    assert decision.proof() == f"{ORT_CPU} on a frame from the pipeline's source"


def test_the_cached_decision_is_keyed_by_the_test_data_too(
    tmp_path: Path, cls_model_path: Path, good_npz: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.backend_choice")
    upright = preprocessed_sign(cls_model_path, "EDGE CAMERA 42", False, 1)
    other = _savez(tmp_path / "other.npz", {"x": upright})  # no expected outputs: onnxruntime's are
    config = _config(tmp_path / "state", str(tmp_path / "no-such-camera.mp4"))
    model = [artifact_of(cls_model_path)]
    decisions = tmp_path / "state" / "decisions"
    origins = []
    for path in (good_npz, other, good_npz):  # the third is the first again: from the cache
        testdata = [TestData(artifact_of(path, "test-data", "inputs.npz"), None)]
        session, chosen = choose_and_load(config, config.pipelines[0], model, "pp-ocr-cls@2.0", testdata)
        decision = chosen.decision
        session.close()
        assert decision.checked is True
        origins.append(decision.reference)
    assert len(list(decisions.glob("*.json"))) == 2
    cached = [r.getMessage() for r in caplog.records if "using the cached backend decision" in r.getMessage()]
    assert len(cached) == 1, cached  # the third call, with the first call's test data
    assert origins == [
        "the expected outputs in test data inputs.npz",
        ORT_CPU,
        "the expected outputs in test data inputs.npz",
    ]


# --- 6. `edge-agent bench` inputs ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_specs(cls_model_path: Path) -> list[TensorSpec]:
    session = reference_session([artifact_of(cls_model_path)])
    try:
        return list(session.inputs)
    finally:
        session.close()


def test_parse_shapes_of_a_single_input_model(cls_specs: list[TensorSpec]) -> None:
    assert parse_shapes(["1x3x48x96"], cls_specs) == {"x": (1, 3, 48, 96)}
    assert parse_shapes(["x=1x3x48x96"], cls_specs) == {"x": (1, 3, 48, 96)}
    assert parse_shapes(["2X3X48X96"], cls_specs) == {"x": (2, 3, 48, 96)}
    assert parse_shapes([], cls_specs) == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("y=1x3x48x96", "--shape 'y=1x3x48x96': the model has no input 'y' (it has: x)"),
        ("1x3xax48", "--shape '1x3xax48': dimensions must be positive integers joined by x"),
        ("0x3x48x48", "--shape '0x3x48x48': dimensions must be positive integers joined by x"),
        ("", "--shape '': dimensions must be positive integers joined by x"),
    ],
)
def test_parse_shapes_errors(cls_specs: list[TensorSpec], text: str, problem: str) -> None:
    with pytest.raises(EdgeAgentError) as caught:
        parse_shapes([text], cls_specs)
    assert str(caught.value).startswith(problem), str(caught.value)


def test_parse_shapes_of_a_model_with_several_inputs_needs_names() -> None:
    specs = [TensorSpec("a", (1, 4), "float32"), TensorSpec("b", (1, 4), "float32")]
    with pytest.raises(
        EdgeAgentError, match=r"the model has 2 inputs \(a, b\); say which: --shape NAME=DIMS"
    ):
        parse_shapes(["1x4"], specs)
    assert parse_shapes(["b=2x4", "a=3x4"], specs) == {"a": (3, 4), "b": (2, 4)}


def test_bench_feeds_random_of_the_shape_asked_for(cls_model_path: Path) -> None:
    resolved = ResolvedModel(str(cls_model_path), [artifact_of(cls_model_path)], [])
    feeds, described = bench_feeds(resolved, ["1x3x48x96"], None)
    assert described == "random inputs (x 1x3x48x96)"
    assert set(feeds) == {"x"} and feeds["x"].shape == (1, 3, 48, 96) and feeds["x"].dtype == np.float32
    feeds, described = bench_feeds(resolved, [], None)
    assert described == "random inputs (x 1x3x224x224)"  # open dims: batch 1, the others 224


def test_bench_feeds_refuses_a_shape_the_model_cannot_take(cls_model_path: Path) -> None:
    resolved = ResolvedModel(str(cls_model_path), [artifact_of(cls_model_path)], [])
    with pytest.raises(EdgeAgentError) as caught:
        bench_feeds(resolved, ["1x4x48x192"], None)
    assert str(caught.value) == (
        "--shape: input 'x' has shape [1, 4, 48, 192], the model wants ['?', 3, '?', '?']"
    )
    with pytest.raises(EdgeAgentError, match=r"^--shape: input 'x' has shape \[1, 3, 48\]"):
        bench_feeds(resolved, ["1x3x48"], None)


def test_bench_feeds_from_an_inputs_file(cls_model_path: Path, good_npz: Path, cls_input: np.ndarray) -> None:
    resolved = ResolvedModel(str(cls_model_path), [artifact_of(cls_model_path)], [])
    feeds, described = bench_feeds(resolved, [], good_npz)
    assert described == str(good_npz)
    assert set(feeds) == {"x"}  # the expected outputs are no inputs
    np.testing.assert_array_equal(feeds["x"], cls_input)


def test_bench_feeds_refuses_an_inputs_file_that_does_not_fit(tmp_path: Path, cls_model_path: Path) -> None:
    resolved = ResolvedModel("pp-ocr-cls@2.0", [artifact_of(cls_model_path)], [])
    npz = _savez(tmp_path / "images.npz", {"image": np.zeros((1, 3, 48, 192), np.float32)})
    with pytest.raises(EdgeAgentError) as caught:
        bench_feeds(resolved, [], npz)
    assert str(caught.value) == (
        f"--inputs {npz}: does not fit pp-ocr-cls@2.0: missing input 'x'; "
        "no model input named 'image' (the model's inputs: x)"
    )


def test_bench_feeds_uses_the_models_own_test_data(
    tmp_path: Path, cls_model_path: Path, good_npz: Path, cls_input: np.ndarray
) -> None:
    unfit = _savez(tmp_path / "unfit.npz", {"image": cls_input})
    testdata = [
        TestData(artifact_of(unfit, "test-data", "unfit.npz"), None),
        TestData(artifact_of(good_npz, "test-data", "inputs.npz"), None),
    ]
    resolved = ResolvedModel("pp-ocr-cls@2.0", [artifact_of(cls_model_path)], testdata)
    feeds, described = bench_feeds(resolved, [], None)
    assert described == "test data inputs.npz"
    np.testing.assert_array_equal(feeds["x"], cls_input)
    # A --shape asks for random inputs: the test data is not used then.
    feeds, described = bench_feeds(resolved, ["1x3x48x96"], None)
    assert described == "random inputs (x 1x3x48x96)" and feeds["x"].shape == (1, 3, 48, 96)


def test_cli_bench_on_random_inputs_of_a_given_shape(tmp_path: Path, cls_model_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            str(cls_model_path),
            "--backend",
            ORT_CPU,
            "--runs",
            "3",
            "--warmup",
            "1",
            "--shape",
            "1x3x48x96",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["inputs"].startswith("random inputs (x 1x3x48x96)"), report
    assert (report["model"], report["runs"], report["warmup"]) == (str(cls_model_path), 3, 1)
    [row] = report["results"]
    assert row["backend"] == ORT_CPU and row["ok"] is True and row["error"] in ("", None), row
    # Marked: the reference is where a first start serves this (unproven) model.
    assert row["runs"] == 3 and row["p50_ms"] > 0 and row["selected"] is True


def test_cli_registry_publish_with_test_data(tmp_path: Path, cls_model_path: Path, good_npz: Path) -> None:
    registry = tmp_path / "registry"
    result = CliRunner().invoke(
        app,
        [
            "registry",
            "publish",
            str(cls_model_path),
            "--name",
            CLS_NAME,
            "--version",
            CLS_VERSION,
            "--registry",
            registry.as_uri(),
            "--test-data",
            str(good_npz),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    published = json.loads(result.stdout)
    [data] = [a for a in published["artifacts"] if a["format"] == "test-data"]
    assert (data["file"], data["sha256"], data["size"]) == (
        "inputs.npz",
        _sha(good_npz),
        good_npz.stat().st_size,
    )
    assert FileRegistry(registry).get_manifest(CLS_NAME, CLS_VERSION).testdata()[0].file == "inputs.npz"


def test_a_zip_of_non_arrays_is_a_model_error(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "inputs.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", b"not npy data")
    with pytest.raises(ModelError, match=r"^inputs\.npz is not valid test data"):
        load_testdata(path)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", b"hello")
    with pytest.raises(ModelError, match=r"^inputs\.npz is not valid test data: member 'readme.txt'"):
        load_testdata(path)
