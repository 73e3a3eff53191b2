"""What the backend selection tests share (tests/test_select.py, test_spare_core.py, test_backend_choice.py,
test_testdata.py, test_explain_unlock.py): quick benchmark settings, an artifact of a model file, a
decision's report on one candidate and its explanation's "others" read back; a rendered sign preprocessed
for the PP-OCR cls model and that model's output on it from plain onnxruntime, and the `cls_sample`
fixture (registered in tests/conftest.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.processing import Preprocessor
from providers import CandidateReport, Decision, ModelArtifact, get_backend
from providers.select import reference_session
from tests.media_fixtures import CLS_PREPROCESS, demo_video_module

ORT_CPU = "onnxruntime/CPUExecutionProvider"
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"  # the cls model's one output: [batch, 2] probabilities
# Small benchmarks: each trial is a fresh Python process (~1 s); the numbers only have to exist.
QUICK = {"runs": 3, "warmup": 1, "min_time_s": 0.0, "budget_s": 1.0, "timeout_s": 60.0,
         "rounds": 3, "turn_s": 0.02}  # fmt: skip


def artifact_of(path: Path, fmt: str = "onnx", name: str = "") -> ModelArtifact:
    return ModelArtifact(path, fmt, hashlib.sha256(path.read_bytes()).hexdigest(), name)


def explained_others(decision: Decision) -> dict[tuple[str, str], tuple[int, str]]:
    """The "(others: A, B on model: verdict; ...)" part of `explain()`: (backend, model) -> (entry
    number, verdict). Candidates alike share one entry."""
    entries = decision.explain().split(" (others: ", 1)[1].removesuffix(")").split("; ")
    found = {}
    for n, entry in enumerate(entries):
        backends, rest = entry.split(" on ", 1)
        artifact, verdict = rest.split(": ", 1)
        found.update({(backend, artifact): (n, verdict) for backend in backends.split(", ")})
    return found


def report_of(decision: Decision, backend: str, artifact: str | None = None) -> CandidateReport:
    matches = [
        c
        for c in decision.candidates
        if c.backend == backend and (artifact is None or c.artifact == artifact)
    ]
    assert len(matches) == 1, (backend, artifact, [(c.backend, c.artifact) for c in decision.candidates])
    return matches[0]


def run_cls(model: Path, tensor: np.ndarray) -> np.ndarray:
    """The cls model's probabilities, computed by plain onnxruntime on CPU (not by edge-agent)."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    [probs] = session.run([CLS_OUTPUT], {"x": tensor})
    return np.asarray(probs)


def preprocessed_sign(model: Path, text: str, upside_down: bool, seed: int) -> np.ndarray:
    """A rendered sign, preprocessed as the pipeline does (BGR, 192x48, (x/255-0.5)/0.5)."""
    image = demo_video_module().render_sign(text, upside_down, np.random.default_rng(seed))
    session = reference_session([artifact_of(model)])
    try:
        preprocess = Preprocessor(CLS_PREPROCESS, session.inputs)
    finally:
        session.close()
    tensor = preprocess(image)
    assert preprocess.input.name == "x" and tensor.shape == (1, 3, 48, 192) and tensor.dtype == np.float32
    return tensor


@pytest.fixture(scope="module")
def cls_sample(cls_model_path: Path) -> dict[str, np.ndarray]:
    """An upside-down rendered sign, preprocessed as the pipeline does (BGR, 192x48, (x/255-0.5)/0.5)."""
    image = demo_video_module().render_sign("Gate B open", True, np.random.default_rng(3))
    session = get_backend(ORT_CPU).load(artifact_of(cls_model_path))
    try:
        preprocess = Preprocessor(CLS_PREPROCESS, session.inputs)
    finally:
        session.close()
    tensor = preprocess(image)
    assert tensor.shape == (1, 3, 48, 192)
    return {preprocess.input.name: tensor}
