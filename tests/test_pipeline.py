"""A whole pipeline without MQTT: real video -> real PP-OCR direction classifier -> collected results."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import ClassificationPostprocess, ModelRef, PipelineConfig, VideoSourceConfig
from agent.pipeline import Pipeline
from agent.results import Result
from agent.stage import LoadedModel
from providers import Session
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import (
    CLS_LABELS,
    CLS_PREPROCESS,
    FlakySession,
    ListSink,
    cls_artifact,
    demo_video_module,
    sign_folder,
)
from tests.waits import wait_until

VIDEO_FPS = 10
SECONDS_PER_SIGN = 1.0  # 6 signs: a 6 s video of 60 frames
LATENCY_KEYS = {"preprocess", "inference", "postprocess", "capture_to_result"}


@pytest.fixture(scope="module")
def orientation_video(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    path = tmp_path_factory.mktemp("pipeline") / "signs.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=VIDEO_FPS, seconds_per_sign=SECONDS_PER_SIGN)
    return path, truth


@pytest.fixture(scope="module")
def loaded(cls_model_path: Path) -> LoadedModel:
    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    return LoadedModel(name="pp-ocr-cls", version="2.0", sha256="ab" * 32, session=session)


def _config(uri: Path, fps: float | None, loop: bool = False) -> PipelineConfig:
    return PipelineConfig(
        name="orientation",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri=str(uri), fps=fps, loop=loop),
        preprocess=CLS_PREPROCESS,
        # The model already outputs probabilities: no second softmax.
        postprocess=ClassificationPostprocess(
            type="classification", softmax=False, top_k=2, labels=CLS_LABELS
        ),
    )


def test_pipeline_end_to_end_matches_ground_truth(
    orientation_video: tuple[Path, list[dict[str, object]]], loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path, truth = orientation_video
    sink = ListSink()
    pipeline = Pipeline(_config(path, fps=2), loaded, sink)
    started.append(pipeline)
    assert pipeline.stage.feeder.preprocess.shape == (1, 3, 48, 192)
    pipeline.warm_up()
    pipeline.start()
    assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    pipeline.stop(timeout=30)

    status = pipeline.status()
    assert status.state == "finished"
    assert status.counts.errors == 0 and status.counts.last_error is None
    assert status.stage.serving.backend == "onnxruntime/CPUExecutionProvider"
    assert status.stage.model == "pp-ocr-cls@2.0"
    assert status.source.state == "finished"
    assert status.counts.mean_inference_ms is not None and status.counts.mean_inference_ms > 0

    # 60 frames at 10 fps capped to 2 fps: 12 frames reach the model (a few may be dropped).
    handed = status.source.counters.frames_decoded - status.source.counters.frames_skipped_by_fps
    assert handed == 12
    assert status.counts.results == sink.count() == handed - pipeline.slot.dropped
    assert sink.count() >= 8

    seen_orientations = set()
    for name, result in sink.results:
        assert name == "orientation"
        json.dumps(result)
        assert set(result) == {
            "captured_at",
            "model",
            "backend",
            "precision",
            "latency_ms",
            "source",
            "output",
            "held_back",
        }
        assert result["held_back"] == 0  # no report rules
        assert isinstance(result["captured_at"], float) and abs(result["captured_at"] - time.time()) < 120
        assert result["model"] == {"name": "pp-ocr-cls", "version": "2.0", "sha256": "ab" * 32}
        assert result["backend"] == "onnxruntime/CPUExecutionProvider"
        assert result["precision"] == "fp32"
        assert set(result["latency_ms"]) == LATENCY_KEYS
        assert all(isinstance(v, float) and v >= 0 for v in result["latency_ms"].values())
        source = result["source"]
        assert set(source) == {"uri", "frame", "position_s", "frames_dropped", "outages", "last_outage_s"}
        assert (source["outages"], source["last_outage_s"]) == (0, None)  # a file that was there
        assert source["uri"] == str(path)
        assert source["position_s"] == pytest.approx((source["frame"] - 1) / VIDEO_FPS, abs=1e-3)
        top = result["output"]["top"]
        assert [t["label"] for t in top] in (CLS_LABELS, CLS_LABELS[::-1])
        assert top[0]["score"] >= top[1]["score"]
        assert top[0]["score"] + top[1]["score"] == pytest.approx(1.0, abs=1e-3)
        expected = demo_video_module().truth_at(truth, source["position_s"])
        assert expected is not None
        assert top[0]["label"] == expected["orientation"], (source, top, expected)
        seen_orientations.add(top[0]["label"])
    assert seen_orientations == set(CLS_LABELS)
    positions = [r["source"]["position_s"] for _, r in sink.results]
    assert positions == sorted(positions)
    assert (np.diff(positions) >= 0.5 - 1e-3).all()  # the 2 fps cap, on the video's timeline


def test_pipeline_keeps_going_when_some_frames_fail(
    tmp_path: Path, loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path = tmp_path / "fast.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=30, seconds_per_sign=0.4)  # 72 frames, 2.4 s
    flaky = FlakySession(loaded.session, every=3)
    model = LoadedModel(loaded.name, loaded.version, loaded.sha256, flaky)
    sink = ListSink()
    pipeline = Pipeline(_config(path, fps=None), model, sink)
    started.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    pipeline.stop(timeout=30)

    status = pipeline.status()
    assert flaky.calls >= 30
    assert status.counts.errors == flaky.failures == flaky.calls // 3
    assert status.counts.results == sink.count() == flaky.calls - flaky.failures
    assert status.counts.last_error is not None and "simulated device hiccup" in status.counts.last_error.text
    assert status.state == "finished"  # occasional failures never make it degraded
    assert status.error is None
    # Results after failures are still right.
    correct = 0
    for _, result in sink.results:
        expected = demo_video_module().truth_at(truth, result["source"]["position_s"])
        assert expected is not None
        correct += result["output"]["top"][0]["label"] == expected["orientation"]
    assert correct >= 0.9 * sink.count()
    frames = [r["source"]["frame"] for _, r in sink.results]
    assert frames == sorted(frames) and frames[-1] > 0.8 * 72


class FailingSink(ListSink):
    """Refuses every other result, as an outbox on a full disk would."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def submit(self, result: Result) -> None:
        self.calls += 1
        if self.calls % 2 == 0:
            raise OSError(28, "No space left on device")
        super().submit(result)


def test_pipeline_counts_sink_failures_and_keeps_going(
    tmp_path: Path, loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path = tmp_path / "fast.mp4"
    demo_video_module().make_orientation_video(path, fps=30, seconds_per_sign=0.2)  # 36 frames, 1.2 s
    sink = FailingSink()
    pipeline = Pipeline(_config(path, fps=None), loaded, sink)
    started.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    pipeline.stop(timeout=30)
    status = pipeline.status()
    assert sink.calls >= 10
    assert status.counts.results == sink.count() == (sink.calls + 1) // 2
    assert status.counts.errors == sink.calls // 2
    error = status.counts.last_error
    assert error is not None and error.text.startswith("cannot store the result")
    assert "No space left" in error.text
    assert status.state == "finished"


def test_pipeline_reports_degraded_when_every_frame_fails(
    tmp_path: Path, loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path = tmp_path / "fast.mp4"
    demo_video_module().make_orientation_video(path, fps=30, seconds_per_sign=0.5)  # 90 frames, 3 s
    broken = FlakySession(loaded.session, every=1)
    model = LoadedModel(loaded.name, loaded.version, loaded.sha256, broken)
    sink = ListSink()
    # Looping: the video never ends by itself, however slowly a busy machine gets to 12 errors.
    pipeline = Pipeline(_config(path, fps=None, loop=True), model, sink)
    started.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: pipeline.status().counts.errors >= 12, timeout=60)
    status = pipeline.status()
    assert status.state == "degraded", status
    assert "simulated device hiccup" in status.error
    assert status.counts.results == 0 and sink.count() == 0
    started_stop = time.monotonic()
    pipeline.stop(timeout=30)
    # Stop ends the looping source and the worker (finished) without waiting out its timeout: a stop
    # that did not reach them would take the whole 30 s; 15 s is generous for a busy machine.
    assert time.monotonic() - started_stop < 15.0
    assert pipeline.finished
    assert pipeline.status().state == "stopped"


class SlowSession(FlakySession):
    """The real session, but every run takes `delay_s` (a hung or very slow accelerator)."""

    def __init__(self, inner: Session, delay_s: float) -> None:
        super().__init__(inner, every=10**9)
        self.delay_s = delay_s

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)
        return super().run(feeds)


def test_busy_for_shows_a_worker_stuck_in_one_frame(
    orientation_video: tuple[Path, list[dict[str, object]]], loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path, _ = orientation_video
    slow = SlowSession(loaded.session, delay_s=1.5)
    model = LoadedModel(loaded.name, loaded.version, loaded.sha256, slow)
    pipeline = Pipeline(_config(path, fps=2), model, ListSink())
    started.append(pipeline)
    assert pipeline.busy_for_s() == 0.0
    pipeline.start()
    assert wait_until(lambda: pipeline.busy_for_s() > 1.0, timeout=30)
    assert wait_until(lambda: pipeline.stats.results >= 1, timeout=30)


class NanSession(FlakySession):
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = super().run(feeds)
        return {name: np.full_like(value, np.nan) for name, value in outputs.items()}


def test_nan_outputs_fail_the_frame_instead_of_publishing_invalid_json(
    orientation_video: tuple[Path, list[dict[str, object]]], loaded: LoadedModel, started: list[Pipeline]
) -> None:
    path, _ = orientation_video
    model = LoadedModel(loaded.name, loaded.version, loaded.sha256, NanSession(loaded.session, 10**9))
    sink = ListSink()
    pipeline = Pipeline(_config(path, fps=5), model, sink)
    started.append(pipeline)
    pipeline.start()
    assert wait_until(lambda: pipeline.status().counts.errors >= 3, timeout=60)
    assert sink.count() == 0
    # The step that refused them is named: the model ran, its outputs could not be made a result.
    error = pipeline.status().counts.last_error
    assert error is not None and error.text.startswith("postprocess failed: output ")
    assert "NaN or infinite" in error.text


def test_a_folder_of_images_goes_through_in_name_order(tmp_path: Path, loaded: LoadedModel) -> None:
    orientations = sign_folder(tmp_path / "frames", 6)
    sink = ListSink()
    # 2 images a second: the newest-frame slot would drop one only if the model lagged by 0.5 s.
    pipeline = Pipeline(_config(tmp_path / "frames", fps=2), loaded, sink)
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    finally:
        pipeline.stop(timeout=30)
    results = [r for _, r in sink.results]
    assert [r["source"]["frame"] for r in results] == list(range(1, 7))
    assert [r["output"]["top"][0]["label"] for r in results] == orientations
    assert pipeline.status().state == "finished"


class HandshakeSession(FlakySession):
    """The real session; each run waits (bounded) until the pipeline prepares the frame after it, and
    records whether that happened: it can only while the run is still going if the steps overlap."""

    def __init__(self, inner: Session, next_prepared: threading.Event) -> None:
        super().__init__(inner, every=10**9)
        self.next_prepared = next_prepared
        self.overlapped: list[bool] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.next_prepared.clear()
        self.overlapped.append(self.next_prepared.wait(timeout=5))
        return super().run(feeds)


class HandshakeSink(ListSink):
    """Each result waits (bounded) until the model runs on a later frame, recording whether it did."""

    def __init__(self, session: HandshakeSession) -> None:
        super().__init__()
        self.session = session
        self.overlapped: list[bool] = []

    def submit(self, result: Result) -> None:
        runs_before = self.session.calls
        self.overlapped.append(
            wait_until(lambda: self.session.calls > runs_before or len(self.overlapped) >= 5, timeout=5)
        )
        super().submit(result)


def test_preparing_inference_and_reporting_overlap_on_three_frames(
    tmp_path: Path, loaded: LoadedModel
) -> None:
    """While the model runs on frame N, frame N+1 is prepared and frame N-1's result is written: each
    step waits for the other to happen, which a one-thread loop could never do (it would wait out
    every timeout instead). Results still come in frame order, none lost."""
    sign_folder(tmp_path / "frames", 6)
    prepared = threading.Event()
    session = HandshakeSession(loaded.session, prepared)
    sink = HandshakeSink(session)
    model = LoadedModel(loaded.name, loaded.version, loaded.sha256, session)
    pipeline = Pipeline(_config(tmp_path / "frames", fps=2), model, sink)
    feeds = pipeline.stage.feeder.feeds

    def feeds_and_say(data: np.ndarray, gap: bool = False) -> Any:
        try:
            return feeds(data, gap)
        finally:
            if threading.current_thread() is not pipeline._thread:
                prepared.set()

    pipeline.stage.feeder.feeds = feeds_and_say  # type: ignore[method-assign]
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, timeout=90, interval=0.05)
    finally:
        pipeline.stop(timeout=30)
    frames = [r["source"]["frame"] for _, r in sink.results]
    assert frames == sorted(frames) and len(frames) == pipeline.status().counts.inferences
    # Every run but the last saw the next frame prepared while it waited; every result but the last
    # saw a later run start while it was being written.
    assert session.overlapped[:-1] and all(session.overlapped[:-1]), session.overlapped
    assert sink.overlapped[:-1] and all(sink.overlapped[:-1]), sink.overlapped


class HeldSink(ListSink):
    """Keeps results, but holds the report thread in its first submit until let go."""

    def __init__(self) -> None:
        super().__init__()
        self.holding, self.let_go = threading.Event(), threading.Event()

    def submit(self, result: Result) -> None:
        self.holding.set()
        assert self.let_go.wait(timeout=60)
        super().submit(result)


def test_frames_waiting_for_their_result_hold_no_pixels_or_model_inputs(
    tmp_path: Path, loaded: LoadedModel, started: list[Pipeline]
) -> None:
    """Memory: once the model has run on a frame, its result needs the frame's number and times only;
    the frames queued for a slow sink (disk, a busy outbox) must not keep their pixels alive."""
    sign_folder(tmp_path / "frames", 6)
    sink = HeldSink()
    config = _config(tmp_path / "frames", fps=None)
    config = config.model_copy(update={"source": config.source.model_copy(update={"realtime": False})})
    pipeline = Pipeline(config, loaded, sink)  # every image, as fast as the model takes them
    started.append(pipeline)
    pipeline.start()
    try:
        # The report thread is held in the first result; the next two inferred frames fill its hand-over.
        assert wait_until(
            lambda: sink.holding.is_set() and pipeline._inferred.full(), timeout=60, interval=0.02
        )
        waiting = list(pipeline._inferred.queue)
        assert len(waiting) == 2
        assert all(
            job.record.pixels is None and job.record.feeds is None and job.frame is None for job in waiting
        )
        assert pipeline.last_frame is not None and pipeline.last_frame.data.shape[2] == 3  # a sample is kept
    finally:
        sink.let_go.set()
    assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    frames = [r["source"]["frame"] for _, r in sink.results]
    assert frames == list(range(1, 7)), frames  # none lost, in order, numbered as before
