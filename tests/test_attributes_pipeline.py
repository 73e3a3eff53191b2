"""Attributes in a running pipeline (agent/steps/attributes.py): the real PP-OCR text detector finds two
signs moving across a line, one of them upside down; its real direction classifier (a second model, on
its own thread) reads each sign once, and the answer rides on the objects' events: the `update` that
brings it, the crossing, the end. A second model that fails costs only its answers: the detector's
pipeline runs on and its status says why."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.attribute_models import AttributeModel, AttributeSet, Job
from agent.config import (
    AttributeConfig,
    LineConfig,
    ModelRef,
    PipelineConfig,
    PreprocessConfig,
    RegionsPostprocess,
    ResizeConfig,
    VideoSourceConfig,
)
from agent.pipeline import Pipeline
from agent.stage import LoadedModel, Stage
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import FlakySession, ListSink, cls_artifact
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.waits import wait_until

W, H, FPS, FRAMES = 640, 360, 10, 40
PP_OCR_PIXELS = {"color": "bgr", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}  # ../shared/MODELS.md
MIDDLE = LineConfig(name="middle", points=[(0.5, 0.0), (0.5, 1.0)], **{"in": "east"}, out="west")


def plate(text: str) -> np.ndarray:
    """Black text on a white plate."""
    (width, height), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 1.2, 2)
    image = np.full((height + base + 20, width + 20, 3), 255, np.uint8)
    cv2.putText(image, text, (10, height + 10), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2)
    return image


@pytest.fixture(scope="module")
def two_signs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ "Hello World" upright at the top and "GATE 42" upside down below it, both moving right across
    the middle at 8 px a frame. (Short, symmetric text such as "EXIT 7" fools the direction
    classifier: it is trained on lines of text.)"""
    path = tmp_path_factory.mktemp("attributes") / "signs.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (W, H))
    assert writer.isOpened()
    upright, upside_down = plate("Hello World"), cv2.rotate(plate("GATE 42"), cv2.ROTATE_180)
    for i in range(FRAMES):
        frame = np.full((H, W, 3), 120, np.uint8)
        x = 20 + 8 * i
        frame[60 : 60 + upright.shape[0], x : x + upright.shape[1]] = upright
        frame[220 : 220 + upside_down.shape[0], x : x + upside_down.shape[1]] = upside_down
        writer.write(frame)
    writer.release()
    return path


DIRECTION = AttributeConfig(
    name="direction",
    model=ModelRef(name="pp-ocr-cls", version="2.0"),  # not pulled: the test hands the stage its models
    crop={"padding": 0.2},
    preprocess=PreprocessConfig(resize=ResizeConfig(width=192, height=48, mode="height"), **PP_OCR_PIXELS),
    postprocess={"type": "classification", "softmax": False, "labels": ["0", "180"]},
)


def config(clip: Path, **changes: Any) -> PipelineConfig:
    fields: dict[str, Any] = {
        "name": "signs",
        "model": ModelRef(name="pp-ocr-det", version="4"),
        "source": VideoSourceConfig(type="video", uri=str(clip)),
        "preprocess": PreprocessConfig(
            resize=ResizeConfig(width=640, height=352, mode="letterbox"), **PP_OCR_PIXELS
        ),
        "postprocess": RegionsPostprocess(type="regions", unclip_ratio=1.5),
        "lines": [MIDDLE],
        "attributes": [DIRECTION],
        **changes,
    }
    return PipelineConfig(**fields)


def session(file: str) -> Any:
    return OnnxRuntimeBackend().load(cls_artifact(rapidocr_models_dir() / file))


def run_clip(config: PipelineConfig, models: AttributeSet, started: list[Pipeline]) -> tuple[ListSink, Any]:
    detector = LoadedModel("pp-ocr-det", "4", "", session("ch_PP-OCRv4_det_infer.onnx"))
    sink = ListSink()
    stage = Stage(config, detector, attributes=models)
    pipeline = Pipeline(config, stage, sink)
    started.append(pipeline)
    pipeline.start()
    wait_until(lambda: pipeline.finished, "the clip's end", timeout=120)
    status = pipeline.status()
    pipeline.stop(timeout=30)
    stage.close()  # (its owner closes a stage: the supervisor, in the daemon) and so its second models
    return sink, status


def second_model(inner: Any) -> AttributeSet:
    loaded = LoadedModel("pp-ocr-cls", "2.0", "", inner)
    loaded.acquire()
    return AttributeSet("signs", [AttributeModel.of(DIRECTION, loaded)])


def test_each_sign_is_read_once_and_its_direction_rides_on_its_events(
    two_signs: Path, started: list[Pipeline]
) -> None:
    sink, status = run_clip(config(two_signs), second_model(session(CLS_MODEL_FILE)), started)
    events = [e for _, e in sink.events]
    news = {e["object"]["id"]: e["object"]["box"] for e in events if e["type"] == "new"}
    assert len(news) == 2
    top, bottom = sorted(news, key=lambda i: news[i][1])  # the upright sign is the upper one
    # The reading arrives as the object's update, then every later event carries it.
    read = [e for e in events if e["type"] == "update" and e["changed"] == ["attributes"]]
    assert sorted(e["object"]["id"] for e in read) == sorted([top, bottom])
    for kind in ("cross", "end"):
        found = {
            e["object"]["id"]: e["object"]["attributes"]["direction"] for e in events if e["type"] == kind
        }
        assert found[top]["value"] == "0" and found[bottom]["value"] == "180", (kind, found)
        assert found[top]["runs"] == 1 and found[bottom]["runs"] == 1
    assert [e["direction"] for e in events if e["type"] == "cross"] == ["east", "east"]
    shown = status.steps["attributes"]["direction"]
    assert shown["answered"] == 2 and shown["tracks"] == 2 and shown["reads_per_track"] == 1.0
    assert shown["failures"] == 0 and shown["backend"].startswith("onnxruntime")
    # Each frame's result names what was read on its tracked boxes by then.
    read_boxes = [d for _, r in sink.results for d in r["output"]["regions"] if "attributes" in d]
    assert read_boxes and {d["attributes"]["direction"]["value"] for d in read_boxes} == {"0", "180"}
    # The detector ran on all along (a busy box drops some of the clip's frames at the source).
    assert status.counts.inferences >= FRAMES // 2


def test_a_failing_second_model_costs_only_its_answers(two_signs: Path, started: list[Pipeline]) -> None:
    broken = FlakySession(session(CLS_MODEL_FILE), every=1, message="the NPU went away")
    sink, status = run_clip(config(two_signs), second_model(broken), started)
    events = [e for _, e in sink.events]
    assert [e["type"] for e in events if e["type"] in ("new", "cross")].count("cross") == 2
    assert all(e["object"].get("attributes", {}) == {} for e in events)
    shown = status.steps["attributes"]["direction"]
    assert shown["failures"] >= 1 and "the NPU went away" in shown["last_error"]
    assert shown["answered"] == 0 and shown["failed"] >= 2
    assert broken.calls >= 2 and status.counts.inferences >= FRAMES // 2 and status.counts.errors == 0


def thread_nice(thread: threading.Thread) -> int:
    """The nice value of `thread` (from /proc, by its native id: another test's reader for a
    pipeline of the same name may still be alive in this process, with the same thread name)."""
    stat = (Path("/proc/self/task") / str(thread.native_id) / "stat").read_text()
    # Field 19 of stat is the nice value; the command name (field 2) may hold spaces: after ')'.
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_the_reader_thread_runs_below_the_detectors_priority() -> None:
    models = second_model(session(CLS_MODEL_FILE))
    delivered: list[Any] = []
    crop = cv2.rotate(plate("GATE 42"), cv2.ROTATE_180)
    job = Job(7, crop, (0.0, 0.0, float(crop.shape[1]), float(crop.shape[0])), [0], {}, 0.0)
    try:
        assert models.submit(job, delivered.extend)
        wait_until(lambda: delivered, "the reading", timeout=30)
        assert delivered[0].value == "180"
        process_nice = os.getpriority(os.PRIO_PROCESS, 0)
        reader = models._thread  # the reader thread, named for its pipeline
        assert reader is not None and reader.name == "attributes-signs"
        assert thread_nice(reader) == min(process_nice + 10, 19)
    finally:
        models.release()
    assert not reader.is_alive()  # the last stage gone: the reader stopped
