"""A second model's backend is chosen on its own reports (issue 36): the daemon's build (StageBuilder)
proves the attribute's model like the pipeline's own, judged by the attribute's postprocess, so a
classifier on a detector's objects is judged on its top-k classes, and a backend that gives it wrong
classes is refused there while the detector keeps the backend it proved for itself.

The wrong backend is real, not simulated: PP-OCR's direction classifier (from the rapidocr wheel)
with a float64 tail that passes its answer on where float64 is computed as such and swaps the two
classes where it is computed in float32. onnxruntime computes float64; OpenVINO's CPU plugin runs
float64 as float32 (as tests/test_select.py's opset-6 Add shows), so on OpenVINO every upright sign
reads upside down. The detector is the real YOLOv8n (nudenet's 320n.onnx) on a rendered clip of the
astronaut's face, which OpenVINO computes right (judged on its detections)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from agent.attribute_models import AttributeSet
from agent.config_loader import load_config
from agent.session_pool import SessionPool
from agent.stage import Stage
from agent.store import store_for
from agent.supervisor.building import StageBuilder
from agent.supervisor.state import RegistryLink
from providers import Decision
from tests import media_fixtures
from tests.face_clip import faces_pipeline, write_clip
from tests.media_fixtures import demo_video_module
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

ORT_CPU = "onnxruntime/CPUExecutionProvider"
PP_OCR_PIXELS = {"color": "bgr", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}  # ../shared/MODELS.md
# Few, short trials: the test checks which candidates are refused and why, not how fast they run.
QUICK = {"benchmark": True, "max_trials": 3, "runs": 2, "warmup": 1, "min_time_s": 0.0, "budget_s": 1.0,
         "rounds": 0, "spare_core": False}  # fmt: skip


def float32_flips_it(source: Path, target: Path) -> Path:
    """`source`'s classifier, its [N, 2] output passed on where 1 + p0 + 1e-9 - (1 + p0) > 0 (float64),
    swapped where that is 0 (float32 cannot hold 1e-9 beside 1)."""
    model = onnx.load(str(source))
    graph = model.graph
    out = graph.output[0].name
    raw = f"{out}/as_computed"
    for node in graph.node:
        node.output[:] = [raw if name == out else name for name in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], np.int64), "tail/first"),
            numpy_helper.from_array(np.array([1, 0], np.int64), "tail/swap"),
            numpy_helper.from_array(np.array(1.0, np.float64), "tail/one"),
            numpy_helper.from_array(np.array(1e-9, np.float64), "tail/tiny"),
            numpy_helper.from_array(np.array(0.0, np.float64), "tail/zero"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Cast", [raw], ["tail/p64"], to=TensorProto.DOUBLE),
            helper.make_node("Gather", ["tail/p64", "tail/first"], ["tail/p0"], axis=1),
            helper.make_node("Add", ["tail/p0", "tail/one"], ["tail/r"]),
            helper.make_node("Add", ["tail/r", "tail/tiny"], ["tail/up"]),
            helper.make_node("Sub", ["tail/up", "tail/r"], ["tail/kept"]),
            helper.make_node("Greater", ["tail/kept", "tail/zero"], ["tail/float64"]),
            helper.make_node("Gather", [raw, "tail/swap"], ["tail/swapped"], axis=1),
            helper.make_node("Where", ["tail/float64", raw, "tail/swapped"], [out]),
        ]
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target


class Progress:
    """A build's progress, heard and dropped (no supervisor here)."""

    def check(self) -> None:
        pass

    def phase(self, phase: str, step: str) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def download(self, what: str, done: int, total: int, rate: float) -> None:
        pass


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, yolo_path: Path, yolo_labels: list[str]
) -> Iterator[Stage]:
    """The faces pipeline with a direction attribute, built as the daemon builds it (trials and all)."""
    tmp = tmp_path_factory.mktemp("selection")
    classifier = float32_flips_it(rapidocr_models_dir() / CLS_MODEL_FILE, tmp / "direction.onnx")
    clip = write_clip(tmp / "faces.mp4")
    pipeline: dict[str, Any] = faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip)})
    pipeline["attributes"] = [
        {
            "name": "direction",
            "model": {"path": str(classifier)},
            "preprocess": {"resize": {"width": 192, "height": 48}, **PP_OCR_PIXELS},
            "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
        }
    ]
    path = tmp / "agent.yaml"
    settings = {
        "device": {"id": "door-box"},
        "state_dir": str(tmp / "state"),
        "mqtt": {"host": "127.0.0.1", "port": 1},
        "backends": QUICK,
        "pipelines": [pipeline],
    }
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    config = load_config(path)
    builder = StageBuilder(store_for(config), SessionPool(), RegistryLink(None, lambda: None), lambda: config)
    stage = builder.build(config.pipelines[0], Progress(), peek=None)
    try:
        yield stage
    finally:
        stage.close()


def openvino_reports(decision: Decision) -> dict[str, tuple[str, str]]:
    """OpenVINO's candidates that ran a trial: backend -> (verdict, reason)."""
    return {
        c.backend: (c.verdict, c.reason)
        for c in decision.candidates
        if c.backend.startswith("openvino/") and c.median_ms is not None
    }


def test_the_second_model_s_wrong_backend_is_refused_on_its_top_classes(built: Stage) -> None:
    assert isinstance(built.attributes, AttributeSet) and built.attributes.problems == {}
    [model] = built.attributes.models
    decision = model.model.decision
    assert decision is not None and decision.checked and decision.judged_on == "top-k", decision
    assert decision.backend == ORT_CPU and decision.reference == ORT_CPU, decision.explain()
    tried = openvino_reports(decision)
    assert "openvino/CPU" in tried, decision.explain()
    for backend, (verdict, reason) in tried.items():
        assert verdict == "rejected", (backend, verdict, reason)
        # Its classes, not its tensors: the top class is the other one.
        assert reason in (
            "reports other classes than the reference (top 1: 180; the reference: 0)",
            "reports other classes than the reference (top 1: 0; the reference: 180)",
        ), (backend, reason)
    explained = decision.explain()
    assert "openvino/CPU on direction.onnx: rejected (" in explained, explained
    assert "reports other classes than the reference (top 1: " in explained, explained
    # What serves reads a real upside-down sign as upside down.
    sign = demo_video_module().render_sign("Gate B open", True, np.random.default_rng(3))
    [answer] = model.read([sign])
    assert answer["top"][0]["label"] == "180", answer
    shown = built.attributes.status()["direction"]
    assert shown["backend"] == ORT_CPU and "reports other classes than the reference" in shown["why"], shown


def test_the_detector_keeps_its_own_choice(built: Stage) -> None:
    decision = built.model.decision
    assert decision is not None and decision.checked and decision.judged_on == "detections", decision
    tried = openvino_reports(decision)
    assert "openvino/CPU" in tried, decision.explain()
    # OpenVINO computes the detector right: passed (or chosen), not marked wrong by the classifier's trials.
    assert all(verdict in ("passed", "chosen") for verdict, _ in tried.values()), tried
    attribute = built.attributes.models[0].model.decision  # type: ignore[union-attr]
    assert attribute is not None and attribute.artifact_sha256 != decision.artifact_sha256
