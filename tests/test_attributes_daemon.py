"""A second model that cannot be had costs only its own answers (issue 36): a running agent (`edge-agent
run`, a real mosquitto on loopback, a FileRegistry holding the real PP-OCR text detector as the
pipeline's model) whose pipeline names two attributes it cannot load, one a registry version that
does not exist, one a file that is no model. The detector serves on: results and tracking events
flow; `edge-agent status --json` says why each attribute is missing under
`steps.attributes.<name>.error`, and the log says it once per attribute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from agent.registry import FileRegistry, PublishOptions
from tests.agent_process import StartAgent, cli_step_status
from tests.mosquitto import Mosquitto, Received, Subscriber
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.waits import wait_until

DEVICE, PIPELINE = "dock-box", "dock"
W, H, FRAMES = 320, 192, 20
PP_OCR_PIXELS = {"color": "bgr", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}  # ../shared/MODELS.md


def sign_clip(path: Path) -> Path:
    """A white plate reading "GATE 42" sliding right over grey, 20 frames (the agent loops it)."""
    (width, height), base = cv2.getTextSize("GATE 42", cv2.FONT_HERSHEY_SIMPLEX, 0.9, 2)
    plate = np.full((height + base + 16, width + 16, 3), 255, np.uint8)
    cv2.putText(plate, "GATE 42", (8, height + 8), cv2.FONT_HERSHEY_SIMPLEX, 0.9, (0, 0, 0), 2)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10, (W, H))
    assert writer.isOpened()
    for i in range(FRAMES):
        frame = np.full((H, W, 3), 120, np.uint8)
        x = 10 + 5 * i
        frame[70 : 70 + plate.shape[0], x : x + plate.shape[1]] = plate
        writer.write(frame)
    writer.release()
    return path


def write_config(tmp_path: Path, broker: Mosquitto, registry: Path) -> Path:
    not_a_model = tmp_path / "reader.onnx"
    not_a_model.write_bytes(b"these are not the weights you are looking for\n" * 20)
    pipeline: dict[str, Any] = {
        "name": PIPELINE,
        "model": {"name": "pp-ocr-det", "version": "4"},
        "source": {"type": "video", "uri": str(sign_clip(tmp_path / "dock.avi")), "fps": 10, "loop": True},
        "preprocess": {"resize": {"width": W, "height": H, "mode": "letterbox", "pad": 255}, **PP_OCR_PIXELS},
        "postprocess": {"type": "regions", "unclip_ratio": 1.5},
        "attributes": [
            {
                "name": "direction",
                "model": {"name": "pp-ocr-cls", "version": "9.9"},  # the registry has no such version
                "preprocess": {"resize": {"width": 192, "height": 48}, **PP_OCR_PIXELS},
                "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
            },
            {
                "name": "text",
                "model": {"path": str(not_a_model)},
                "preprocess": {"resize": {"width": 320, "height": 48}, **PP_OCR_PIXELS},
                "postprocess": {"type": "ctc", "characters": ["G", "A", "T", "E"]},
            },
        ],
    }
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": broker.host, "port": broker.port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [pipeline],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def payloads(messages: list[Received], kind: str) -> list[dict[str, Any]]:
    topic = f"edge/{DEVICE}/{kind}/{PIPELINE}"
    return [json.loads(m.payload) for m in messages if m.topic == topic and m.payload]


def attributes_shown(config: Path) -> dict[str, Any] | None:
    return cli_step_status(config, PIPELINE, "attributes")


def test_the_detector_serves_on_when_its_second_models_cannot_load(
    tmp_path: Path, mosquitto: Mosquitto, start_agent: StartAgent
) -> None:
    registry = tmp_path / "registry"
    det = rapidocr_models_dir() / "ch_PP-OCRv4_det_infer.onnx"
    FileRegistry(registry).publish(det, "pp-ocr-det", "4", PublishOptions())
    cls = rapidocr_models_dir() / CLS_MODEL_FILE
    FileRegistry(registry).publish(cls, "pp-ocr-cls", "2.0", PublishOptions())  # not the 9.9 asked for
    config = write_config(tmp_path, mosquitto, registry)
    subscriber = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/#")
    try:
        agent = start_agent(config)
        got = subscriber.wait_until(
            lambda got: (
                bool(payloads(got, "results")) and any(e["type"] == "new" for e in payloads(got, "events"))
            ),
            timeout=120,
        )
        new = next(e for e in payloads(got, "events") if e["type"] == "new")
        assert new["object"]["attributes"] == {}, new  # nothing read: no second model serves

        wait_until(
            lambda: attributes_shown(config) is not None, "steps.attributes in status --json", timeout=60
        )
        shown = attributes_shown(config)
        assert shown is not None and set(shown) == {"direction", "text"}, shown
        direction, text = shown["direction"]["error"], shown["text"]["error"]
        assert direction.startswith("pp-ocr-cls@9.9 cannot serve: "), direction
        assert "version '9.9' not found" in direction and "versions available: 2.0" in direction, direction
        assert text.startswith("reader@local cannot serve: model file "), text  # named by its file
        assert "reader.onnx is not a valid ONNX model" in text, text
        assert set(shown["direction"]) == {"error"} and set(shown["text"]) == {"error"}, shown

        log = agent.stop()
        for name, why in (("direction", direction), ("text", text)):
            said = [
                line for line in log.splitlines() if f"attribute {name}: " in line and "cannot serve" in line
            ]
            assert len(said) == 1, said
            assert why.split(": ", 1)[0] in said[0], (said, why)
    finally:
        subscriber.close()
