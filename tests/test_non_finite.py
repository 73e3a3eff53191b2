"""A reference that is not finite is not a reference (issue 24, item 3).

A copy of a real trained model (PP-OCR's text-direction classifier) whose output is multiplied by NaN
once passed validation on every backend ("passed ... max diff 0" against a NaN reference), and only
the health window caught it, saying "1 of 0 inferences". Here that model is published and validated
with test data (inputs only, the original model's expected outputs, and expected outputs it made
itself), selected on a sample, and run in a real pipeline; NaN that a publisher expects (onnx's
backend test of Sqrt on negative numbers) stays its contract. Real models, backends and files.
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from agent.config import (
    ClassificationPostprocess,
    HealthWindowConfig,
    ModelRef,
    PipelineConfig,
    VideoSourceConfig,
)
from agent.errors import RegistryError
from agent.pipeline import Pipeline
from agent.processing import Preprocessor
from agent.registry import FileRegistry, PublishOptions
from agent.stage import LoadedModel
from agent.supervisor.health import unhealthy
from agent.testdata import MODEL_ZOO_ATOL, MODEL_ZOO_RTOL, TestData
from agent.validate import Validation, validate
from providers import ModelArtifact, NoBackendError, SelectionPolicy, decide, run_trial
from providers.onnxruntime_backend import OnnxRuntimeBackend
from providers.select import Sample, compare_outputs, reference_session
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, ListSink, demo_video_module, sign_folder
from tests.waits import wait_until

ORT_CPU = "onnxruntime/CPUExecutionProvider"
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"  # the cls model's one output: [batch, 2] probabilities
QUICK_TRIALS = {"runs": 3, "warmup": 1, "min_time_s": 0.0, "budget_s": 1.0, "timeout_s": 60.0}
# As `registry publish` validates: every candidate, one run each, in this process.
PUBLISH = SelectionPolicy(warmup=1, runs=1, min_time_s=0.0, budget_s=5.0, max_trials=99)
POLICY = SelectionPolicy()
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def _artifact(path: Path, fmt: str = "onnx") -> ModelArtifact:
    return ModelArtifact(path, fmt, hashlib.sha256(path.read_bytes()).hexdigest())


def _nan_reason(origin: str, expected: bool = False) -> str:
    where = " where the expected outputs have finite values" if expected else ""
    return f"the reference {ORT_CPU} gives NaN or infinite values in output '{CLS_OUTPUT}' on {origin}{where}"


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory: pytest.TempPathFactory, cls_model_path: Path) -> Path:
    """The real classifier with a Mul by a NaN constant appended to its output (same output name)."""
    model = onnx.load(str(cls_model_path))
    [output] = model.graph.output
    assert output.name == CLS_OUTPUT
    before = f"{CLS_OUTPUT}_before_nan"
    for node in model.graph.node:
        node.output[:] = [before if name == CLS_OUTPUT else name for name in node.output]
        assert CLS_OUTPUT not in node.input
    model.graph.initializer.append(numpy_helper.from_array(np.array(np.nan, np.float32), "nan_constant"))
    model.graph.node.append(helper.make_node("Mul", [before, "nan_constant"], [CLS_OUTPUT], name="times_nan"))
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("nan-model") / "cls-nan.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def cls_input(cls_model_path: Path) -> np.ndarray:
    """An upside-down rendered sign, preprocessed as the pipeline does for the cls model."""
    image = demo_video_module().render_sign("Gate B open", True, np.random.default_rng(3))
    session = reference_session([_artifact(cls_model_path)])
    try:
        tensor = Preprocessor(CLS_PREPROCESS, session.inputs)(image)
    finally:
        session.close()
    assert tensor.shape == (1, 3, 48, 192) and tensor.dtype == np.float32
    return tensor


def _run(model: Path, tensor: np.ndarray) -> np.ndarray:
    """The model's output computed by plain onnxruntime on CPU (not by edge-agent)."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    [probs] = session.run([CLS_OUTPUT], {"x": tensor})
    return np.asarray(probs)


@pytest.fixture(scope="module")
def cls_probs(cls_model_path: Path, nan_model: Path, cls_input: np.ndarray) -> np.ndarray:
    probs = _run(cls_model_path, cls_input)
    assert probs.shape == (1, 2) and np.isfinite(probs).all() and int(probs.argmax()) == 1, probs
    assert np.isnan(_run(nan_model, cls_input)).all()  # the copy: every value NaN
    return probs


def _npz(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _validate(model: Path, npz: Path, tmp_path: Path) -> Validation:
    data = TestData(
        ModelArtifact(npz, "test-data", hashlib.sha256(npz.read_bytes()).hexdigest(), name=npz.name)
    )
    return validate(
        "cls-nan@1",
        [_artifact(model)],
        [data],
        PUBLISH,
        tmp_path / "derived",
        trial=lambda request, _timeout: run_trial(request),
    )


def _refused(registry: FileRegistry, model: Path, npz: Path) -> str:
    with pytest.raises(RegistryError) as caught:
        registry.publish(model, "cls-nan", "1", PublishOptions(testdata=[npz]))
    message = caught.value.message
    assert message.startswith("refusing to publish cls-nan@1: no backend of this box gives"), message
    assert not (registry.root / "cls-nan").exists()
    return message


# --- 1. comparisons never pass on NaN == NaN -------------------------------------------------------------


def test_nan_against_a_computed_reference_with_nan_is_a_problem_never_a_match() -> None:
    nan = np.full((1, 2), np.nan, np.float32)
    some_nan = np.array([1.0, np.nan, 3.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "All-NaN slice encountered" on the way
        assert compare_outputs({"p": nan}, {"p": nan.copy()}, POLICY, computed=True) == (
            None,
            "the reference has NaN or infinite values in output 'p'",
        )
        assert compare_outputs({"p": some_nan}, {"p": some_nan.copy()}, POLICY, computed=True) == (
            None,
            "the reference has NaN or infinite values in output 'p'",
        )
        inf = np.array([np.inf, 1.0], np.float32)
        assert compare_outputs({"p": inf}, {"p": inf.copy()}, POLICY, computed=True)[1] == (
            "the reference has NaN or infinite values in output 'p'"
        )
        # Expected outputs that are NaN everywhere are no reference either: they prove nothing.
        assert compare_outputs({"p": nan}, {"p": nan.copy()}, POLICY) == (
            None,
            "the reference has no finite value in output 'p'",
        )


def test_published_nan_is_matched_only_by_nan_at_the_same_places() -> None:
    expected = np.array([1.0, np.nan, 3.0, -np.inf], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compare_outputs({"p": expected.copy()}, {"p": expected}, POLICY) == (0.0, "")
        # A number where NaN is expected is a miss (1 of 4), as is -inf's place taken by a number.
        diff, problem = compare_outputs(
            {"p": np.array([1.0, 2.0, 3.0, -np.inf], np.float32)}, {"p": expected}, POLICY
        )
        assert diff == 0.0 and problem.startswith("output 'p' differs from the reference: 25.0% of values"), (
            problem
        )
        # NaN where a number is expected, even beside expected NaN: wrong, whatever max_mismatch allows.
        moved = np.array([np.nan, np.nan, 3.0, -np.inf], np.float32)
        lenient = SelectionPolicy(max_mismatch=0.5)
        assert compare_outputs({"p": moved}, {"p": expected}, lenient) == (
            None,
            "output 'p' has NaN or infinite values where the reference has finite values",
        )


# --- 2. validation and publishing -----------------------------------------------------------------------


def test_the_nan_model_with_inputs_only_fails_validation_naming_the_reference(
    tmp_path: Path, nan_model: Path, cls_input: np.ndarray
) -> None:
    npz = _npz(tmp_path / "inputs.npz", {"x": cls_input})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "All-NaN slice encountered" was one
        result = _validate(nan_model, npz, tmp_path)
    assert result.usable is False and result.activated is None
    reason = _nan_reason("test data inputs.npz")
    ran = [c for c in result.candidates if c.runs]
    assert {c.backend for c in ran} >= {ORT_CPU, "openvino/CPU"}
    for check in ran:  # every candidate ran it, and none is correct against a NaN reference
        assert check.correct is False and check.reason.startswith(f"{reason} (2 of 2 values)"), check
    assert all(line.split(": ", 1)[1].startswith(reason) for line in result.reasons() if "NaN" in line)
    # Selection raised NoBackendError: nothing activated, each candidate's reason the reference.
    assert result.decision.startswith("no backend can run this model (") and reason in result.decision
    assert "max diff 0" not in result.decision

    message = _refused(FileRegistry(tmp_path / "registry"), nan_model, npz)
    assert f"{ORT_CPU} on {nan_model.name}: {reason}" in message, message
    assert f"openvino/CPU on {nan_model.name}: {reason}" in message, message


def test_the_nan_model_with_the_original_models_expected_outputs_fails_naming_the_reference(
    tmp_path: Path, nan_model: Path, cls_input: np.ndarray, cls_probs: np.ndarray
) -> None:
    """Finite expected outputs, a reference that gives NaN: the version fails for the reference, and
    every candidate for its NaN where numbers are expected (infinitely far from them)."""
    npz = _npz(tmp_path / "original.npz", {"x": cls_input, f"expected:{CLS_OUTPUT}": cls_probs})
    result = _validate(nan_model, npz, tmp_path)
    assert result.usable is False and result.activated is None
    reason = _nan_reason("test data original.npz", expected=True)
    ran = [c for c in result.candidates if c.runs]
    assert {c.backend for c in ran} >= {ORT_CPU, "openvino/CPU"}
    for check in ran:
        assert check.correct is False, check
        assert check.reason.startswith(f"{reason} (2 of 2 values)"), check
        assert (
            f"; test data original.npz: output '{CLS_OUTPUT}' has NaN or infinite values where the reference "
            "has none"
        ) in check.reason, check
        [error] = check.errors
        assert error.within is False and error.max_abs == np.inf and error.max_rel == np.inf, error
    assert "has NaN or infinite values where the reference has none" in result.decision

    message = _refused(FileRegistry(tmp_path / "registry"), nan_model, npz)
    assert f"{ORT_CPU} on {nan_model.name}: {reason}" in message, message


def test_expected_outputs_the_nan_model_made_itself_are_no_reference(
    tmp_path: Path, nan_model: Path, cls_input: np.ndarray
) -> None:
    """A publisher that made its test data with the broken model ships all-NaN expected outputs: they
    prove nothing, and every candidate "matching" them is refused."""
    own = _run(nan_model, cls_input)
    npz = _npz(tmp_path / "own.npz", {"x": cls_input, f"expected:{CLS_OUTPUT}": own})
    message = _refused(FileRegistry(tmp_path / "registry"), nan_model, npz)
    for backend in (ORT_CPU, "openvino/CPU"):
        assert (
            f"{backend} on {nan_model.name}: test data own.npz: the reference has no finite value in output "
            f"'{CLS_OUTPUT}'"
        ) in message, message


def test_expected_nan_of_sqrt_on_negative_numbers_is_the_publishers_contract(tmp_path: Path) -> None:
    """onnx's backend test of Sqrt expects NaN for its negative inputs: published and valid, the
    activated candidate within tolerance. The same test data with those NaN made 0 is refused: the
    reference gives NaN where the publisher expects numbers."""
    source = ONNX_DATA / "pytorch-operator" / "test_operator_sqrt"
    expected = numpy_helper.to_array(onnx.load_tensor(str(source / "test_data_set_0" / "output_0.pb")))
    assert np.isnan(expected).any() and np.isfinite(expected).any()
    registry = FileRegistry(tmp_path / "registry")
    manifest = registry.publish(source / "model.onnx", "sqrt", "1", PublishOptions(testdata=[source]))
    [data] = manifest.testdata()
    assert (data.rtol, data.atol) == (MODEL_ZOO_RTOL, MODEL_ZOO_ATOL)

    changed = tmp_path / "test_operator_sqrt"
    shutil.copytree(source, changed)
    tensor = onnx.load_tensor(str(changed / "test_data_set_0" / "output_0.pb"))
    zeroed = np.nan_to_num(numpy_helper.to_array(tensor), nan=0.0)
    (changed / "test_data_set_0" / "output_0.pb").write_bytes(
        numpy_helper.from_array(zeroed, tensor.name).SerializeToString()
    )
    with pytest.raises(RegistryError) as caught:
        registry.publish(changed / "model.onnx", "sqrt", "2", PublishOptions(testdata=[changed]))
    message = caught.value.message
    nans = int(np.isnan(expected).sum())
    assert (
        f"gives NaN or infinite values in output '1' on test data test_data_set_0.npz where the expected "
        f"outputs have finite values ({nans} of {expected.size} values)"
    ) in message, message
    assert "the reference onnxruntime/CPUExecutionProvider gives" in message, message


# --- 3. selection ----------------------------------------------------------------------------------------


def test_decide_on_a_sample_whose_reference_is_nan_raises_and_tries_no_further(
    nan_model: Path, cls_input: np.ndarray
) -> None:
    sample = Sample({"x": cls_input}, "a frame from the source")
    with pytest.raises(NoBackendError) as caught:
        decide([_artifact(nan_model)], SelectionPolicy(max_trials=1, **QUICK_TRIALS), [sample])
    reason = f"{_nan_reason('a frame from the source')} (2 of 2 values)"
    candidates = [c for c in caught.value.candidates if c.reason.startswith(reason)]
    assert {c.backend for c in candidates} >= {ORT_CPU, "openvino/CPU", "openvino/AUTO"}
    tried = [c for c in candidates if c.median_ms is not None]
    assert len(tried) == 1, candidates  # the first trial; the rest have nothing to be proven against
    for candidate in candidates:
        assert candidate.verdict == "rejected" and candidate.max_abs_diff is None and candidate.unlock == ""
    # The others are backends this box lacks (screened out): none passed against the NaN.
    others = [c for c in caught.value.candidates if c not in candidates]
    assert all(c.median_ms is None and c.verdict == "rejected" for c in others), others
    assert "max diff" not in str(caught.value)


def test_decide_against_all_nan_expected_outputs_raises_naming_them(
    nan_model: Path, cls_input: np.ndarray
) -> None:
    nan = np.full((1, 2), np.nan, np.float32)
    sample = Sample({"x": cls_input}, "test data own.npz", {CLS_OUTPUT: nan})
    with pytest.raises(NoBackendError) as caught:
        decide([_artifact(nan_model)], SelectionPolicy(max_trials=1, **QUICK_TRIALS), [sample])
    reference = "the reference, the expected outputs in test data own.npz,"
    reason = f"{reference} has no finite value in output '{CLS_OUTPUT}'"
    rejected = [c for c in caught.value.candidates if c.reason == reason]
    assert len([c for c in rejected if c.median_ms is not None]) == 1
    assert {c.backend for c in rejected} >= {ORT_CPU, "openvino/CPU"}


# --- 4. the health window's count ------------------------------------------------------------------------


def test_the_health_window_counts_the_nan_inferences_among_all_of_them(
    tmp_path: Path, nan_model: Path
) -> None:
    """Postprocessing refuses NaN scores (the frame fails): the inference is counted all the same, so
    the reason reads "n of n", never "1 of 0"."""
    sign_folder(tmp_path / "frames", 4)
    config = PipelineConfig(
        name="orientation",
        model=ModelRef(name="cls-nan", version="1"),
        source=VideoSourceConfig(type="video", uri=str(tmp_path / "frames"), fps=4, loop=False),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(
            type="classification", softmax=False, top_k=2, labels=CLS_LABELS
        ),
    )
    session = OnnxRuntimeBackend().load(_artifact(nan_model))
    sink = ListSink()
    pipeline = Pipeline(config, LoadedModel("cls-nan", "1", "ab" * 32, session), sink)
    stage = pipeline.stage
    stage.watch_outputs = True  # on probation, as the supervisor's health window sets it
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, "the 4 frames done", timeout=60, interval=0.05)
    finally:
        pipeline.stop(timeout=30)
    assert sink.count() == 0  # NaN scores are never published
    stats = stage.stats
    n = stats.frames  # 4, unless a busy box made the newest-frame slot drop one
    assert n >= 1 and stats.inferences == stats.nan_outputs == stats.errors == n, vars(stats)
    assert "NaN or infinite" in str(stats.last_error)
    assert stats.mean_latency_ms() is not None and len(stats.recent_ms) == n  # of the same inferences
    # Early in the window (fewer frames than min_frames): the NaN is the reason, counted right.
    early = HealthWindowConfig(min_frames=100)
    assert unhealthy(stage, early, final=False) == f"{n} of {n} inferences gave NaN or infinite outputs"
