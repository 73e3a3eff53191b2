"""Are a candidate's outputs right: comparison with the reference under the tolerances, references
that are no reference (NaN, infinities), and what setting would let a rejected candidate through."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from providers.select.policy import Sample, SelectionPolicy
from providers.trial import TrialResult


def reference_problem(reference: str, outputs: Mapping[str, np.ndarray], sample: Sample) -> str:
    """Why `outputs`, the reference `_reference` found for `sample` (its expected outputs when it has
    any, else a CPU backend's), cannot be a reference; "" when they can.

    A reference that is not finite is not a reference: a candidate whose NaN "matched" it would be
    checked against nothing (a model made all NaN passed every backend so, "max diff 0"). A
    backend's outputs must be finite (`non_finite_reference`). Expected outputs may hold NaN, the
    publisher's contract (onnx's backend tests of Pow and Sqrt expect NaN for negative bases), but
    not in every value of an output: an output all NaN proves nothing.
    """
    if sample.expected:  # then they are the reference (`_reference`)
        for name, value in sample.expected.items():
            array = np.asarray(value)
            if array.dtype.kind in "fc" and array.size and not np.isfinite(array).any():
                return f"the reference, {reference}, has no finite value in output {name!r}"
        return ""
    return non_finite_reference(reference, outputs, sample)


def non_finite_reference(backend: str, outputs: Mapping[str, np.ndarray], sample: Sample) -> str:
    """Why a CPU backend's `outputs` on `sample` are no reference ("the reference BACKEND gives NaN
    or infinite values in output 'x' on ORIGIN ..."): NaN or infinities where the sample's expected
    outputs, if it has any, are finite. "" when there are none."""
    pairs: list[tuple[str, np.ndarray, np.ndarray | None]]
    if sample.expected:
        # Only the outputs the publisher vouches for; their count not pairing is compare_outputs' business.
        pairs = [(n, o, r) for n, o, r in output_pairs(outputs, sample.expected) or []]
    else:
        pairs = [(name, value, None) for name, value in outputs.items()]
    for name, value, expected in pairs:
        out = np.asarray(value)
        if out.dtype.kind not in "fc":
            continue
        bad = ~np.isfinite(out)
        ref = None if expected is None else np.asarray(expected)
        if ref is not None and ref.shape == out.shape and ref.dtype.kind in "fc":
            bad &= np.isfinite(ref)  # NaN the publisher expects there is its contract
        if bad.any():
            where = " where the expected outputs have finite values" if sample.expected else ""
            return (
                f"the reference {backend} gives NaN or infinite values in output {name!r} on "
                f"{sample.origin}{where} ({int(bad.sum())} of {out.size} values): a reference that is "
                "not finite checks nothing"
            )
    return ""


def published_non_finite_met(out: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Where expected outputs hold NaN or an infinity (a publisher's contract: onnx's Pow and Sqrt
    tests expect NaN for negative bases) and the output has the same value there."""
    return ~np.isfinite(expected) & ((np.isnan(out) & np.isnan(expected)) | (out == expected))


FULL_PRECISION = frozenset({"f32", "fp32", "FP32", "float32", ""})


def what_would_pass(
    backend: str,
    result: TrialResult,
    reference: Mapping[str, np.ndarray],
    rules: SelectionPolicy,
    tolerance: bool = True,
) -> str:
    """For a candidate rejected for its outputs: the settings that would let it through, so a user
    can choose speed over exactness knowingly (or "" when no setting would: wrong shapes, NaNs)."""
    ways = []
    if result.precision not in FULL_PRECISION:
        option = '{"precision": "f32"}' if backend.startswith("openvino/") else '{"fp16": false}'
        ways.append(f"full precision: it ran at {result.precision}; backends.options {backend}: {option}")
    needed = _tolerance_needed(result.outputs, reference, rules) if tolerance else None
    if needed is not None:
        ways.append(f"a tolerance of atol {needed:.3g} (backends.atol, or the test data's atol)")
    return " or ".join(ways)


def _tolerance_needed(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], rules: SelectionPolicy
) -> float | None:
    """The smallest atol (with the rules' rtol and max_mismatch) at which these outputs would pass."""
    pairs = output_pairs(outputs, reference)
    if pairs is None:
        return None
    worst = 0.0
    for _name, out, ref in pairs:
        if np.shape(out) != np.shape(ref) or np.asarray(ref).dtype.kind not in "fc":
            return None
        out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        out_finite, ref_finite = np.isfinite(out64), np.isfinite(ref64)
        same = published_non_finite_met(out64, ref64)
        if not (out_finite & ref_finite | same).all():
            return None  # NaN or infinities no tolerance lets through
        excess = np.zeros(out64.shape)  # published NaN matched at its place: within any tolerance
        both = out_finite & ref_finite
        excess[both] = np.abs(out64[both] - ref64[both]) - rules.rtol * np.abs(ref64[both])
        if excess.size:
            # The atol that leaves at most max_mismatch of the values outside.
            worst = max(worst, float(np.quantile(excess, 1.0 - rules.max_mismatch)))
    return worst * 1.0001 if worst > 0 else None


def judged_by(sample: Sample, policy: SelectionPolicy) -> SelectionPolicy:
    """The policy outputs on `sample` are judged by: the tolerances its expected outputs declare
    (every value within them), else the selection policy's."""
    if not sample.expected or (sample.rtol is None and sample.atol is None):
        return policy
    return replace(
        policy,
        rtol=sample.rtol if sample.rtol is not None else policy.rtol,
        atol=sample.atol if sample.atol is not None else policy.atol,
        max_mismatch=0.0,
    )


def output_pairs(
    outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> list[tuple[str, np.ndarray, np.ndarray]] | None:
    """(name, output, reference) for each reference output: by name (the reference may name only
    some), else by position; None when neither pairs them."""
    if set(reference) <= set(outputs):  # expected outputs may name only some of them
        return [(name, outputs[name], reference[name]) for name in reference]
    if len(outputs) == len(reference):
        return [
            (name, out, ref) for (name, ref), out in zip(reference.items(), outputs.values(), strict=True)
        ]
    return None


def compare_outputs(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    policy: SelectionPolicy,
    computed: bool = False,
) -> tuple[float | None, str]:
    """(max abs difference, "" or what is wrong). Outputs are matched by name (the reference may
    name only some), else by position.

    An element matches when |out - ref| <= atol + rtol * |ref|. Up to `max_mismatch` of the
    elements of an output may miss (reduced precision moves a few pixels of a large map a lot
    while the map as a whole agrees); a small output (a few scores) must match everywhere.

    NaN never matches by itself. `computed`: the reference is a backend's outputs, and any NaN or
    infinity in it is a problem (it checks nothing). Else it is expected outputs a publisher ships:
    NaN or an infinity there is its contract (onnx's backend tests of Pow and Sqrt expect NaN for
    negative bases), matched only by the same value at the same place, and an output with no finite
    value at all is no reference either. An output NaN or infinite where the reference is finite
    is always wrong, however few such values.
    """
    pairs = output_pairs(outputs, reference)
    if pairs is None:
        return None, f"{len(outputs)} outputs, the reference has {len(reference)}"
    worst = 0.0
    for name, out, ref in pairs:
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return None, f"output {name!r} has shape {list(out.shape)}, the reference {list(ref.shape)}"
        if ref.dtype.kind not in "fc":
            if not np.array_equal(out, ref):
                return None, f"output {name!r} differs from the reference"
            continue
        out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
        out_finite, ref_finite = np.isfinite(out64), np.isfinite(ref64)
        if not ref_finite.all() and (computed or not ref_finite.any()):
            what = "NaN or infinite values" if computed else "no finite value"
            return None, f"the reference has {what} in output {name!r}"
        if (ref_finite & ~out_finite).any():
            where = "none" if ref_finite.all() else "finite values"
            return None, f"output {name!r} has NaN or infinite values where the reference has {where}"
        if not out.size:
            continue
        both = ref_finite & out_finite  # only the expected outputs' own NaN/infinities are left out
        diff = np.abs(out64[both] - ref64[both])
        largest = float(diff.max()) if diff.size else 0.0
        worst = max(worst, largest)
        # Published NaN matches NaN at the same place (infinities match themselves in isclose).
        close = np.isclose(out64, ref64, rtol=policy.rtol, atol=policy.atol, equal_nan=not computed)
        missed = float(np.mean(~close))
        if missed > policy.max_mismatch:
            return worst, (
                f"output {name!r} differs from the reference: {missed:.1%} of values off by more than "
                f"atol {policy.atol:g} + rtol {policy.rtol:g}, up to {largest:.3g}"
            )
    return worst, ""
