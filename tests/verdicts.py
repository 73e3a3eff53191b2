"""What a selection test may assert about a candidate whose correctness depends on the CPU.

OpenVINO computes in bf16 by default on CPUs with avx512_bf16 or AMX and in f32 elsewhere, so the
same candidate passes on one machine and is rightly rejected on another. A test that did not pin
the precision itself asserts only that the verdict follows from the candidate's own numbers.
"""

from __future__ import annotations

from providers.select import CandidateReport, SelectionPolicy


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
