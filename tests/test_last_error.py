"""A pipeline's last error carries its time and the model it came from, and is cleared once the
pipeline has run cleanly for a health window (agent/pipeline.py): a real video through the real
PP-OCR direction classifier, whose session fails its first runs and then works."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from agent.clock import iso_utc
from agent.config import (
    ClassificationPostprocess,
    HealthWindowConfig,
    ModelRef,
    PipelineConfig,
    VideoSourceConfig,
)
from agent.pipeline import Pipeline
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
)
from tests.waits import wait_until

FAILING_RUNS = 4
NEVER = HealthWindowConfig(window_s=3600)  # a window no test waits out: the error must stay
SHORT = HealthWindowConfig(window_s=1, min_frames=3)


class FailsFirst(FlakySession):
    """The real session, except that its first `count` runs raise (a device that recovers)."""

    def __init__(self, inner: Session, count: int) -> None:
        super().__init__(inner, every=10**9)
        self.count = count

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.calls < self.count:
            self.calls += 1
            self.failures += 1
            raise RuntimeError(f"device busy (run {self.calls})")
        return super().run(feeds)


@pytest.fixture
def looping_pipeline(tmp_path: Path, cls_model_path: Path) -> Iterator[Pipeline]:
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    session = FailsFirst(OnnxRuntimeBackend().load(cls_artifact(cls_model_path)), FAILING_RUNS)
    model = LoadedModel(name="pp-ocr-cls", version="2.0", sha256="ab" * 32, session=session)
    config = PipelineConfig(
        name="orientation",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri=str(video), fps=10, loop=True),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(
            type="classification", softmax=False, top_k=2, labels=CLS_LABELS
        ),
    )
    pipeline = Pipeline(config, model, ListSink())
    pipeline.start()
    try:
        yield pipeline
    finally:
        pipeline.stop(timeout=30)


def _epoch(stamp: str) -> float:
    assert stamp.endswith("Z"), stamp  # ISO UTC, as every other time in status
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_the_last_error_has_a_time_and_is_cleared_after_a_clean_health_window(
    looping_pipeline: Pipeline,
) -> None:
    pipeline = looping_pipeline
    before = time.time()
    wait_until(lambda: pipeline.status(NEVER).counts.errors >= FAILING_RUNS, "the failing runs", timeout=60)
    wait_until(lambda: pipeline.status(NEVER).counts.inferences >= 5, "good frames after them", timeout=60)

    status = pipeline.status(NEVER)
    assert status.counts.errors == FAILING_RUNS
    error = status.counts.last_error
    assert error is not None and error.text == f"inference failed: device busy (run {FAILING_RUNS})"
    assert before - 1 <= _epoch(error.at) <= time.time() + 1
    assert error.model == "pp-ocr-cls@2.0"
    stage = pipeline.stage.stats
    assert stage.last_error == error.text
    assert stage.last_error_at is not None and iso_utc(stage.last_error_at) == error.at

    # Clean frames, but not for the window yet (an hour): the error stays.
    assert pipeline.status(NEVER).counts.last_error is not None
    # A one-second window with three good frames: cleared; the count of failed frames stays.
    wait_until(lambda: pipeline.status(SHORT).counts.last_error is None, "the error cleared", timeout=30)
    status = pipeline.status(SHORT)
    assert status.counts.last_error is None and status.to_json()["last_error_at"] is None
    assert status.counts.errors == FAILING_RUNS and status.state == "running"
