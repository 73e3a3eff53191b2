"""Object filters in a running pipeline (issue 35's "filters drop a too-small object and keep the real
one"): a rendered clip with the astronaut's face at its size in the photo and a much smaller copy,
both found by the real YOLOv8n face detector; with `filters: {default: {min_area: ...}}` the small
one is gone from the results and from tracking, the pipeline's status counts the drop, and
`edge-agent status` says so; `edge-agent infer -c CFG --pipeline P` drops it too, and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.cli.render.status import console, render
from agent.config import (
    DetectionPostprocess,
    FiltersConfig,
    ModelRef,
    PipelineConfig,
    PreprocessConfig,
    ResizeConfig,
    TrackConfig,
    VideoSourceConfig,
)
from agent.pipeline import Pipeline
from agent.stage import LoadedModel
from agent.status import ChangeStatus, Origin, pipeline_status, statuses_json
from tests.media_fixtures import FACE_BOX, ListSink, astronaut_bgr
from tests.waits import wait_until

W, H, FRAMES = 320, 240, 6
MARGIN = 25  # around the photo's face box: the head, as the detector knows faces
SMALL = 48  # the small copy's side (the big one is the photo's own, 151 px)
BIG_AT, SMALL_AT = (10, 20), (W - SMALL - 20, 60)  # where each is pasted (x, y)
# The big face's box is ~94x92 px (0.11 of the frame), the small one's ~29x29 (0.011).
MIN_AREA = 0.03


@pytest.fixture(scope="module")
def two_faces_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FRAMES still frames: the head at its size in the photo on the left, a SMALL px copy on the right."""
    x1, y1, x2, y2 = FACE_BOX.astype(int)
    head = astronaut_bgr()[y1 - MARGIN : y2 + MARGIN, x1 - MARGIN : x2 + MARGIN]
    frame = np.full((H, W, 3), 90, np.uint8)
    (bx, by), (sx, sy) = BIG_AT, SMALL_AT
    frame[by : by + head.shape[0], bx : bx + head.shape[1]] = head
    frame[sy : sy + SMALL, sx : sx + SMALL] = cv2.resize(head, (SMALL, SMALL), interpolation=cv2.INTER_AREA)
    folder = tmp_path_factory.mktemp("filters")
    assert cv2.imwrite(str(folder / "two_faces.png"), frame)
    path = folder / "two_faces.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10, (W, H))
    assert writer.isOpened()
    for _ in range(FRAMES):
        writer.write(frame)
    writer.release()
    return path


def config(clip: Path, labels: list[str], filters: FiltersConfig | None) -> PipelineConfig:
    return PipelineConfig(
        name="faces",
        model=ModelRef(path=str(clip)),  # not read: the test hands the pipeline its loaded model
        source=VideoSourceConfig(type="video", uri=str(clip), realtime=False),  # every frame
        preprocess=PreprocessConfig(
            resize=ResizeConfig(width=320, height=320, mode="letterbox"), color="rgb", scale=1 / 255
        ),
        postprocess=DetectionPostprocess(type="detection", score_threshold=0.3, labels=labels),
        # The small face scores ~0.55: a track may start from 0.5.
        track=TrackConfig(high_score=0.5, new_track_score=0.5),
        filters=filters,
    )


def run_clip(pipeline: Pipeline, started: list[Pipeline]) -> None:
    started.append(pipeline)
    pipeline.start()
    wait_until(lambda: pipeline.finished, "the clip's end", timeout=60)
    pipeline.stop(timeout=30)


def faces(sink: ListSink) -> list[list[dict[str, Any]]]:
    """Each published frame's FACE_FEMALE detections."""
    return [[d for d in r["output"]["detections"] if d["label"] == "FACE_FEMALE"] for _, r in sink.results]


def new_tracks(sink: ListSink) -> list[list[float]]:
    return [e["object"]["box"] for _, e in sink.events if e["type"] == "new"]


def is_big(box: list[float]) -> bool:
    return box[0] < W / 2  # the big face is on the left, the small one on the right


def test_min_area_drops_the_small_face_keeps_the_big_one_and_status_counts_it(
    two_faces_clip: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], started: list[Pipeline]
) -> None:
    # Without filters the detector finds and tracks both faces: the small one is a real detection.
    plain = ListSink()
    run_clip(Pipeline(config(two_faces_clip, yolo_labels, None), yolo_loaded, plain), started)
    assert len(plain.results) == FRAMES
    assert all(sorted(is_big(d["box"]) for d in found) == [False, True] for found in faces(plain))
    assert sorted(is_big(box) for box in new_tracks(plain)) == [False, True]

    sink = ListSink()
    filters = FiltersConfig.model_validate({"default": {"min_area": MIN_AREA}})
    pipeline = Pipeline(config(two_faces_clip, yolo_labels, filters), yolo_loaded, sink)
    run_clip(pipeline, started)
    assert len(sink.results) == FRAMES
    assert all([is_big(d["box"]) for d in found] == [True] for found in faces(sink))
    assert [is_big(box) for box in new_tracks(sink)] == [True]  # tracking saw only the big one
    run = pipeline.status()
    shown = run.steps["filter"]
    assert shown["dropped"] == {"min_area": FRAMES}
    assert shown["by_label"] == {"FACE_FEMALE": {"min_area": FRAMES}}
    kept = sum(len(r["output"]["detections"]) for _, r in sink.results)
    assert shown["kept"] == kept >= FRAMES
    assert run.tracking is not None and run.tracking["started"] == 1

    # `edge-agent status` draws the daemon's status JSON: the filter's line is in it.
    change = ChangeStatus("running", None, "2026-01-01T00:00:00Z", Origin("yaml", None), 1, "faces@1")
    data = {"pipelines": statuses_json({"faces": pipeline_status(run, change)})}
    screen = console()
    with screen.capture() as captured:
        screen.print(render(data))
    lines = [line.strip() for line in captured.get().splitlines()]
    assert f"faces: filters kept {kept}, dropped {FRAMES}: min_area {FRAMES} (FACE_FEMALE)" in lines


def test_infer_with_the_pipeline_drops_what_its_filters_drop(
    two_faces_clip: Path, yolo_path: Path, yolo_labels: list[str], tmp_path: Path
) -> None:
    """`infer` runs the stage's preprocess, model and postprocess, not the pipeline's steps: the
    pipeline's filters apply to its output all the same, for one image and for --track."""
    faces = {
        "name": "faces",
        "model": {"path": str(yolo_path)},
        "source": {"type": "video", "uri": str(two_faces_clip)},
        "preprocess": {"resize": {"width": 320, "height": 320, "mode": "letterbox"}, "color": "rgb"},
        "postprocess": {"type": "detection", "score_threshold": 0.3, "labels": yolo_labels},
        "track": {"high_score": 0.5, "new_track_score": 0.5},
        "filters": {"default": {"min_area": MIN_AREA}},
    }
    config = tmp_path / "agent.yaml"
    agent = {"device": {"id": "box"}, "state_dir": str(tmp_path / "state"), "backends": {"benchmark": False}}
    config.write_text(json.dumps({**agent, "pipelines": [faces]}))  # JSON is YAML
    picture = two_faces_clip.with_suffix(".png")

    def infer(*args: str) -> dict[str, Any]:
        result = CliRunner().invoke(app, ["infer", str(yolo_path), *args, "-c", str(config), "--json"])
        assert result.exit_code == 0, (result.output, result.exception)
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    one = infer(str(picture), "--pipeline", "faces")
    assert [is_big(d["box"]) for d in one["output"]["detections"] if d["label"] == "FACE_FEMALE"] == [True]
    assert "filters kept 1, dropped 1: min_area 1 (FACE_FEMALE)" in one["note"]
    tracked = infer(str(two_faces_clip), "--pipeline", "faces", "--track")
    assert tracked["tracking"]["tracks"] == 1, tracked["tracking"]  # the small face never got one
    assert f"filters kept {FRAMES}, dropped {FRAMES}: min_area {FRAMES} (FACE_FEMALE)" in tracked["note"]
    # Without the pipeline (the model's own hints) nothing is filtered: both faces are there.
    bare = infer(str(picture))
    assert sorted(is_big(d["box"]) for d in bare["output"]["detections"] if d["label"] == "FACE_FEMALE") == [
        False,
        True,
    ]
    assert "filters" not in bare.get("note", "")


def test_a_new_stage_counts_on_from_the_pipelines_drops(
    two_faces_clip: Path, yolo_loaded: LoadedModel, yolo_labels: list[str]
) -> None:
    """The drops are the pipeline's, as the motion gate's counts are: a new model version or a changed
    config (a new stage, built by the pipeline between two frames) counts on from them."""
    from agent.processing import Geometry
    from agent.steps import FrameRecord

    filters = FiltersConfig.model_validate({"default": {"min_score": 0.5}})
    pipeline = Pipeline(config(two_faces_clip, yolo_labels, filters), yolo_loaded, ListSink())
    try:
        (first,) = [s for s in pipeline.stages.plan.steps["report"] if s.name == "filter"]
        record = FrameRecord(0, 0.0, None, False, None)
        record.geometry = Geometry(1, 1, 0, 0, W, W, W, W)
        record.output = {"detections": [{"label": "FACE_FEMALE", "score": 0.2, "box": [0, 0, 9, 9]}]}
        assert first.run(record)
        changed = filters.model_copy(update={"masks": []})
        stage = pipeline.stage.with_config(config(two_faces_clip, yolo_labels, changed))
        (then,) = [s for s in pipeline._plan_of(stage).steps["report"] if s.name == "filter"]
        assert then is not first
        assert (
            then.status()
            == first.status()
            == {
                "dropped": {"min_score": 1},
                "by_label": {"FACE_FEMALE": {"min_score": 1}},
                "kept": 0,
            }
        )
    finally:
        pipeline.source.stop()
