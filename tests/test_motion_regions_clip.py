"""Motion regions for real (`motion.regions: true`): the real YOLOv8n face detector (nudenet's 320n.onnx)
through real pipelines over a rendered 1280x720 clip with small moving faces (~36 px wide, on a
textured wall: scripts/bench_regions.py renders it and counts). Regions find (nearly) every face the
detector finds at full resolution, the usual 320x320 letterbox of the whole frame finds fewer; and the
steps on one frame: a crop per region, one batch or one run a crop alike, the whole frame where the
regions say so or no gate ran."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.pipeline import Pipeline
from agent.stage import LoadedModel, Stage
from agent.steps import FrameRecord, PipelineParts, Plan, plan_for
from providers import ModelArtifact, Session, get_backend
from tests.media_fixtures import SCRIPTS_DIR, ListSink, yolo_labels, yolo_path
from tests.waits import wait_until

__all__ = ["yolo_labels", "yolo_path"]  # fixtures used here


def bench() -> ModuleType:
    """scripts/bench_regions.py, imported as a module."""
    if str(SCRIPTS_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPTS_DIR))
    import bench_regions

    return bench_regions


@pytest.fixture(scope="module")
def session(yolo_path: Path) -> Session:
    loaded = get_backend("onnxruntime/CPUExecutionProvider").load(ModelArtifact(yolo_path, "onnx", "0" * 64))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    path = tmp_path_factory.mktemp("regions") / "faces.avi"
    return path, bench().render(path)


@pytest.fixture(scope="module")
def runs(clip: tuple[Path, list], session: Session, yolo_labels: list[str]) -> dict:
    """The clip through a pipeline each way (full resolution, letterbox, regions): what each found."""
    path, truth = clip
    return {way: bench().run(way, path, truth, session, yolo_labels) for way in bench().WAYS}


def test_regions_find_the_small_faces_the_full_resolution_detector_finds_the_letterbox_fewer(
    runs: dict,
) -> None:
    full, letterbox, regions = runs["full resolution"], runs["letterbox"], runs["regions"]
    summary = {way: f"{r.found}/{r.faces}" for way, r in runs.items()}
    assert full.found >= 0.9 * full.faces, summary  # the faces are there to be found
    assert regions.found >= 0.9 * full.found, summary
    assert letterbox.found < full.found, summary
    assert letterbox.found < regions.found, summary
    # Every frame reached a result, and the regions ran as crops (the status says how many).
    assert regions.frames == full.frames == bench().CLIP.frames
    shown = regions.steps["preprocess"]["regions"]
    assert shown["crops"] >= len(bench().FACES) * (bench().CLIP.frames - 1), shown
    assert shown["whole_frames"] == 1, shown  # the first frame: the gate had no background yet


def _frame(clip: tuple[Path, list], index: int) -> np.ndarray:
    capture = cv2.VideoCapture(str(clip[0]))
    try:
        for _ in range(index + 1):
            ok, frame = capture.read()
            assert ok
    finally:
        capture.release()
    return frame


def _plan(session: Session, clip: tuple[Path, list], labels: list[str], way: str = "regions") -> Plan:
    stage = Stage(bench().config(way, clip[0], labels), LoadedModel("nudenet", "3.4.2", "ab" * 32, session))
    sink = ListSink()
    return plan_for(stage, PipelineParts.new(way, sink, lambda: {"uri": "clip"}))


def _walk(plan: Plan, pixels: np.ndarray, areas: list | None) -> FrameRecord:
    """The steps from preprocess to postprocess on one frame, the gate's areas given by hand."""
    record = FrameRecord(1, 0.0, None, False, pixels, motion_areas=areas)
    steps = [s for s in plan.steps["prepare"] if s.name != "motion"] + plan.steps["inference"]
    for step in [*steps, plan.steps["report"][0]]:
        assert step.run(record)
    return record


def _faces(record: FrameRecord) -> list[list[float]]:
    assert record.output is not None
    return sorted(d["box"] for d in record.output["detections"] if d["label"].startswith("FACE"))


def test_one_batch_of_crops_and_one_run_a_crop_find_the_same_faces(
    session: Session, clip: tuple[Path, list], yolo_labels: list[str]
) -> None:
    truth = clip[1][5]
    areas = [tuple(round(v) for v in box) for box in truth.faces.values()]
    plan = _plan(session, clip, yolo_labels)
    infer = plan.steps["inference"][0]
    assert infer.batches()  # the model's batch axis is dynamic: the crops run as one batch
    pixels = _frame(clip, 5)
    batched = _walk(plan, pixels, areas)
    assert batched.crops is not None and len(batched.crops) == len(areas)
    assert all(crop.outputs is None and crop.feeds is None for crop in batched.crops)  # let go
    infer.batches = lambda: False
    one_by_one = _walk(plan, pixels, areas)
    assert len(_faces(batched)) == len(areas), batched.output
    assert np.allclose(_faces(batched), _faces(one_by_one), atol=0.5)
    # Each face in frame pixels where it is, whichever crop it came from.
    for box in truth.faces.values():
        assert any(bench()._iou(box, found) >= 0.5 for found in _faces(batched)), (box, batched.output)


def test_the_whole_frame_runs_as_before_without_areas_or_with_motion_all_over(
    session: Session, clip: tuple[Path, list], yolo_labels: list[str]
) -> None:
    plan = _plan(session, clip, yolo_labels)
    plain = _plan(session, clip, yolo_labels, way="letterbox")
    pixels = _frame(clip, 5)
    before = _walk(plain, pixels, None)
    for areas in (None, [(0, 0, 1280, 720)]):  # no gate ran; motion over more than half of the frame
        record = _walk(plan, pixels, areas)
        assert record.crops is None and record.geometry == before.geometry
        assert record.output == before.output


def test_regions_need_a_detection_model(clip: tuple[Path, list], yolo_labels: list[str]) -> None:
    config = bench().config("regions", clip[0], yolo_labels).model_dump()
    config["postprocess"] = {"type": "raw"}
    # The config refuses it, before any model loads (config validate says where: test_motion_gate_config.py).
    with pytest.raises(ValidationError, match=r"motion regions need postprocess type detection"):
        PipelineConfig.model_validate(config)


def test_a_face_that_stops_moving_is_still_looked_at_in_a_region_around_its_track(
    tmp_path: Path, session: Session, yolo_labels: list[str]
) -> None:
    """A face (55 px: sure in a crop, 14 px and lost in the letterbox) walks for 0.5 s, then stands for
    1 s. The background takes it in within a few frames (learning_rate 0.5): no motion then, but its
    track's box still gets a crop, so the face keeps being found and keeps its track."""
    walk = [(0.0, 600.0, 360.0), (0.5, 650.0, 360.0), (1.5, 650.0, 360.0)]
    clip = bench().tracking_video.Clip({"face": walk}, 1.5, 1280, 720, 10, face_scale=0.55)
    path = tmp_path / "stops.avi"
    truth = bench().tracking_video.render(path, clip, scene=bench().textured_scene())
    config = bench().config("regions", path, yolo_labels).model_dump(exclude_unset=True)
    config["motion"] = {"regions": True, "learning_rate": 0.5}
    config["track"] = {}
    sink = ListSink()
    pipeline = Pipeline(
        PipelineConfig.model_validate(config), LoadedModel("nudenet", "3.4.2", "ab" * 32, session), sink
    )
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, "the clip played", timeout=120, state=pipeline.status)
    finally:
        pipeline.stop(timeout=30)
    results = {fields["source"]["frame"]: fields for _, fields in sink.results}
    assert sorted(results) == list(range(1, clip.frames + 1))  # every frame went on: a track was alive
    for frame in truth[10:]:  # standing since frame 5, background by frame 10
        faces = [d for d in results[frame.index + 1]["output"]["detections"] if d["label"].startswith("FACE")]
        assert any(bench()._iou(frame.faces["face"], d["box"]) >= 0.5 for d in faces), (frame.index, faces)
        assert [d.get("track_id") for d in faces] == [1], faces
    shown = pipeline.status().steps
    assert shown["motion"]["motion"] is False  # the standing face is background now
    assert shown["preprocess"]["regions"]["crops"] >= len(truth) - 1
    letterbox = bench().run("letterbox", path, truth, session, yolo_labels)
    assert letterbox.found == 0, letterbox  # the whole frame would have lost it
