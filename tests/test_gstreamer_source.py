"""GStreamer pipeline strings as cameras, for real: gst-launch-1.0 (Debian's gstreamer1.0-tools) runs
the pipeline written as for OpenCV (`... ! appsink`), and the source reads its frames. Real inputs:
videotestsrc's exact colours, a real H.264 video decoded by GStreamer (compared with OpenCV's own
decode), and a real photo frozen into a live stream, on which the trained YOLOv8n finds the face
through the whole pipeline. Bad pipelines are named, stalls and ends reopened, the fps cap applied
inside GStreamer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import PipelineConfig, VideoSourceConfig
from agent.errors import EdgeAgentError
from agent.pipeline import LoadedModel, Pipeline
from agent.sources import Frame, LatestFrameSlot, VideoSource
from agent.sources.gstreamer import gst_launch_argv
from providers import ModelArtifact, get_backend
from tests.media_fixtures import FACE_BOX, ListSink, astronaut_bgr, iou
from tests.waits import wait_until

LIVE_TEST_CARD = "videotestsrc is-live=true ! video/x-raw,width=160,height=120,framerate=30/1"


def _camera(uri: str, **settings: Any) -> tuple[VideoSource, LatestFrameSlot]:
    config = VideoSourceConfig.model_validate(
        {"type": "video", "uri": uri, "reopen_min_s": 0.1, "reopen_max_s": 0.5, **settings}
    )
    slot = LatestFrameSlot()
    return VideoSource(config, "csi", slot), slot


def _next_frame(slot: LatestFrameSlot, timeout: float = 15.0) -> Frame:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = slot.get(timeout=0.2)
        if frame is not None:
            return frame
    raise AssertionError(f"no frame within {timeout} s")


def test_an_opencv_style_pipeline_gives_exact_bgr_frames(sources: list[VideoSource]) -> None:
    # RGB (0x20, 0x80, 0xc0) in, as videotestsrc paints it: BGR (0xc0, 0x80, 0x20) out, every pixel.
    source, slot = _camera(
        "gst:videotestsrc is-live=true pattern=solid-color foreground-color=0xff2080c0 "
        "! video/x-raw,format=RGB,width=64,height=48,framerate=30/1 ! appsink drop=true max-buffers=1"
    )
    sources.append(source)
    source.start()
    frame = _next_frame(slot)
    assert frame.data.shape == (48, 64, 3) and frame.data.dtype == np.uint8
    assert (frame.data == np.array([0xC0, 0x80, 0x20], np.uint8)).all()
    stats = source.stats()
    assert source.kind == "gstreamer" and stats["state"] == "streaming" and stats["error"] is None
    assert abs(frame.captured_at - time.time()) < 5 and frame.position_s is None  # live: wall-clock stamps


def test_a_real_video_decoded_by_gstreamer_matches_opencvs_decode(
    short_video: tuple[Path, list[dict[str, object]]], sources: list[VideoSource]
) -> None:
    path, _ = short_video
    capture = cv2.VideoCapture(str(path))
    ok, reference = capture.read()
    capture.release()
    assert ok
    # Not live: gst-launch decodes as fast as it can and the source keeps the newest frame, so each
    # run ends after the first two frames (the video's first sign lasts five).
    source, slot = _camera(f"gst:filesrc location={path} ! decodebin ! videoconvert ! identity eos-after=2")
    sources.append(source)
    source.start()
    frame = _next_frame(slot)
    assert frame.data.shape == reference.shape
    # Two decoders and two YUV->RGB conversions: close, not bit-equal.
    assert float(np.abs(frame.data.astype(np.int16) - reference.astype(np.int16)).mean()) < 4.0


def test_the_detector_finds_the_face_in_a_photo_streamed_through_gstreamer(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), astronaut_bgr())
    config = PipelineConfig.model_validate(
        {
            "name": "csi",
            "model": {"name": "nudenet", "version": "3.4.2"},
            "source": {
                "type": "video",
                "uri": f"gst:filesrc location={photo} ! pngdec ! imagefreeze is-live=true "
                "! video/x-raw,framerate=10/1 ! videoconvert ! video/x-raw,format=BGR ! appsink",
                "fps": 5,
            },
            "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
            "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": yolo_labels},
        }
    )
    session = get_backend("onnxruntime/CPUExecutionProvider").load(ModelArtifact(yolo_path, "onnx", "0" * 64))
    sink = ListSink()
    pipeline = Pipeline(config, LoadedModel("nudenet", "3.4.2", "ab" * 32, session), sink)
    pipeline.start()
    try:
        assert wait_until(lambda: sink.count() >= 3, "results", timeout=30, state=pipeline.status)
    finally:
        pipeline.stop(timeout=5)
        session.close()
    for _, result in sink.results[:3]:
        faces = [d for d in result["output"]["detections"] if d["label"] == "FACE_FEMALE"]
        assert faces and iou(np.array(faces[0]["box"]), FACE_BOX) >= 0.8, result["output"]


def test_the_fps_cap_drops_frames_inside_gstreamer(sources: list[VideoSource]) -> None:
    source, slot = _camera(f"gst:{LIVE_TEST_CARD} ! appsink", fps=5)
    sources.append(source)
    source.start()
    _next_frame(slot)
    decoded = source.stats()["frames_decoded"]
    time.sleep(2.0)
    per_second = (source.stats()["frames_decoded"] - decoded) / 2.0
    assert 3 <= per_second <= 7, per_second  # 5 of the camera's 30 reach Python
    assert "videorate" in gst_launch_argv(source.config.uri, 5)


def test_bad_pipelines_are_named_and_retried(sources: list[VideoSource]) -> None:
    source, _ = _camera("gst:nvarguscamerasrc sensor-id=0 ! nvvidconv ! appsink")  # no Jetson here
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.stats()["reconnects"] >= 2, "retries", timeout=15)
    error = str(source.stats()["error"])
    assert source.state == "retrying"
    assert error.startswith("GStreamer pipeline gave no frame: gst-launch-1.0 exited with status 1")
    assert 'no element "nvarguscamerasrc"' in error

    with pytest.raises(EdgeAgentError, match="GStreamer pipeline 'videotestsrc ! \"video': No closing"):
        gst_launch_argv('gst:videotestsrc ! "video')
    with pytest.raises(EdgeAgentError, match="GStreamer pipeline is empty"):
        gst_launch_argv("gst: ! appsink")


def test_a_pipeline_that_ends_or_stalls_is_reopened(
    sources: list[VideoSource], caplog: pytest.LogCaptureFixture
) -> None:
    ends, ends_slot = _camera(f"gst:{LIVE_TEST_CARD} ! identity eos-after=10")  # 10 frames, then the end
    # One frame at once, then none for 60 s: a camera that hangs without closing.
    stalls, _ = _camera("gst:videotestsrc is-live=true ! video/x-raw,width=32,height=24,framerate=1/60")
    sources.extend([ends, stalls])
    ends.start()
    stalls.start()
    assert wait_until(lambda: ends.stats()["outages"] >= 2, "reopened after the end", timeout=20)
    assert _next_frame(ends_slot).data.shape == (120, 160, 3)
    assert wait_until(lambda: stalls.stats()["outages"] >= 1, "reopened after the stall", timeout=20)
    assert stalls.stats()["frames_decoded"] >= 2  # the first frame of each run
    assert "stopped delivering frames: gst-launch-1.0 sent nothing for 5 s" in caplog.text
    assert "stopped delivering frames: gst-launch-1.0 ended" in caplog.text


def test_without_gst_launch_the_error_says_what_to_install(
    sources: list[VideoSource], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no gst-launch-1.0 on it
    source, _ = _camera(f"gst:{LIVE_TEST_CARD} ! appsink")
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.stats()["reconnects"] >= 1, timeout=10)
    assert str(source.stats()["error"]).startswith(
        "GStreamer pipeline gave no frame: gst-launch-1.0 is not installed "
        "(apt-get install gstreamer1.0-tools"
    )
