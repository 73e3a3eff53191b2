"""A camera that goes away and comes back: a real RTSP stream (GStreamer's RTSP server, H.264, on
loopback) of a rendered sign, read by the pipeline through OpenCV, classified by the real model.
The server is killed mid-stream and started again on the same port: the pipeline says the source
is unavailable meanwhile, reconnects by itself and carries on, and its results say there was an
outage and how long it lasted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.config import ClassificationPostprocess, ModelRef, PipelineConfig, VideoSourceConfig
from agent.pipeline import Pipeline
from agent.stage import LoadedModel
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, ListSink, cls_artifact, demo_video_module
from tests.rtsp_camera import RtspServer
from tests.waits import wait_until


@pytest.fixture
def camera(tmp_path: Path) -> Iterator[RtspServer]:
    image = demo_video_module().render_sign("LOADING BAY 3", True, np.random.default_rng(5))
    path = tmp_path / "sign.png"
    assert cv2.imwrite(str(path), image)
    server = RtspServer(path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def loaded(cls_model_path: Path) -> Iterator[LoadedModel]:
    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    yield LoadedModel(name="pp-ocr-cls", version="2.0", sha256="ab" * 32, session=session)
    session.close()


@pytest.mark.slow
def test_pipeline_reconnects_to_a_camera_that_goes_away_and_comes_back(
    camera: RtspServer, loaded: LoadedModel
) -> None:
    config = PipelineConfig(
        name="gate",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri=camera.url, fps=5, reopen_min_s=0.2, reopen_max_s=1.0),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(
            type="classification", softmax=False, top_k=1, labels=CLS_LABELS
        ),
        # The camera shows a still image: the motion gate (on by default for a camera) would let a
        # frame on only every keepalive_s. This test is about the connection, not about motion.
        motion=False,
    )
    sink = ListSink()
    pipeline = Pipeline(config, loaded, sink)
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: sink.count() >= 5, timeout=60), pipeline.status()
        assert pipeline.status().state == "running"

        camera.kill()
        assert wait_until(lambda: pipeline.status().state == "source-unavailable", timeout=60)
        unavailable = pipeline.status()
        assert "stopped delivering frames" in unavailable.error or "cannot open" in unavailable.error
        before = sink.count()

        camera.start()  # the same camera, back on the same address
        # Five results from after the outage (counted by what they say, not from `before`: on a busy
        # machine a frame from before it may still have been in the model when `before` was taken).
        assert wait_until(
            lambda: sum(r["source"]["outages"] == 1 for _, r in sink.results[:]) >= 5, timeout=60
        ), pipeline.status()
        back = pipeline.status()
    finally:
        pipeline.stop(timeout=30)

    assert back.state == "running" and back.error is None
    assert back.source.reconnects >= 1 and back.source.outages == 1
    assert back.source.last_outage_s > 0
    results = [r for _, r in sink.results]
    # Every frame, before and after the outage, is the upside-down sign, and says so.
    assert {r["output"]["top"][0]["label"] for r in results} == {"upside-down"}
    assert all(r["output"]["top"][0]["score"] > 0.9 for r in results)
    outages = [r["source"]["outages"] for r in results]
    split = outages.index(1)
    # Before the outage, 0; after it, 1. At most the frame in the model and the one in the slot when
    # `before` was taken can come after it.
    assert outages == [0] * split + [1] * (len(results) - split)
    assert before <= split <= before + 2, (before, split)
    after = results[split:]
    assert all(r["source"]["last_outage_s"] == back.source.last_outage_s for r in after)
    assert all(r["source"]["uri"] == camera.url and r["source"]["position_s"] is None for r in results)
