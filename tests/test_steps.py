"""The per-frame path as steps (agent/steps/): the builder's list for each kind of pipeline, a step's
counters and its name on a failure, and the example step (`report.tags`) end to end through the real
result writer and outbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import PipelineConfig
from agent.config_loader import load_config
from agent.errors import ConfigError
from agent.mqtt import Outbox
from agent.pipeline import Pipeline
from agent.results import ResultWriter
from agent.sources import Frame
from agent.stage import LoadedModel, Stage
from agent.steps import FrameRecord, PipelineParts, plan_for
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import CLS_LABELS, ListSink, cls_artifact, sign_folder
from tests.waits import wait_until


@pytest.fixture(scope="module")
def loaded(cls_model_path: Path) -> LoadedModel:
    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    return LoadedModel(name="pp-ocr-cls", version="2.0", sha256="ab" * 32, session=session)


def config(folder: Path, **extra: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "signs",
            "model": {"name": "pp-ocr-cls", "version": "2.0"},
            "source": {"type": "video", "uri": str(folder), "fps": None, "realtime": False},
            "preprocess": {"resize": {"width": 192, "height": 48}, "mean": [0.5] * 3, "std": [0.5] * 3},
            "postprocess": {"type": "classification", "softmax": False, "labels": CLS_LABELS},
            **extra,
        }
    )


def names(stage: Stage) -> dict[str, list[str]]:
    plan = plan_for(stage, PipelineParts.new("signs", ListSink(), lambda: {"uri": "x"}))
    return {thread: [step.name for step in steps] for thread, steps in plan.steps.items()}


def test_the_builder_lists_each_pipelines_steps_in_order_by_thread(
    tmp_path: Path, loaded: LoadedModel
) -> None:
    plain = Stage(config(tmp_path), loaded)
    assert names(plain) == {
        "prepare": ["preprocess"],
        "inference": ["inference"],
        "report": ["postprocess", "live_view", "report rules", "report"],
    }
    tagged = Stage(config(tmp_path, report={"tags": {"site": "shop-3"}}), loaded)
    assert names(tagged)["report"] == ["postprocess", "live_view", "report rules", "tags", "report"]
    # (Not closed: the last stage on a model closes its session, which the module's tests share.)


def test_tags_ride_on_every_published_result_and_only_there(tmp_path: Path, loaded: LoadedModel) -> None:
    sign_folder(tmp_path / "frames", 4)
    outbox = Outbox(tmp_path / "outbox.sqlite")
    writer = ResultWriter("box-1", "edge", 262_144, outbox, lambda: None)
    tags = {"site": "shop-3", "door": "front"}
    pipeline = Pipeline(config(tmp_path / "frames", report={"tags": tags}), loaded, writer)
    pipeline.start()
    assert wait_until(lambda: pipeline.finished, "the folder played", timeout=60)
    pipeline.stop(timeout=30)
    messages = [json.loads(m.payload) for m in outbox.peek(100)]
    outbox.close()
    assert [m["source"]["frame"] for m in messages] == [1, 2, 3, 4]
    assert all(m["tags"] == tags for m in messages)
    assert all(list(m)[-1] == "tags" for m in messages)  # after held_back: the other fields as before
    # The steps counted their frames; the tag step ran on each published result.
    plan = pipeline.stages.plan
    counts = {step.name: step.stats.to_dict()["runs"] for steps in plan.steps.values() for step in steps}
    assert counts == {
        "preprocess": 4,
        "inference": 4,
        "postprocess": 4,
        "live_view": 4,
        "report rules": 4,
        "tags": 4,
        "report": 4,
    }


def test_without_tags_a_result_has_no_tags_field(tmp_path: Path, loaded: LoadedModel) -> None:
    sink = ListSink()
    sign_folder(tmp_path / "frames", 2)
    pipeline = Pipeline(config(tmp_path / "frames"), loaded, sink)
    pipeline.start()
    assert wait_until(lambda: pipeline.finished, "the folder played", timeout=60)
    pipeline.stop(timeout=30)
    assert sink.count() == 2 and all("tags" not in r for _, r in sink.results)


@pytest.mark.parametrize(
    ("tags", "problem"),
    [
        ({"site name": "x"}, "report.tags.site name"),  # a space: not a key a consumer can use anywhere
        ({"site": "x" * 201}, "report.tags.site"),
        ({f"t{i}": "x" for i in range(21)}, "report.tags"),
        ({"site": 3}, "report.tags.site"),
    ],
)
def test_bad_tags_are_refused_with_their_place(tmp_path: Path, tags: dict[str, Any], problem: str) -> None:
    text = f"""
device: {{id: box-1}}
state_dir: {tmp_path}
pipelines:
  - name: signs
    model: {{path: /m.onnx}}
    source: {{type: video, uri: /v.mp4}}
    report:
      tags: {json.dumps(tags)}
"""
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert problem in str(caught.value) and "agent.yaml:9" in str(caught.value), str(caught.value)


def test_a_record_carries_the_frames_pixels_until_they_are_let_go(tmp_path: Path) -> None:
    frame = Frame(np.zeros((4, 4, 3), np.uint8), index=7, captured_at=1.5, position_s=0.2)
    record = FrameRecord.of(frame)
    assert record.pixels is frame.data and (record.index, record.captured_at, record.position_s) == (
        7,
        1.5,
        0.2,
    )
