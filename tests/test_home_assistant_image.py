"""The Home Assistant image is the frame its result is about, on a live stream faster than the model.

A 30 fps video (each frame's number drawn into its pixels as a row of black and white blocks, the
astronaut's face walking across) runs through the real YOLOv8n detector at 640x640 (slower than the
33 ms between frames, so the source drops frames and the pipeline's three threads are each on a
different frame), the real result writer and outbox, and the real HomeAutomation publishing images.

The image used to be taken from the pipeline's newest frame when a result was reported: by then the
inference thread was on the next frame, so the image was skipped (its frame did not match) in nearly
every result. Now the frame's pixels travel with its record to the result: every image due is made,
from its own frame, and the face's box is drawn on the face in that frame.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import AgentConfig
from agent.home_automation import HomeAutomation
from agent.mqtt import Outbox
from agent.pipeline import Pipeline
from agent.results import ResultWriter
from agent.stage import LoadedModel
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import astronaut_bgr, cls_artifact
from tests.waits import wait_until

FPS, WIDTH, HEIGHT, FRAMES = 30, 640, 480, 600  # 20 s
BITS, BLOCK, CODE_Y = 10, 24, 440  # the frame number: 10 blocks of 24 px along the bottom
FACE = (60, 40, 240, 220)  # the crop of the photo around the face (x1, y1, x2, y2): 180 px
FACE_TOP = 120
IMAGE_TOPIC = "edge/box-1/state/yard/image"
IMAGES = 6  # images to see: one a second at most (image_interval_s: 1)


def face_left(index: int) -> int:
    return 20 + (index * 2) % (WIDTH - 240)  # 2 px a frame: a box from another frame is off


def code_blocks(index: int) -> list[tuple[int, int, int]]:
    """(x, y, grey) of each block coding `index`, most significant bit first."""
    return [(16 + i * 2 * BLOCK, CODE_Y, 255 if index >> (BITS - 1 - i) & 1 else 0) for i in range(BITS)]


def read_code(image: np.ndarray) -> int:
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    value = 0
    for x, y, _ in code_blocks(0):
        centre = grey[y + 6 : y + BLOCK - 6, x + 6 : x + BLOCK - 6]
        value = value << 1 | int(centre.mean() > 128)
    return value


def render(index: int) -> np.ndarray:
    """Frame `index` of the video: the face at its place, the frame's number at the bottom."""
    x1, y1, x2, y2 = FACE
    face = astronaut_bgr()[y1:y2, x1:x2]
    frame = np.full((HEIGHT, WIDTH, 3), 90, np.uint8)
    left = face_left(index)
    frame[FACE_TOP : FACE_TOP + face.shape[0], left : left + face.shape[1]] = face
    for x, y, grey in code_blocks(index):
        frame[y : y + BLOCK, x : x + BLOCK] = grey
    return frame


@pytest.fixture(scope="module")
def numbered_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "numbered.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    assert writer.isOpened()
    try:
        for index in range(FRAMES):
            writer.write(render(index))
    finally:
        writer.release()
    return path


class Images:
    """The MQTT connection's publish side, as HomeAutomation sees it: keeps the images it is given."""

    connected = True

    def __init__(self) -> None:
        self.images: list[np.ndarray] = []

    def publish_snapshot(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> bool:
        if topic == IMAGE_TOPIC:
            self.images.append(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR))
        return True

    def stats(self) -> dict[str, Any]:
        return {"connects": 1}


class Router:
    def route(self, topic_filter: str, handler: Any, qos: int = 1) -> Any:
        return lambda: None


def test_each_image_is_its_results_own_frame_at_30_fps_with_a_slower_model(
    tmp_path: Path, numbered_video: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    config = AgentConfig.model_validate(
        {
            "device": {"id": "box-1"},
            "state_dir": str(tmp_path / "state"),
            "state_topics": {"enabled": True},
            "pipelines": [
                {
                    "name": "yard",
                    "model": {"path": str(yolo_path)},
                    "source": {"type": "video", "uri": str(numbered_video), "loop": False},  # at 30 fps
                    "preprocess": {
                        "resize": {"width": 640, "height": 640, "mode": "letterbox"},
                        "color": "rgb",
                    },
                    "postprocess": {"type": "detection", "score_threshold": 0.25, "labels": yolo_labels},
                    "home_automation": {"image": True, "image_interval_s": 1},
                }
            ],
        }
    )
    (tmp_path / "state").mkdir()
    pipeline_config = config.pipelines[0]
    link = Images()
    running: list[Pipeline] = []
    home = HomeAutomation(config, link, wanted=lambda: config.pipelines, running=lambda: running)
    home.start(Router())
    outbox = Outbox(tmp_path / "outbox.sqlite")
    writer = ResultWriter("box-1", "edge", 1_000_000, outbox, lambda: None, observer=home.observe)
    session = OnnxRuntimeBackend().load(cls_artifact(yolo_path))
    pipeline = Pipeline(pipeline_config, LoadedModel("faces", "1", "0" * 64, session), writer)
    running.append(pipeline)
    pipeline.warm_up()
    home.tick()
    pipeline.start()
    started = time.monotonic()

    def ticked_images() -> int:
        home.tick()
        return len(link.images)

    try:
        # (The video lasts 20 s: the old code had made an image or two by its end.)
        wait_until(
            lambda: ticked_images() >= IMAGES or pipeline.finished, "images", timeout=90, interval=0.05
        )
    finally:
        pipeline.request_stop()
        pipeline.stop(timeout=30)
    elapsed = time.monotonic() - started
    status = pipeline.status()
    results = [json.loads(m.payload) for m in outbox.peek(10_000) if m.stream == "results/yard"]
    outbox.close()
    # The condition of the test holds: the model is slower than the source, which drops frames.
    assert status.source.frames_dropped > 0 and status.counts.latency.inference.p50 > 1000 / FPS
    # Every image is the frame of a published result (its own number in its pixels), with that
    # frame's box on the face: drawn where the face is in that frame, not where it is in another.
    by_frame = {r["source"]["frame"] - 1: r for r in results}  # (the source counts from 1)
    for image in link.images:
        number = read_code(image)
        assert number in by_frame, (number, sorted(by_frame)[:20])
        faces = [d for d in by_frame[number]["output"]["detections"] if d["label"] == "FACE_FEMALE"]
        assert len(faces) == 1, by_frame[number]["output"]
        x1, y1, x2, y2 = (round(v) for v in faces[0]["box"])
        face_x = face_left(number) + (173 - FACE[0])  # the photo's face box starts 113 px into the crop
        assert abs(x1 - face_x) < 20, (number, x1, face_x)
        # The image is that frame with that result's box drawn on it: along the box's left edge it
        # differs from the frame; inside the box, away from the lines and the label, it is the frame.
        diff = np.abs(image.astype(int) - render(number).astype(int)).sum(axis=2)
        assert diff[y1 + 10 : y2 - 10, x1].mean() > 100, (number, diff[y1 + 10 : y2 - 10, x1].mean())
        assert diff[y1 + 25 : y2 - 10, x1 + 10 : x2 - 10].mean() < 30, number
    # Each image was due once a second: they came at that pace (the old code made about one in 122
    # results' frames match, a few images a minute at this rate).
    assert len(link.images) >= IMAGES and elapsed < IMAGES * 3, (len(link.images), elapsed, len(results))
