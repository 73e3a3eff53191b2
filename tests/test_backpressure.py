"""A slow model on a fast camera: the real PP-OCRv4 text detector at 960x960 (tens of ms a frame
here) on an image-folder camera looping at 100 frames per second. The pipeline keeps only the
newest frame, so memory stays flat however long it runs, and every frame it had to skip is
counted, in the status and in each result."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import psutil
import pytest

from agent.config import PipelineConfig
from agent.pipeline import Pipeline
from agent.stage import LoadedModel
from providers import ModelArtifact
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import ListSink
from tests.store_fixtures import rapidocr_models_dir
from tests.waits import wait_until


@pytest.fixture
def det() -> Iterator[LoadedModel]:
    artifact = ModelArtifact(rapidocr_models_dir() / "ch_PP-OCRv4_det_infer.onnx", "onnx", "ab" * 32)
    session = OnnxRuntimeBackend().load(artifact)
    yield LoadedModel("pp-ocr-det", "4", "ab" * 32, session)
    session.close()


@pytest.mark.slow
def test_slow_model_on_fast_camera_drops_frames_counts_them_and_keeps_memory_flat(
    tmp_path: Path, det: LoadedModel
) -> None:
    folder = tmp_path / "camera"
    folder.mkdir()
    for i in range(20):
        frame = np.full((720, 1280, 3), 255, np.uint8)
        cv2.putText(frame, f"DOCK {i:02d}", (100, 360), cv2.FONT_HERSHEY_SIMPLEX, 4, (0, 0, 0), 8)
        assert cv2.imwrite(str(folder / f"{i:03d}.png"), frame)
    config = PipelineConfig.model_validate(
        {
            "name": "dock",
            "model": {"name": "pp-ocr-det", "version": "4"},
            "source": {"type": "video", "uri": str(folder), "fps": 100, "loop": True},
            "preprocess": {"resize": {"width": 960, "height": 960, "mode": "letterbox", "pad": 255},
                           "color": "bgr", "mean": [0.5], "std": [0.5]},
            "postprocess": {"type": "regions", "unclip_ratio": 1.5},
        }
    )  # fmt: skip
    sink = ListSink()
    pipeline = Pipeline(config, det, sink)
    pipeline.warm_up()
    process = psutil.Process()
    pipeline.start()
    try:
        assert wait_until(lambda: sink.count() >= 5, timeout=60), pipeline.status()
        settled = process.memory_info().rss
        peak = settled
        decoded_before, results_before = pipeline.status().source.counters.frames_decoded, sink.count()

        def ran_long_enough() -> bool:
            """Samples memory; true once 300 more frames were decoded (3 s of this camera, ~800 MB
            had they piled up) and the model got more of them: a count, not a time, so a busy
            machine only makes it take longer."""
            nonlocal peak
            peak = max(peak, process.memory_info().rss)
            decoded_now = pipeline.status().source.counters.frames_decoded
            return decoded_now >= decoded_before + 300 and sink.count() >= results_before + 5

        assert wait_until(
            ran_long_enough, "300 more frames", timeout=120, interval=0.2, state=pipeline.status
        )
        status = pipeline.status()
    finally:
        pipeline.stop(timeout=30)

    decoded, dropped = status.source.counters.frames_decoded, status.source.frames_dropped
    results = [r for _, r in sink.results]
    assert status.state == "running" and status.counts.errors == 0
    assert decoded > 3 * len(results), (decoded, len(results))  # the camera is far faster than the model
    assert dropped > 0 and dropped >= decoded - len(results) - 2  # each frame the model never saw is counted
    assert results[-1]["source"]["frames_dropped"] > results[0]["source"]["frames_dropped"]
    assert all(len(r["output"]["regions"]) == 1 for r in results)  # it still reads every frame it gets
    growth_mb = (peak - settled) / 2**20
    assert growth_mb < 30, growth_mb  # one frame in hand, whatever the backlog would have been
