"""Runtime fallback: a backend that keeps failing while serving is demoted, the next candidate takes
over without stopping the pipeline, and the better one is taken back once it works again.

An accelerator cannot be unplugged here, so its failure is simulated by a session that raises the
BackendError a dead device gives; every other part (the switcher, real backends, the real model,
a real video) is the real thing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy
import pytest

from agent import stage as stage_module
from agent.backend_choice import DecisionSwitcher
from agent.config import ClassificationPostprocess, ModelRef, PipelineConfig, VideoSourceConfig
from agent.pipeline import Pipeline
from agent.results import Result
from agent.stage import LoadedModel
from providers import (
    CandidateReport,
    Decision,
    ModelArtifact,
    SelectionPolicy,
    Session,
    decide,
)
from providers.onnxruntime_backend import OnnxRuntimeBackend
from providers.openvino_backend import OpenVinoBackend
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, FlakySession, demo_video_module
from tests.waits import wait_until

ORT, OV = "onnxruntime/CPUExecutionProvider", "openvino/CPU"


class Sink:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def submit(self, result: Result) -> None:
        with self.lock:
            self.results.append(result.fields())

    def backends(self) -> list[str]:
        with self.lock:
            return [r["backend"] for r in self.results]


@pytest.fixture
def artifact(cls_model_path: Path) -> ModelArtifact:
    return ModelArtifact(cls_model_path, "onnx", "c" * 64, name="cls.onnx")


def _decision(artifact: ModelArtifact) -> Decision:
    def report(backend: str, verdict: str, rank: int) -> CandidateReport:
        return CandidateReport(backend, artifact.label, "onnx", artifact.sha256, verdict, rank=rank)

    return Decision(
        ORT, artifact.sha256, artifact.label, "fp32", [report(ORT, "chosen", 1), report(OV, "passed", 2)]
    )


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Pipeline]]:
    started: list[Pipeline] = []
    yield started
    for p in started:
        p.stop(timeout=30)


def _pipeline(
    tmp_path: Path,
    artifact: ModelArtifact,
    switcher: DecisionSwitcher,
    sink: Sink,
    session: Session | None = None,
) -> Pipeline:
    """The pipeline on a looping video, serving on `session` (default: a dead device's)."""
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=1.0)
    config = PipelineConfig(
        name="door",
        model=ModelRef(name="cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri=str(video), fps=10, loop=True),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(type="classification", softmax=False, labels=CLS_LABELS),
    )
    if session is None:
        # What a session on a device that went away does: every run fails.
        real = OnnxRuntimeBackend().load(artifact)
        session = FlakySession(real, every=1, message="device lost (simulated unplug)")
    model = LoadedModel("cls", "2.0", artifact.sha256, session, switcher.decision)
    return Pipeline(config, model, sink, switcher)


def switch_logs(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(level, message) of each `switched backend` line the pipelines logged."""
    return [(r.levelname, r.getMessage()) for r in caplog.records if "switched backend" in r.getMessage()]


def test_a_failing_backend_is_replaced_by_the_next_candidate_and_taken_back_later(
    tmp_path: Path,
    artifact: ModelArtifact,
    running: list[Pipeline],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.stage")
    monkeypatch.setattr(stage_module, "_RETRY_PREFERRED_EVERY_S", 0.5)
    first_run = {"x": numpy.zeros((1, 3, 48, 192), "float32")}
    switcher = DecisionSwitcher(
        _decision(artifact), [artifact], SelectionPolicy(), warm_up=first_run,
        backends=[OnnxRuntimeBackend(), OpenVinoBackend("CPU")], retry_first_s=2.0, retry_max_s=4.0,
    )  # fmt: skip
    sink = Sink()
    pipeline = _pipeline(tmp_path, artifact, switcher, sink)
    running.append(pipeline)
    pipeline.start()
    # Five failures in a row, then OpenVINO serves: no stop, results keep coming.
    assert wait_until(lambda: OV in sink.backends(), "results from the fallback backend", timeout=120)
    assert pipeline.stage.model.switches[0].startswith(f"{ORT} -> {OV}: 5 failures in a row")
    assert "device lost" in pipeline.stage.model.switches[0]
    assert pipeline.status().counts.errors == 5 and pipeline.status().state == "running"
    # After the backoff (2 s), onnxruntime is tried again; it loads and runs, so it is taken back.
    assert wait_until(lambda: sink.backends()[-1:] == [ORT], "results from onnxruntime again", timeout=120)
    assert pipeline.stage.model.switches[-1] == f"{OV} -> {ORT}: the preferred backend works again"
    status = pipeline.status()
    assert status.stage.serving.backend == ORT and len(status.stage.backend_switches) == 2
    truth_labels = {r["output"]["top"][0]["label"] for r in sink.results}
    assert truth_labels <= set(CLS_LABELS)
    # The fallback is a problem (WARNING); getting the preferred backend back is good news (INFO).
    fallback, back = pipeline.stage.model.switches
    assert switch_logs(caplog) == [
        ("WARNING", f"pipeline door: switched backend {fallback}"),
        ("INFO", f"pipeline door: switched backend {back}"),
    ]


def test_a_backend_proven_better_on_a_frame_takes_over_logged_at_info(
    tmp_path: Path, artifact: ModelArtifact, running: list[Pipeline], caplog: pytest.LogCaptureFixture
) -> None:
    """A pipeline serving on the reference (no sample when it was built) proves the candidates on
    its first frame; the winner is swapped in between two frames: an upgrade, logged at INFO.

    The proof is the real selection (trials in child processes on the frame's inputs), under a
    policy that leaves only OpenVINO to choose, so that the winner is not the backend serving."""
    caplog.set_level(logging.INFO, logger="agent.stage")
    backends = [OnnxRuntimeBackend(), OpenVinoBackend("CPU")]
    policy = SelectionPolicy(fixed=OV, runs=3, warmup=1, min_time_s=0.0, budget_s=1.0, timeout_s=60.0)

    def prove(feeds: Mapping[str, numpy.ndarray]) -> Decision:
        return decide([artifact], policy, feeds, backends=backends)

    unchecked = _decision(artifact)  # not checked: no sample when the pipeline was built
    assert not unchecked.checked
    switcher = DecisionSwitcher(unchecked, [artifact], policy, backends=backends, prove=prove)
    sink = Sink()
    pipeline = _pipeline(tmp_path, artifact, switcher, sink, session=OnnxRuntimeBackend().load(artifact))
    running.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: OV in sink.backends(), "results from the proven backend", timeout=120)
    assert sink.backends()[0] == ORT  # served at once on the reference, before the proof
    [upgrade] = pipeline.stage.model.switches
    assert upgrade == f"{ORT} -> {OV}: a frame from the source proved it the best candidate"
    assert switch_logs(caplog) == [("INFO", f"pipeline door: switched backend {upgrade}")]
    assert pipeline.status().counts.errors == 0


def test_with_no_candidate_left_the_pipeline_reports_degraded(
    tmp_path: Path, artifact: ModelArtifact, running: list[Pipeline]
) -> None:
    # Only the failing backend is known: the fallback finds nothing and the pipeline says so.
    switcher = DecisionSwitcher(_decision(artifact), [artifact], SelectionPolicy(), backends=[])
    sink = Sink()
    pipeline = _pipeline(tmp_path, artifact, switcher, sink)
    running.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: pipeline.status().state == "degraded", "degraded", timeout=60)
    assert pipeline.stage.model.switches == [] and sink.results == []
    assert "device lost" in str(pipeline.status().error)
