"""Backend selection with the real backends of this machine: onnxruntime CPU, OpenVINO CPU and AUTO,
TFLite CPU. Real models (PP-OCR cls on a rendered sign, BlazeFace on a photo, scikit-learn on iris) and
one made wrong on purpose for one backend (onnx's float64 Add with broadcasting, on which OpenVINO
computes values near 1e199). Every trial runs in a child process, as it does in the daemon.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import cv2
import numpy as np
import onnx
import openvino as ov
import pytest
from onnx import numpy_helper
from skimage import data as skimage_data
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from agent.transform import upgraded_artifacts
from providers import (
    BackendError,
    CandidateReport,
    ModelArtifact,
    NoBackendError,
    SelectionPolicy,
    TrialRequest,
    decide,
    get_backend,
    load_decided,
    run_trial_isolated,
    screen,
)
from providers.select import TIE_MARGIN, compare_outputs, reference_first
from tests.cpu_precision import assert_judged_on_its_numbers
from tests.selection_fixtures import QUICK, artifact_of, explained_others, report_of

ORT_CPU = "onnxruntime/CPUExecutionProvider"
# (artifacts: the original and its upgraded twin, inputs, the expected output)
AddBroadcast = tuple[list[ModelArtifact], dict[str, np.ndarray], np.ndarray]
ADD_BROADCAST = Path(onnx.__file__).parent / "backend/test/data/pytorch-operator/test_operator_add_broadcast"


def _tensor(path: Path) -> np.ndarray:
    proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(proto)


# --- 1. PP-OCR cls on a rendered sign ------------------------------------------------------------------


def test_cls_on_a_rendered_sign_is_benchmarked_checked_and_explained(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    artifact = artifact_of(cls_model_path)
    policy = SelectionPolicy(**QUICK)
    decision = decide([artifact], policy, cls_sample)

    assert decision.reference == ORT_CPU
    assert decision.checked is True
    tried = [c for c in decision.candidates if c.median_ms is not None]
    assert {c.backend for c in tried} == {ORT_CPU, "openvino/CPU", "openvino/AUTO"}
    for candidate in tried:
        assert candidate.precision in {"fp32", "bf16", "fp16"}, candidate
        # OpenVINO runs at the CPU's default precision (bf16 on some CPUs): judged on its numbers.
        assert_judged_on_its_numbers(candidate, policy)
    chosen = next(c for c in decision.candidates if c.verdict == "chosen")
    assert chosen.backend == decision.backend and chosen.precision == decision.precision
    correct = [c for c in decision.candidates if c.verdict in {"chosen", "passed"}]
    best = min((c for c in correct if c.median_ms is not None), key=lambda c: c.median_ms or 0.0)
    fastest = best.median_ms or 0.0

    def as_fast(c: CandidateReport) -> bool:
        """Slower than the fastest by no more than both spreads (timed side by side) or 5 %."""
        margin = max(TIE_MARGIN * fastest, (c.spread_ms or 0.0) + (best.spread_ms or 0.0))
        return c.median_ms is not None and c.median_ms - fastest <= margin

    # The fastest, or a better-ranked one the timings cannot tell from it.
    assert as_fast(chosen), decision.explain()
    assert chosen.rank == min(c.rank for c in correct if as_fast(c) and c.rank is not None)
    assert report_of(decision, ORT_CPU).max_abs_diff == 0.0  # the reference against itself

    # Every backend that passed gives the right class (1: upside down), loaded here in-process.
    for candidate in correct:
        session = get_backend(candidate.backend).load(artifact)
        try:
            [probs] = session.run(cls_sample).values()
        finally:
            session.close()
        assert probs.shape == (1, 2) and int(probs.argmax()) == 1, (candidate.backend, probs)

    text = decision.explain()
    assert text.startswith(f"chose {decision.backend} for {artifact.label} ({chosen.median_ms:.2f} ms median")
    assert f"outputs checked against {ORT_CPU}" in text
    for candidate in correct:
        if candidate is not chosen:
            assert f"{candidate.backend} on {artifact.label}: passed ({candidate.median_ms:.2f} ms" in text


# --- 2. a model made wrong on purpose for OpenVINO ------------------------------------------------------


@pytest.fixture(scope="module")
def add_broadcast(tmp_path_factory: pytest.TempPathFactory) -> AddBroadcast:
    """onnx's opset-6 float64 Add with broadcasting, plus its upgraded twin; inputs, expected output."""
    original = artifact_of(ADD_BROADCAST / "model.onnx")
    reference = get_backend(ORT_CPU)
    assert reference.supports(original).reason == "unsupported operators: Add"
    derived = upgraded_artifacts([original], tmp_path_factory.mktemp("derived"), reference)
    assert len(derived) == 1 and derived[0].label == "model.onnx (upgraded from opset 6 to 13)"
    feeds = {"0": _tensor(ADD_BROADCAST / "test_data_set_0/input_0.pb")}
    feeds["1"] = _tensor(ADD_BROADCAST / "test_data_set_0/input_1.pb")
    assert feeds["0"].dtype == np.float64 and feeds["0"].shape == (2, 3) and feeds["1"].shape == (3,)
    return [original, *derived], feeds, _tensor(ADD_BROADCAST / "test_data_set_0/output_0.pb")


def test_fast_but_wrong_backend_is_rejected_by_the_output_check(add_broadcast: AddBroadcast) -> None:
    artifacts, feeds, expected = add_broadcast
    original, upgraded = artifacts
    policy = SelectionPolicy(max_trials=4, **QUICK)
    decision = decide(artifacts, policy, feeds)

    assert decision.backend == ORT_CPU
    assert decision.artifact == upgraded.label and decision.artifact_sha256 == upgraded.sha256
    assert "upgraded from opset 6 to 13" in decision.artifact
    assert decision.reference == ORT_CPU and decision.checked is True
    wrong = [c for c in decision.candidates if c.backend.startswith("openvino/") and c.median_ms is not None]
    assert {c.backend for c in wrong} == {"openvino/CPU", "openvino/AUTO"}
    for candidate in wrong:
        assert candidate.verdict == "rejected"
        assert candidate.reason.startswith("output '2' differs from the reference: 50.0% of values off by")
        assert candidate.max_abs_diff is not None and candidate.max_abs_diff > 1e100
    refused = report_of(decision, ORT_CPU, original.label)
    assert (refused.verdict, refused.reason) == ("rejected", "unsupported operators: Add")
    assert "openvino/CPU on model.onnx: rejected (" in decision.explain()
    # What OpenVINO was not tried on is no fallback either: it was shown wrong on this model.
    assert [c.backend for c in decision.order()] == [ORT_CPU]

    session, used, failures = load_decided(decision, artifacts, policy)
    try:
        outputs = session.run(feeds)
    finally:
        session.close()
    assert (used.backend, used.artifact, failures) == (ORT_CPU, upgraded.label, [])
    np.testing.assert_allclose(outputs["2"], expected, rtol=1e-12, atol=0)


def test_when_the_top_candidates_are_all_wrong_selection_keeps_going_down_the_ranking(
    add_broadcast: AddBroadcast,
) -> None:
    artifacts, feeds, _ = add_broadcast
    # Only two trials, and the two best-ranked candidates are OpenVINO's (wrong here).
    decision = decide(artifacts, SelectionPolicy(max_trials=2, **QUICK), feeds)
    assert decision.backend == ORT_CPU and decision.checked is True
    tried = [c for c in decision.candidates if c.median_ms is not None]
    assert len(tried) > 2 and all(c.verdict == "rejected" for c in tried if c.backend != ORT_CPU)


def test_a_fixed_policy_does_not_excuse_a_backend_from_the_output_check(
    add_broadcast: AddBroadcast,
) -> None:
    """The policy says where a model may run, not what is right: the reference stays onnxruntime."""
    artifacts, feeds, _ = add_broadcast
    with pytest.raises(NoBackendError) as caught:
        decide(artifacts, SelectionPolicy(fixed="openvino/CPU", **QUICK), feeds)
    tried = [c for c in caught.value.candidates if c.backend == "openvino/CPU"]
    assert len(tried) == 2
    assert all("differs from the reference" in c.reason and c.max_abs_diff > 1e100 for c in tried)
    assert "policy fixes the backend to openvino/CPU" in str(caught.value)


# --- 3. scikit-learn with ONNX-ML operators ----------------------------------------------------------


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, LogisticRegression]:
    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    return features, LogisticRegression(max_iter=1000).fit(features, labels)


@pytest.mark.parametrize(
    ("zipmap", "label_output", "missing"),
    [(False, "label", "LinearClassifier"), (True, "output_label", "LinearClassifier, ZipMap")],
    ids=["no-zipmap", "zipmap"],
)
def test_sklearn_model_goes_to_onnxruntime_with_openvinos_missing_operators_named(
    tmp_path: Path,
    iris: tuple[np.ndarray, LogisticRegression],
    zipmap: bool,
    label_output: str,
    missing: str,
) -> None:
    features, model = iris
    options = None if zipmap else {id(model): {"zipmap": False}}
    proto = to_onnx(model, features[:1], options=options)
    assert ("ZipMap" in {n.op_type for n in proto.graph.node}) is zipmap
    path = tmp_path / "iris-logreg.onnx"
    path.write_bytes(proto.SerializeToString())
    artifact = artifact_of(path)

    decision = decide([artifact], SelectionPolicy(**QUICK), {"X": features[:8]})

    assert decision.backend == ORT_CPU and decision.checked is True
    for name in ("openvino/CPU", "openvino/AUTO"):
        report = report_of(decision, name)
        assert report.verdict == "rejected"
        assert report.reason.startswith(f"{name} cannot read iris-logreg.onnx: ")
        assert report.reason.endswith(f"; unsupported operators: {missing}")
    session, used, _ = load_decided(decision, [artifact], SelectionPolicy())
    try:
        outputs = session.run({"X": features})
    finally:
        session.close()
    assert used.backend == ORT_CPU
    np.testing.assert_array_equal(outputs[label_output], model.predict(features))
    if zipmap:  # ZipMap's {class: probability} rows come back as an array, columns by class
        got = outputs["output_probability"]
        assert isinstance(got, np.ndarray) and got.shape == (len(features), 3)
    else:
        got = outputs["probabilities"]
    np.testing.assert_allclose(got, model.predict_proba(features), atol=1e-4)


# --- 4. a .tflite detector on a real photo -------------------------------------------------------------


def _letterbox(image: np.ndarray, size: int) -> np.ndarray:
    """RGB uint8 -> float32 [1, size, size, 3] in [-1, 1], aspect kept, padded with black."""
    scale = size / max(image.shape[:2])
    h, w = round(image.shape[0] * scale), round(image.shape[1] * scale)
    canvas = np.zeros((size, size, 3), np.uint8)
    top, left = (size - h) // 2, (size - w) // 2
    canvas[top : top + h, left : left + w] = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
    return (canvas.astype(np.float32) / 127.5 - 1.0)[None]


def test_tflite_detector_is_checked_against_tflite_on_a_real_photo() -> None:
    spec = importlib.util.find_spec("mediapipe")  # located, never imported (it wants numpy < 2)
    assert spec is not None and spec.submodule_search_locations
    model = (
        Path(spec.submodule_search_locations[0]) / "modules/face_detection/face_detection_short_range.tflite"
    )
    artifact = artifact_of(model, "tflite")
    sample = {"input": _letterbox(skimage_data.astronaut(), 128)}

    ranked, rejected = screen([artifact], SelectionPolicy())
    # LiteRT first: OpenVINO reads .tflite too, but as a second-tier (non-native) candidate.
    assert [b.name for b, _ in ranked] == ["tflite/cpu", "openvino/CPU", "openvino/AUTO"]
    assert _reason(rejected, ORT_CPU) == "cannot read tflite files"
    policy = SelectionPolicy(**QUICK)
    decision = decide([artifact], policy, sample)

    assert decision.reference == "tflite/cpu" and decision.checked is True
    assert decision.backend == "tflite/cpu"  # a .tflite artifact goes to TFLite when it works
    assert decision.precision == "fp32"
    chosen = report_of(decision, "tflite/cpu")
    assert chosen.verdict == "chosen" and chosen.max_abs_diff == 0.0  # the reference itself
    # OpenVINO's default precision here is the CPU's (bf16 where it has avx512_bf16/AMX, which moves
    # BlazeFace's raw scores by several units): passed or rejected, its verdict follows its numbers.
    assert_judged_on_its_numbers(report_of(decision, "openvino/CPU"), policy)

    # Pinned to f32, OpenVINO computes what LiteRT does on every CPU, and is proven so.
    pinned = SelectionPolicy(**QUICK, options={"openvino/CPU": {"precision": "f32"}})
    proven = report_of(decide([artifact], pinned, sample), "openvino/CPU")
    assert proven.verdict == "passed" and proven.precision == "fp32", proven
    assert proven.max_abs_diff is not None and proven.max_abs_diff < 1e-3, proven

    session, used, _ = load_decided(decision, [artifact], SelectionPolicy())
    try:
        outputs = session.run(sample)
    finally:
        session.close()
    assert used.backend == decision.backend
    assert outputs["regressors"].shape == (1, 896, 16) and outputs["classificators"].shape == (1, 896, 1)
    best = 1 / (1 + np.exp(-float(outputs["classificators"].max())))
    assert best > 0.9, best  # the astronaut's face


def _reason(reports: list[CandidateReport], backend: str) -> str:
    [report] = [r for r in reports if r.backend == backend]
    return str(report.reason)


# --- 5. policy, and a file no backend can read -----------------------------------------------------------


def test_deny_keeps_every_matching_backend_out(cls_model_path: Path) -> None:
    artifact = artifact_of(cls_model_path)
    decision = decide([artifact], SelectionPolicy(deny=("openvino/*",), benchmark=False), None)
    assert decision.backend == ORT_CPU
    openvino = [c for c in decision.candidates if c.backend.startswith("openvino/")]
    assert {c.backend for c in openvino} >= {"openvino/CPU", "openvino/AUTO", "openvino/GPU", "openvino/NPU"}
    assert all(c.verdict == "rejected" and c.reason == "denied by policy (openvino/*)" for c in openvino), (
        openvino
    )


def test_fixed_backend_is_used_and_still_checked_against_the_reference(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    artifact = artifact_of(cls_model_path)
    # Pinned to f32 so that it is right on every CPU: this test is about `fixed`, not precision.
    pinned = SelectionPolicy(fixed="openvino/CPU", options={"openvino/CPU": {"precision": "f32"}}, **QUICK)
    decision = decide([artifact], pinned, cls_sample)
    assert decision.backend == "openvino/CPU" and decision.precision == "fp32"
    assert decision.reference == ORT_CPU and decision.checked is True  # not openvino/CPU against itself
    others = [c for c in decision.candidates if c.backend != "openvino/CPU"]
    assert others and all(
        c.verdict == "rejected" and c.reason == "policy fixes the backend to openvino/CPU" for c in others
    )
    assert report_of(decision, "openvino/CPU").max_abs_diff < 1e-2
    # The others, rejected alike, are named in one entry with the reason said once.
    explained = explained_others(decision)
    assert {explained[(c.backend, c.artifact)] for c in others} == {
        (0, "rejected: policy fixes the backend to openvino/CPU")
    }
    assert decision.explain().count("policy fixes the backend") == 1


def test_prefer_without_benchmark_takes_the_first_preferred(cls_model_path: Path) -> None:
    decision = decide(
        [artifact_of(cls_model_path)], SelectionPolicy(prefer=("openvino/AUTO",), benchmark=False), None
    )
    assert decision.backend == "openvino/AUTO"
    assert decision.note == "benchmark off" and decision.checked is False and decision.reference is None
    assert [c.backend for c in decision.order()] == ["openvino/AUTO", "openvino/CPU", ORT_CPU]
    assert "; benchmark off (others: " in decision.explain()


def test_a_file_that_is_no_model_gets_every_backends_reason(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is a shopping list, not a model\n")
    artifact = artifact_of(path)
    with pytest.raises(NoBackendError) as caught:
        decide([artifact], SelectionPolicy(), None)
    message = str(caught.value)
    assert message.startswith("no backend can run this model (")
    names = {c.backend for c in caught.value.candidates}
    assert {ORT_CPU, "openvino/CPU", "openvino/AUTO", "tflite/cpu"} <= names
    for candidate in caught.value.candidates:
        assert candidate.verdict == "rejected" and candidate.reason
        assert f"{candidate.backend} on notes.onnx: {candidate.reason}" in message
    assert _reason(caught.value.candidates, "tflite/cpu") == "cannot read onnx files"
    assert "openvino/CPU cannot read notes.onnx" in _reason(caught.value.candidates, "openvino/CPU")
    assert "cannot load notes.onnx" in _reason(caught.value.candidates, ORT_CPU)


# --- 6. the child process: timeout and unknown backends -------------------------------------------------


def test_trial_that_takes_too_long_is_cut_off(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    request = TrialRequest(ORT_CPU, artifact_of(cls_model_path), cls_sample, warmup=1, runs=1)
    result = run_trial_isolated(request, timeout_s=0.05)
    assert result.ok is False
    assert result.error == "no answer within 0.05 s (hung while loading or running)"


def test_trial_on_an_unknown_backend_names_it(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    request = TrialRequest("nosuch/NPU", artifact_of(cls_model_path), cls_sample, warmup=1, runs=1)
    result = run_trial_isolated(request, timeout_s=60)
    assert result.ok is False and result.backend == "nosuch/NPU"
    assert result.error.startswith("unknown backend 'nosuch/NPU'; known: ")
    assert ORT_CPU in result.error


def test_load_decided_names_every_failure_when_nothing_loads(tmp_path: Path, cls_model_path: Path) -> None:
    artifact = artifact_of(cls_model_path)
    decision = decide([artifact], SelectionPolicy(benchmark=False), None)
    gone = ModelArtifact(tmp_path / "gone.onnx", "onnx", artifact.sha256)  # same hash, file missing
    with pytest.raises(BackendError, match=r"^no decided backend could load the model: openvino/CPU: "):
        load_decided(decision, [gone], SelectionPolicy())


# --- 7. compare_outputs -----------------------------------------------------------------------------------

POLICY = SelectionPolicy()


def test_outputs_are_matched_by_name_whatever_their_order() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)
    assert compare_outputs({"b": b, "a": a}, {"a": a, "b": b}, POLICY) == (0.0, "")
    diff, problem = compare_outputs({"b": b, "a": a + 1}, {"a": a, "b": b}, POLICY)
    assert diff == 1.0 and problem.startswith("output 'a' differs from the reference: 100.0% of values")


def test_outputs_are_matched_by_position_when_names_differ() -> None:
    a, b = np.zeros(3, np.float32), np.ones(3, np.float32)
    assert compare_outputs({"x": a, "y": b}, {"p": a, "q": b}, POLICY) == (0.0, "")
    diff, problem = compare_outputs({"x": b, "y": a}, {"p": a, "q": b}, POLICY)
    assert diff == 1.0 and problem.startswith("output 'p' differs from the reference")
    assert compare_outputs({"x": a}, {"p": a, "q": b}, POLICY) == (None, "1 outputs, the reference has 2")


def test_shape_mismatch_is_reported() -> None:
    out, ref = np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)
    assert compare_outputs({"a": out}, {"a": ref}, POLICY) == (
        None,
        "output 'a' has shape [2, 3], the reference [3, 2]",
    )


def test_nan_where_the_reference_has_none_is_wrong_but_shared_nan_is_not() -> None:
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    out = ref.copy()
    out[1] = np.nan
    assert compare_outputs({"a": out}, {"a": ref}, POLICY) == (
        None,
        "output 'a' has NaN or infinite values where the reference has none",
    )
    assert compare_outputs({"a": out}, {"a": out.copy()}, POLICY) == (0.0, "")
    assert compare_outputs({"a": ref * 1.005}, {"a": ref}, POLICY)[1] == ""  # within rtol 1e-2


def test_integer_outputs_must_match_exactly() -> None:
    labels = np.array([0, 1, 2, 2], np.int64)
    assert compare_outputs({"label": labels.copy()}, {"label": labels}, POLICY) == (0.0, "")
    off = labels.copy()
    off[3] = 1
    assert compare_outputs({"label": off}, {"label": labels}, POLICY) == (
        None,
        "output 'label' differs from the reference",
    )


def test_max_mismatch_allows_a_few_outliers_in_a_big_map_but_none_in_two_scores() -> None:
    rng = np.random.default_rng(0)
    ref = rng.random((100, 100), dtype=np.float32)  # 10000 values; max_mismatch 0.001 allows 10
    few = ref.copy()
    few.flat[rng.choice(ref.size, 5, replace=False)] += 0.5
    diff, problem = compare_outputs({"map": few}, {"map": ref}, POLICY)
    assert problem == "" and diff == pytest.approx(0.5, abs=1e-6)
    many = ref.copy()
    many.flat[rng.choice(ref.size, 20, replace=False)] += 0.5
    diff, problem = compare_outputs({"map": many}, {"map": ref}, POLICY)
    assert problem == (
        "output 'map' differs from the reference: 0.2% of values off by more than "
        "atol 0.001 + rtol 0.01, up to 0.5"
    )
    scores = np.array([0.2, 0.8], np.float32)
    diff, problem = compare_outputs({"s": scores + np.float32([0.0, 0.1])}, {"s": scores}, POLICY)
    assert problem.startswith("output 's' differs from the reference: 50.0% of values")
    assert diff == pytest.approx(0.1, abs=1e-6)


def test_openvino_sees_a_cpu_here() -> None:
    """What the tests above take for granted about this machine."""
    assert "CPU" in ov.Core().available_devices
    assert get_backend(ORT_CPU).probe().available and get_backend("tflite/cpu").probe().available


def test_reference_first_is_decide_without_a_sample_less_the_screening(
    cls_model_path: Path, tmp_path: Path
) -> None:
    """What serves at once on a first start (agent/backend_choice/, prove_later): the full-precision
    reference `decide` picks when there is no sample, or None where the policy rules it out."""
    spec = importlib.util.find_spec("mediapipe")  # located, never imported
    assert spec is not None and spec.submodule_search_locations
    mediapipe = Path(spec.submodule_search_locations[0])
    face = mediapipe / "modules" / "face_detection" / "face_detection_short_range.tflite"
    onnx_file, tflite_file = artifact_of(cls_model_path), ModelArtifact(face, "tflite", "cd" * 32)
    backends = [get_backend(name) for name in (ORT_CPU, "tflite/cpu", "openvino/CPU")]
    for artifacts in ([onnx_file], [tflite_file, onnx_file]):
        quick = reference_first(artifacts, SelectionPolicy(), backends)
        slow = decide(artifacts, SelectionPolicy(), [], backends)
        assert quick is not None and (quick.backend, quick.artifact) == (slow.backend, slow.artifact)
        assert (quick.backend, quick.artifact) == (ORT_CPU, onnx_file.label) and not quick.checked
    # The .tflite alone: LiteRT is the reference; with onnxruntime denied, the .onnx has none.
    litert = reference_first([tflite_file], SelectionPolicy(), backends)
    assert litert is not None and litert.backend == "tflite/cpu"
    assert reference_first([onnx_file], SelectionPolicy(deny=("onnxruntime/*",)), backends) is None
    assert reference_first([onnx_file], SelectionPolicy(fixed="openvino/CPU"), backends) is None
    assert reference_first([onnx_file], SelectionPolicy(fixed=ORT_CPU), backends) is not None
