"""Candidates judged on what the pipeline would report: a real YOLOv8n (nudenet's 320n.onnx) on a real
photo, where reduced precision (OpenVINO bf16 on CPUs that have it) moves tensors but not the
detections; and the judge's rules on outputs made to differ in one way each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.config import (
    ClassificationPostprocess,
    DetectionPostprocess,
    PreprocessConfig,
    RawPostprocess,
    ResizeConfig,
)
from agent.processing import Preprocessor
from agent.processing.judge import Judge, report_judge
from providers import ModelArtifact, SelectionPolicy, TensorSpec, decide, get_backend, run_trial
from providers.select import Sample
from tests.cpu_precision import assert_judged_on_its_numbers
from tests.media_fixtures import astronaut_bgr

POLICY = SelectionPolicy(runs=2, warmup=1, min_time_s=0.0, budget_s=1.0, max_trials=3)


@pytest.fixture(scope="module")
def yolo(yolo_path: Path, yolo_labels: list[str]) -> tuple[ModelArtifact, Sample, list[TensorSpec]]:
    artifact = ModelArtifact(yolo_path, "onnx", "b" * 64, name="320n.onnx")
    session = get_backend("onnxruntime/CPUExecutionProvider").load(artifact)
    try:
        resize = ResizeConfig(width=320, height=320, mode="letterbox")  # type: ignore[call-arg]
        preprocess = Preprocessor(PreprocessConfig(resize=resize, color="rgb", scale=1 / 255), session.inputs)
        tensor, _geometry = preprocess.prepare(astronaut_bgr())
        outputs = session.outputs
    finally:
        session.close()
    return artifact, Sample({"images": tensor}, "the astronaut"), outputs


def test_a_detector_is_judged_on_its_detections_not_its_tensors(
    yolo: tuple[ModelArtifact, Sample, list[TensorSpec]], yolo_labels: list[str]
) -> None:
    artifact, sample, outputs = yolo
    judge = report_judge(DetectionPostprocess(type="detection", labels=yolo_labels), outputs)
    by_report = decide([artifact], POLICY, [sample], trial=lambda r, _t: run_trial(r), judge=judge)
    by_tensor = decide([artifact], POLICY, [sample], trial=lambda r, _t: run_trial(r))
    for backend in ("openvino/CPU", "openvino/AUTO"):
        report = next(c for c in by_report.candidates if c.backend == backend)
        # At the CPU's default precision (bf16 where it has it, else f32) the detections are the
        # reference's: the boxes within a few pixels.
        assert report.verdict in ("passed", "chosen"), report
        assert report.max_abs_diff is not None and report.max_abs_diff < 4.0, report
        # On its tensors it is judged on its numbers (rejected on a bf16 CPU, passed on others).
        assert_judged_on_its_numbers(next(c for c in by_tensor.candidates if c.backend == backend), POLICY)
        tensor_report = next(c for c in by_tensor.candidates if c.backend == backend)
        if tensor_report.verdict == "rejected":  # it says what would let it through
            assert (
                "backends.options" in tensor_report.unlock and '{"precision": "f32"}' in tensor_report.unlock
            )


def _rows(*detections: tuple[int, float, list[float]]) -> dict[str, np.ndarray]:
    """YOLOv8 raw output [1, 4 + classes, anchors] holding these (class, score, xyxy box) rows."""
    out = np.zeros((1, 4 + 18, 8), np.float32)
    for anchor, (cls, score, (x1, y1, x2, y2)) in enumerate(detections):
        out[0, :4, anchor] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        out[0, 4 + cls, anchor] = score
    return {"output0": out}


def _detection_judge(yolo_labels: list[str]) -> Judge:
    outputs = [TensorSpec("output0", (1, 22, 8), "float32")]
    judge = report_judge(DetectionPostprocess(type="detection", labels=yolo_labels), outputs)
    assert judge is not None
    return judge


def test_detections_match_by_class_and_iou(yolo_labels: list[str]) -> None:
    judge = _detection_judge(yolo_labels)
    face = (1, 0.81, [173.0, 82.0, 274.0, 180.0])
    reference = _rows(face, (5, 0.6, [10.0, 10.0, 60.0, 60.0]))
    shifted = _rows((1, 0.79, [176.7, 82.0, 277.7, 180.0]), (5, 0.62, [11.0, 10.0, 61.0, 60.0]))
    diff, problem = judge(shifted, reference)
    assert problem == "" and diff == pytest.approx(3.7, abs=1e-3)

    diff, problem = judge(_rows((5, 0.6, [10.0, 10.0, 60.0, 60.0])), reference)
    assert problem.startswith(
        "reports other detections than the reference (2 detections in the reference, 1 here; "
    )
    assert "missing FACE_FEMALE 0.81 at [173, 82, 274, 180]" in problem
    other_class = _rows((3, 0.81, [173.0, 82.0, 274.0, 180.0]), (5, 0.6, [10.0, 10.0, 60.0, 60.0]))
    assert "missing FACE_FEMALE" in judge(other_class, reference)[1]
    assert "extra FEMALE_BREAST_EXPOSED 0.81" in judge(other_class, reference)[1]
    far = _rows((1, 0.81, [250.0, 82.0, 351.0, 180.0]), (5, 0.6, [10.0, 10.0, 60.0, 60.0]))
    assert "matched by class at IoU >= 0.5" in judge(far, reference)[1]
    # A detection at the threshold is a coin toss: missing on either side is no error.
    borderline = _rows(face, (5, 0.6, [10.0, 10.0, 60.0, 60.0]), (7, 0.3, [300.0, 300.0, 310.0, 310.0]))
    assert judge(borderline, reference)[1] == ""


def test_classifiers_must_give_the_same_top_classes() -> None:
    outputs = [TensorSpec("probs", (1, 3), "float32")]
    judge = report_judge(
        ClassificationPostprocess(type="classification", softmax=False, top_k=2, labels=["a", "b", "c"]),
        outputs,
    )
    assert judge is not None
    reference = {"probs": np.array([[0.7, 0.2, 0.1]], np.float32)}
    assert judge({"probs": np.array([[0.6, 0.3, 0.1]], np.float32)}, reference) == (pytest.approx(0.1), "")
    verdict = judge({"probs": np.array([[0.6, 0.1, 0.3]], np.float32)}, reference)
    assert verdict is not None
    assert verdict[1] == "reports other classes than the reference (top 2: a, c; the reference: a, b)"
    # Test data of two frames makes no single report: the candidate is then judged on its tensors.
    batch = {"probs": np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]], np.float32)}
    assert judge(batch, batch) is None


def test_a_threshold_must_fall_on_the_same_side() -> None:
    from agent.config import ThresholdPostprocess

    judge = report_judge(
        ThresholdPostprocess(type="threshold", on_score=0.5), [TensorSpec("p", (1, 1), "float32")]
    )
    assert judge is not None

    def score(value: float) -> dict[str, np.ndarray]:
        return {"p": np.array([[value]], np.float32)}

    assert judge(score(0.93), score(0.9))[1] == ""
    assert judge(score(0.2), score(0.9))[1] == (
        "reports inactive (score 0.2) where the reference is active (score 0.9; on_score 0.5)"
    )
    assert judge(score(0.45), score(0.55))[1] == ""  # the reference itself is at the threshold


def test_other_postprocessors_are_judged_on_tensors() -> None:
    assert report_judge(RawPostprocess(type="raw"), [TensorSpec("y", (1, 4), "float32")]) is None


def test_explain_shows_refused_and_unchecked_decisions(tmp_path: Path) -> None:
    """A pipeline no candidate could serve, and one decided without a sample: both explained."""
    from agent.backend_choice import DecisionStore
    from providers import Decision, NoBackendError
    from providers.select import CandidateReport
    from tests.cli_runs import edge_agent

    store = DecisionStore(tmp_path)
    wrong = CandidateReport(
        "openvino/CPU", "m.onnx", "onnx", "c" * 64, "rejected", "output 'y' differs from the reference",
        precision="bf16", max_abs_diff=0.3, unlock='full precision: it ran at bf16; backends.options ...',
    )  # fmt: skip
    store.put_refusal(NoBackendError([wrong]), "door", "det@1")
    unchecked = Decision(
        "onnxruntime/CPUExecutionProvider", "c" * 64, "m.onnx", None,
        [CandidateReport("onnxruntime/CPUExecutionProvider", "m.onnx", "onnx", "c" * 64, "chosen")],
        note="outputs not checked: no sample input; serving on the full-precision reference",
    )  # fmt: skip
    store.put("k" * 32, unchecked, "gate", "det@1", cache=False)
    result = edge_agent("explain", "det", "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "door (det@1): no backend serves it" in text
    assert "would pass with" in text and "full precision: it ran at bf16" in text
    assert "gate (det@1): runs on onnxruntime/CPUExecutionProvider on m.onnx" in text and "unchecked" in text
    records = edge_agent("explain", "det", "--state-dir", str(tmp_path), "--json")
    assert {("refused" in r) for r in json.loads(records.stdout)} == {True, False}
    assert not list(tmp_path.glob("decisions/*.json"))  # neither is cached for reuse
