"""Tests that hold on every CPU, whatever precision OpenVINO picks there.

OpenVINO computes in bf16 by default on CPUs with avx512_bf16 or AMX and in f32 elsewhere, so the
same model's outputs pass a check on one machine and are rightly rejected on another. A test that
needs a backend's outputs right pins f32 itself (`exact_options`); a test that leaves the default
asserts only that a verdict follows from the candidate's own numbers (`assert_judged_on_its_numbers`).
"""

from __future__ import annotations

from typing import Any

from providers.select import CandidateReport, SelectionPolicy


def exact_options(backend: str) -> dict[str, Any]:
    """Load options that make `backend` compute in f32 on any CPU (OpenVINO's `precision`)."""
    return {"precision": "f32"} if backend.startswith("openvino/") else {}


def assert_judged_on_its_numbers(report: CandidateReport, policy: SelectionPolicy) -> None:
    """`report` ran, was compared with the reference, and its verdict is what its outputs earned."""
    assert report.median_ms is not None and report.precision, report
    assert report.max_abs_diff is not None, report
    if report.verdict == "rejected":
        # Rejected for its outputs (not a load failure or a slip), and the difference is real.
        assert "differs from the reference" in report.reason, report
        assert report.max_abs_diff > policy.atol, report
    else:
        assert report.verdict in {"chosen", "passed"} and report.reason == "", report
