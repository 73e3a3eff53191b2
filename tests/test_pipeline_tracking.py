"""Tracking in a running pipeline (agent/pipeline.py `_track`): a real video of a real face the real
YOLOv8n detector finds, moving across a line; the tracks survive a stage swap that changes the zones,
per-frame results can be off while events go, and a stop ends the open tracks saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import (
    DetectionPostprocess,
    FiltersConfig,
    LineConfig,
    ModelRef,
    PipelineConfig,
    PreprocessConfig,
    ReportConfig,
    ResizeConfig,
    TrackConfig,
    VideoSourceConfig,
    ZoneConfig,
)
from agent.pipeline import Pipeline
from agent.stage import LoadedModel, Stage, changes_only_reporting
from providers import BackendError
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import FACE_BOX, ListSink, astronaut_bgr, cls_artifact
from tests.waits import wait_until

W, H, FPS, FRAMES = 640, 360, 10, 40
FACE = 130  # the face crop's side in the video


def face_crop() -> np.ndarray:
    x1, y1, x2, y2 = FACE_BOX.astype(int)
    margin = 25
    crop = astronaut_bgr()[max(0, y1 - margin) : y2 + margin, max(0, x1 - margin) : x2 + margin]
    return cv2.resize(crop, (FACE, FACE))


@pytest.fixture(scope="module")
def crossing_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A face moving from left to right across the frame's middle at 10 px a frame (x 40 -> 430)."""
    path = tmp_path_factory.mktemp("tracking") / "crossing.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (W, H))
    assert writer.isOpened()
    face = face_crop()
    for i in range(FRAMES):
        frame = np.full((H, W, 3), 90, np.uint8)
        x = 40 + 10 * i
        frame[110 : 110 + FACE, x : x + FACE] = face
        writer.write(frame)
    writer.release()
    return path


# A vertical line in the middle, drawn top to bottom: moving right (east) is `in`.
MIDDLE = LineConfig(name="middle", points=[(0.5, 0.0), (0.5, 1.0)], **{"in": "east"}, out="west")
RIGHT = ZoneConfig(name="right", points=[(0.6, 0.0), (1.0, 0.0), (1.0, 1.0), (0.6, 1.0)], anchor="center")


def config(clip: Path, labels: list[str], loop: bool = False, **changes: Any) -> PipelineConfig:
    fields: dict[str, Any] = {
        "name": "faces",
        "model": ModelRef(path=str(clip)),  # not read: the test hands the pipeline its loaded model
        "source": VideoSourceConfig(type="video", uri=str(clip), loop=loop),
        "preprocess": PreprocessConfig(
            resize=ResizeConfig(width=320, height=320, mode="letterbox"), color="rgb", scale=1 / 255
        ),
        "postprocess": DetectionPostprocess(type="detection", score_threshold=0.1, labels=labels),
        "lines": [MIDDLE],
        "track": TrackConfig(),
        **changes,
    }
    return PipelineConfig(**fields)


def kinds(sink: ListSink) -> list[tuple[str, str]]:
    return [(e["type"], e.get("direction") or e.get("zone") or e.get("reason") or "") for _, e in sink.events]


def test_a_face_crossing_the_line_is_one_track_with_one_crossing_and_results_carry_its_id(
    crossing_clip: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], started: list[Pipeline]
) -> None:
    sink = ListSink()
    pipeline = Pipeline(config(crossing_clip, yolo_labels), yolo_loaded, sink)
    started.append(pipeline)
    pipeline.start()
    wait_until(lambda: pipeline.finished, "the clip's end", timeout=120)
    pipeline.stop(timeout=30)
    assert kinds(sink) == [("new", ""), ("cross", "east"), ("update", ""), ("end", "stopped")]
    ids = {e["object"]["id"] for _, e in sink.events if "object" in e}
    assert ids == {1}
    faces = [d for _, r in sink.results for d in r["output"]["detections"] if d["label"] == "FACE_FEMALE"]
    assert len(faces) >= FRAMES - 2 and {d["track_id"] for d in faces[2:]} == {1}
    status = pipeline.status().tracking
    assert status["lines"] == {"middle": {"east": 1, "west": 0}} and status["started"] == 1


def test_a_stage_swap_that_adds_a_zone_keeps_the_track_and_results_can_be_off(
    crossing_clip: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], started: list[Pipeline]
) -> None:
    sink = ListSink()
    quiet = ReportConfig(results=False)
    pipeline = Pipeline(config(crossing_clip, yolo_labels, loop=True, report=quiet), yolo_loaded, sink)
    started.append(pipeline)
    pipeline.start()
    wait_until(lambda: any(e["type"] == "new" for _, e in sink.events), "the face's track", timeout=120)
    with_zone = Stage(config(crossing_clip, yolo_labels, loop=True, report=quiet, zones=[RIGHT]), yolo_loaded)
    assert pipeline.stages.swap_in(with_zone, timeout=60)
    wait_until(
        lambda: any(e["type"] == "enter" for _, e in sink.events),
        "the face entering the new zone",
        timeout=120,
    )
    pipeline.stop(timeout=30)
    assert sink.results == []  # report.results: false
    news = [e for _, e in sink.events if e["type"] == "new"]
    enter = next(e for _, e in sink.events if e["type"] == "enter")
    # The face that entered the new zone is a track from before the swap (the clip loops: a jump back
    # to the left makes a new track, which may also be the one entering, but never a second `new` for
    # the same id).
    assert len({e["object"]["id"] for e in news}) == len(news)
    assert enter["zone"] == "right" and enter["object"]["id"] in {e["object"]["id"] for e in news}
    ends = [e for _, e in sink.events if e["type"] == "end"]
    assert ends and ends[-1]["reason"] == "stopped"
    ended = {e["object"]["id"] for e in ends}
    assert ended == {e["object"]["id"] for e in news}  # every track ends, once


def test_a_reporting_only_change_shares_the_session_which_closes_with_its_last_stage(
    crossing_clip: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    session = OnnxRuntimeBackend().load(cls_artifact(yolo_path))
    model = LoadedModel(name="faces", version="1", sha256="ef" * 32, session=session)
    before = config(crossing_clip, yolo_labels)
    filters = FiltersConfig.model_validate({"default": {"min_area": 0.01}})
    after = config(
        crossing_clip,
        yolo_labels,
        zones=[RIGHT],
        report=ReportConfig(results=False),
        filters=filters,
        motion={"threshold": 40},
    )
    assert changes_only_reporting(before, after)  # filters and the gate need no new session either
    other_model = config(crossing_clip, yolo_labels, model=ModelRef(name="faces", version="2"))
    other_post = config(crossing_clip, yolo_labels, postprocess=DetectionPostprocess(type="detection"))
    assert not changes_only_reporting(before, other_model) and not changes_only_reporting(before, other_post)

    old = Stage(before, model)
    new = old.with_config(after)
    assert new.model is old.model and new.config is after
    frame = np.full((H, W, 3), 90, np.uint8)
    old.close()  # committed: the previous stage goes, the session stays for the new one
    old.close()  # closing twice is once
    assert new.run_frame(frame).output["detections"] == []
    new.close()
    with pytest.raises(BackendError):  # the last stage closed the session: nothing runs on it any more
        new.run_frame(frame)
