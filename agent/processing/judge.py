"""Judging a candidate backend on what the pipeline would report, not on raw tensors.

A detector at reduced precision (OpenVINO bf16, TensorRT fp16) moves boxes by a few pixels and
scores by a few hundredths: its tensors fail an elementwise check that the reports it leads to pass.
Where the pipeline has a postprocessor that says what matters, the candidate's outputs and the
reference's go through it and are compared as reports:
- detection: the same objects: each reference detection matched by one of the same class at IoU >=
  `match_iou` (greedy, best scores first); detections within `SCORE_MARGIN` of the score threshold
  may be missing on either side (a coin toss at the threshold is no error); scores above 1 where the
  reference's are 0..1 are wrong however the boxes match (a quantized output head);
- classification: the same top-k classes, in the same order;
- threshold (speech, anomalies): the same side of `on_score` (a reference score within
  `SCORE_MARGIN` of it may go either way), so the same events start;
- ctc (text recognizers): the same text, every batch row; the difference is the count of rows that
  read otherwise;
- embedding: the same direction, cosine similarity >= `MIN_COSINE` on every row; the difference is
  1 - the lowest similarity.
Other postprocessors (raw tensors, regions, plugins) are judged on their tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from agent.config import (
    ClassificationPostprocess,
    DetectionPostprocess,
    PostprocessConfig,
    ThresholdPostprocess,
)
from agent.config.processing import CtcPostprocess, EmbeddingPostprocess
from agent.errors import EdgeAgentError
from agent.processing.postprocess import Ctc, Embedding, Postprocessor, build_postprocessor
from providers import TensorSpec

# (candidate outputs, reference outputs) -> (the largest difference, in the report's units; "" or the
# problem), or None when the reference itself makes no report (a test-data batch of several
# frames, say): then the candidate is judged on its tensors.
Judge = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], tuple[float | None, str] | None]
SCORE_MARGIN = 0.1
MIN_COSINE = 0.99  # embeddings: a candidate's vectors point where the reference's do


def report_judge(
    postprocess: PostprocessConfig, outputs: list[TensorSpec], match_iou: float = 0.5
) -> Judge | None:
    """A judge for this postprocessor, or None when candidates are judged on their tensors."""
    if isinstance(postprocess, DetectionPostprocess):
        return partial(_same_detections, build_postprocessor(postprocess, outputs), postprocess, match_iou)
    if isinstance(postprocess, ClassificationPostprocess):
        return partial(_same_top, build_postprocessor(postprocess, outputs))
    if isinstance(postprocess, ThresholdPostprocess):
        build_postprocessor(postprocess, outputs)  # the output must exist
        return partial(_same_side, postprocess, outputs)
    if isinstance(postprocess, CtcPostprocess):
        return partial(_same_text, Ctc(postprocess, outputs))
    if isinstance(postprocess, EmbeddingPostprocess):
        return partial(_same_direction, Embedding(postprocess, outputs))
    return None


def judged_on(postprocess: PostprocessConfig) -> str:
    """What `report_judge` compares for this postprocess, in the words Decision.judged_on keeps."""
    kinds = {
        DetectionPostprocess: "detections",
        ClassificationPostprocess: "top-k",
        CtcPostprocess: "text",
        EmbeddingPostprocess: "embedding",
    }
    return next((word for kind, word in kinds.items() if isinstance(postprocess, kind)), "")


def _report(post: Postprocessor, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return post(outputs, None)


def _same_detections(
    post: Postprocessor,
    config: DetectionPostprocess,
    match_iou: float,
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
) -> tuple[float | None, str] | None:
    try:
        want = _report(post, reference)["detections"]
    except EdgeAgentError:
        return None
    try:
        got = _report(post, outputs)["detections"]
    except EdgeAgentError as exc:
        return None, f"its outputs make no report: {exc}"
    unmatched = list(got)
    missing, worst = [], 0.0
    for wanted in sorted(want, key=lambda d: -float(d["score"])):
        same_class = [d for d in unmatched if d["index"] == wanted["index"]]
        best = max(same_class, key=lambda d: _iou(d["box"], wanted["box"]), default=None)
        if best is None or _iou(best["box"], wanted["box"]) < match_iou:
            missing.append(wanted)
            continue
        unmatched.remove(best)
        worst = max(worst, float(np.max(np.abs(np.subtract(best["box"], wanted["box"])))))
    edge = config.score_threshold + SCORE_MARGIN
    missing = [d for d in missing if float(d["score"]) >= edge]
    extra = [d for d in unmatched if float(d["score"]) >= edge]
    # Scores that are no probabilities where the reference's are (a quantized output head: 1.25).
    top = max((float(d["score"]) for d in got), default=0.0)
    above = top > 1.0 and all(float(d["score"]) <= 1.0 for d in want)
    problems = [f"class scores above 1 (up to {top:.2f}; the reference's are 0..1)"] if above else []
    if missing or extra:
        parts = [f"{len(want)} detections in the reference, {len(got)} here"]
        if missing:
            parts.append("missing " + ", ".join(_describe(d) for d in missing[:3]))
        if extra:
            parts.append("extra " + ", ".join(_describe(d) for d in extra[:3]))
        problems.append(
            f"reports other detections than the reference ({'; '.join(parts)}; "
            f"matched by class at IoU >= {match_iou:g})"
        )
    return worst, "; ".join(problems)


def _same_top(
    post: Postprocessor, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> tuple[float | None, str] | None:
    try:
        want = _report(post, reference)["top"]
    except EdgeAgentError:
        return None
    try:
        got = _report(post, outputs)["top"]
    except EdgeAgentError as exc:
        return None, f"its outputs make no report: {exc}"
    worst = max(
        (abs(float(a["score"]) - float(b["score"])) for a, b in zip(got, want, strict=False)), default=0.0
    )
    if [d["index"] for d in got] != [d["index"] for d in want]:
        shown = ", ".join(str(d["label"] if d["label"] is not None else d["index"]) for d in got)
        expected = ", ".join(str(d["label"] if d["label"] is not None else d["index"]) for d in want)
        return (
            worst,
            f"reports other classes than the reference (top {len(want)}: {shown}; the reference: {expected})",
        )
    return worst, ""


def _same_side(
    config: ThresholdPostprocess,
    specs: list[TensorSpec],
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
) -> tuple[float | None, str] | None:
    try:  # fresh postprocessors: the threshold's state is per pipeline run, not shared here
        want = _report(build_postprocessor(config, specs), reference)
    except EdgeAgentError:
        return None
    try:
        got = _report(build_postprocessor(config, specs), outputs)
    except EdgeAgentError as exc:
        return None, f"its outputs make no report: {exc}"
    diff = abs(float(got["score"]) - float(want["score"]))
    undecided = abs(float(want["score"]) - config.on_score) < SCORE_MARGIN
    if got["active"] != want["active"] and not undecided:
        state = {True: "active", False: "inactive"}
        return diff, (
            f"reports {state[got['active']]} (score {got['score']}) where the reference is "
            f"{state[want['active']]} (score {want['score']}; on_score {config.on_score:g})"
        )
    return diff, ""


def _same_text(
    post: Ctc, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> tuple[float | None, str] | None:
    try:
        want = post.rows(reference)
    except EdgeAgentError:
        return None
    try:
        got = post.rows(outputs)
    except EdgeAgentError as exc:
        return None, f"its outputs make no report: {exc}"
    if len(got) != len(want):
        return float(len(want)), f"reads {len(got)} rows where the reference reads {len(want)}"
    other = [(g["text"], w["text"]) for g, w in zip(got, want, strict=True) if g["text"] != w["text"]]
    if other:
        text, wanted = other[0]
        return float(len(other)), (
            f"reads other text than the reference in {len(other)} of {len(want)} rows "
            f"({text!r} where the reference reads {wanted!r})"
        )
    return 0.0, ""


def _same_direction(
    post: Embedding, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> tuple[float | None, str] | None:
    try:
        want = post.vectors(reference)
    except EdgeAgentError:
        return None
    try:
        got = post.vectors(outputs)
    except EdgeAgentError as exc:
        return None, f"its outputs make no report: {exc}"
    if got.shape != want.shape:
        return None, f"gives {list(got.shape)} vectors where the reference gives {list(want.shape)}"
    lengths = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cosine = np.sum(got * want, axis=1) / np.where(lengths > 0, lengths, 1.0)
    zero = lengths == 0  # a zero vector has no direction: it agrees only with another zero vector
    cosine[zero] = (np.abs(got[zero]).sum(axis=1) + np.abs(want[zero]).sum(axis=1)) == 0
    lowest = float(cosine.min())
    if lowest < MIN_COSINE:
        return 1.0 - lowest, (
            f"gives other embeddings than the reference (cosine similarity {lowest:.4f}, "
            f"at least {MIN_COSINE} needed)"
        )
    return 1.0 - lowest, ""


def _describe(detection: Mapping[str, Any]) -> str:
    label = detection.get("label") or detection["index"]
    box = ", ".join(f"{v:.0f}" for v in detection["box"])
    return f"{label} {float(detection['score']):.2f} at [{box}]"


def _iou(a: Any, b: Any) -> float:
    ax1, ay1, ax2, ay2 = map(float, a)
    bx1, by1, bx2, by2 = map(float, b)
    w, h = max(0.0, min(ax2, bx2) - max(ax1, bx1)), max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = w * h
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0
