"""A candidate rejected for its outputs says what would let it through: full precision when it ran at
a reduced one, or the tolerance its numbers need; so a user can trade exactness for speed knowingly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from providers import NoBackendError, SelectionPolicy, TrialResult, decide
from providers.select import Sample, what_would_pass
from tests.selection_fixtures import CLS_OUTPUT, QUICK, artifact_of, preprocessed_sign, run_cls

REFERENCE = {"y": np.linspace(0, 10, 1000, dtype=np.float32).reshape(1, 1000)}


def _result(precision: str, outputs: dict[str, np.ndarray]) -> TrialResult:
    return TrialResult("openvino/CPU", True, precision=precision, outputs=outputs)


def test_reduced_precision_and_the_tolerance_needed_are_named() -> None:
    rules = SelectionPolicy(rtol=0.0, atol=1e-3, max_mismatch=0.0)
    off = {"y": REFERENCE["y"] + np.float32(0.037)}
    hint = what_would_pass("openvino/CPU", _result("bf16", off), REFERENCE, rules)
    assert hint.startswith(
        'full precision: it ran at bf16; backends.options openvino/CPU: {"precision": "f32"}'
    )
    atol = float(hint.split("a tolerance of atol ")[1].split(" ")[0])
    assert 0.037 <= atol < 0.0371, hint  # just enough: every value within it
    trt = "onnxruntime/TensorrtExecutionProvider"
    assert what_would_pass(trt, _result("fp16", off), REFERENCE, rules).startswith(
        f'full precision: it ran at fp16; backends.options {trt}: {{"fp16": false}}'
    )
    # At full precision only the tolerance is left; with max_mismatch the worst 1% may stay outside.
    one_bad = REFERENCE["y"].copy()
    one_bad[0, :5] += 5.0
    loose = SelectionPolicy(rtol=0.0, atol=1e-3, max_mismatch=0.01)
    assert (
        what_would_pass("openvino/CPU", _result("f32", {"y": one_bad}), REFERENCE, loose) == ""
    )  # already passes
    assert "a tolerance of atol 5" in what_would_pass(
        "openvino/CPU", _result("f32", {"y": one_bad}), REFERENCE, rules
    )


def test_nothing_lets_through_outputs_of_another_shape_or_nan() -> None:
    rules = SelectionPolicy()
    assert (
        what_would_pass(
            "openvino/CPU", _result("f32", {"y": np.zeros((1, 999), np.float32)}), REFERENCE, rules
        )
        == ""
    )
    nan = REFERENCE["y"].copy()
    nan[0, 3] = np.nan
    assert what_would_pass("openvino/CPU", _result("f32", {"y": nan}), REFERENCE, rules) == ""


def test_explain_says_what_would_let_a_rejected_candidate_through(cls_model_path: Path) -> None:
    """Expected outputs shifted by 0.02: every backend is 'wrong' by 0.02 and is told so."""
    cls_input = preprocessed_sign(cls_model_path, "Gate B open", True, 3)
    cls_probs = run_cls(cls_model_path, cls_input)
    artifact = artifact_of(cls_model_path, name=cls_model_path.name)
    shifted = Sample(
        {"x": cls_input}, "test data shifted.npz", {CLS_OUTPUT: cls_probs + 0.02}, rtol=0.0, atol=1e-3
    )
    policy = SelectionPolicy(max_trials=1, fixed="onnxruntime/CPUExecutionProvider", **QUICK)
    with pytest.raises(NoBackendError) as caught:
        decide([artifact], policy, [shifted])
    [report] = [c for c in caught.value.candidates if c.backend == "onnxruntime/CPUExecutionProvider"]
    assert report.unlock.startswith("a tolerance of atol 0.02"), report
    assert "(would pass with a tolerance of atol 0.02" in str(caught.value)
