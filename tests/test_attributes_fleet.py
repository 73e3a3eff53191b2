"""Second models from the fleet (issue 36): a desired-state document names every model of a pipeline's
chain; a new version of the second model alone is pulled, proven and swapped in between two frames
while the primary model serves on (its session is not loaded again), and a version of the second
model that fails rolls back on its own health window, the primary untouched. The real daemon, a real
broker, a file registry with the real PP-OCR models."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.registry.file_registry import FileRegistry
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import Reported, agent_config, document, pipeline_in, publish
from tests.media_fixtures import silero
from tests.mosquitto import Mosquitto
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.test_attributes_pipeline import PP_OCR_PIXELS, two_signs  # noqa: F401  (the clip fixture)
from tests.waits import wait_until

DEVICE = "sign-box"
DETECTOR = "ch_PP-OCRv4_det_infer.onnx"


def signs_pipeline(clip: Path, direction_version: str) -> dict[str, Any]:
    return {
        "model": {"name": "pp-ocr-det", "version": "4"},
        "source": {"type": "video", "uri": str(clip), "fps": 10, "loop": True},
        "preprocess": {"resize": {"width": 640, "height": 352, "mode": "letterbox"}, **PP_OCR_PIXELS},
        "postprocess": {"type": "regions", "unclip_ratio": 1.5},
        "report": {"results": False},
        "attributes": [
            {
                "name": "direction",
                "model": {"name": "pp-ocr-cls", "version": direction_version},
                "crop": {"padding": 0.2},
                "preprocess": {"resize": {"width": 192, "height": 48, "mode": "height"}, **PP_OCR_PIXELS},
                "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
                "when": {"interval_s": 0.5},  # read often: a window sees the second model at work
            }
        ],
    }


def second_model(state_dir: Path) -> dict[str, Any]:
    pipeline = read_status(state_dir).get("pipelines", {}).get("signs", {})
    return dict((pipeline.get("steps") or {}).get("attributes", {}).get("direction") or {})


@pytest.mark.slow
def test_a_second_models_version_swaps_in_and_a_bad_one_rolls_back_without_touching_the_primary(
    tmp_path: Path,
    mosquitto: Mosquitto,
    two_signs: Path,  # noqa: F811  (the imported fixture)
    start_agent: StartAgent,
) -> None:
    models = rapidocr_models_dir()
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(models / DETECTOR, "pp-ocr-det", "4")
    registry.publish(models / CLS_MODEL_FILE, "pp-ocr-cls", "1")
    registry.publish(models / CLS_MODEL_FILE, "pp-ocr-cls", "2")
    # Version 3 is no image classifier at all (a voice detector): it cannot read crops.
    vad = tmp_path / "vad.onnx"
    shutil.copy(silero("silero_vad_16k_op15.onnx"), vad)
    registry.publish(vad, "pp-ocr-cls", "3")

    body = signs_pipeline(two_signs, "1")
    config = agent_config(tmp_path, DEVICE, mosquitto.port, tmp_path / "registry", {"signs": body})
    state_dir = tmp_path / DEVICE / "state"
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    try:
        wait_until(
            lambda: second_model(state_dir).get("answered", 0) >= 2,
            "the first version of the second model reading the signs",
            timeout=120,
            state=lambda: agent.log()[-2000:],
        )
        assert second_model(state_dir)["model"] == "pp-ocr-cls@1"

        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(f"device:{DEVICE}", 1, {"signs": signs_pipeline(two_signs, "2")}),
        )
        wait_until(
            lambda: "now running pp-ocr-det@4 (direction: pp-ocr-cls@2)" in agent.log(),
            "version 2 of the second model committed (its health window passed)",
            timeout=120,
            state=lambda: agent.log()[-2000:],
        )
        assert second_model(state_dir)["model"] == "pp-ocr-cls@2"
        # The primary model was loaded once: the second model's change never touched it.
        assert agent.log().count(f"loading {DETECTOR}") == 1

        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(f"device:{DEVICE}", 2, {"signs": signs_pipeline(two_signs, "3")}),
        )
        state = reported.wait(
            lambda r: pipeline_in(r, "signs").get("phase") == "rolled-back",
            "version 3 of the second model rolled back",
        )
        note = str(pipeline_in(state, "signs"))
        assert "attribute direction" in note and "is an image" in note, note
        wait_until(
            lambda: second_model(state_dir).get("model") == "pp-ocr-cls@2",
            "version 2 of the second model serving again",
            timeout=60,
            state=lambda: f"{second_model(state_dir)}\n{agent.log()[-3000:]}",
        )
        assert agent.log().count(f"loading {DETECTOR}") == 1
        inferences = read_status(state_dir)["pipelines"]["signs"]["inferences"]
        wait_until(
            lambda: read_status(state_dir)["pipelines"]["signs"]["inferences"] > inferences + 3,
            "the primary model running on after the rollback",
            timeout=60,
        )
    finally:
        reported.close()
