"""`edge-agent explain PIPELINE` lists every model of a pipeline with `attributes:` (issue 36): the primary,
then each second model with its reference, backend and why, from where the truth is.

- No daemon: where the next start would run each (the PP-OCR chain from the rapidocr wheel, by file), and
  a registry model not in the store said as such, not a failure of the whole command.
- A running agent (`edge-agent run`, a real mosquitto on loopback, the detector from a FileRegistry, the
  direction classifier by file, a "recognizer" file that is no model): the classifier as the daemon's
  status shows it serving, with the decision its build recorded; the broken one with the daemon's
  reason. Once the agent stopped and the pipeline left the config: the records the builds left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from agent.registry import FileRegistry, PublishOptions
from tests.agent_process import StartAgent
from tests.mosquitto import Mosquitto
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.test_attributes_daemon import PP_OCR_PIXELS, sign_clip
from tests.test_infer_attributes import signs_pipeline
from tests.waits import wait_until

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
DET = "ch_PP-OCRv4_det_infer.onnx"


def explain(config: Path, name: str, *extra: str) -> Any:
    from agent.cli import app

    return CliRunner().invoke(app, ["explain", name, "-c", str(config), *extra], env=ENV)


def test_without_a_daemon_each_model_of_the_chain_is_listed_where_it_would_run(tmp_path: Path) -> None:
    pipeline = signs_pipeline(tmp_path / "clip.avi")
    plate = {
        "name": "plate",
        "model": {"name": "plate-reader", "version": "3"},
        "postprocess": {"type": "ctc"},
    }
    pipeline["attributes"].append(plate)
    config = tmp_path / "agent.yaml"
    settings = {"device": {"id": "ocr-box"}, "state_dir": str(tmp_path / "state")}
    settings["registry"] = {"url": f"file://{tmp_path / 'registry'}"}
    config.write_text(yaml.safe_dump({**settings, "pipelines": [pipeline]}, sort_keys=False))

    done = explain(config, "signs", "--json")
    assert done.exit_code == 0, done.output
    records = json.loads(done.stdout)
    assert [(r["pipeline"], r.get("attribute")) for r in records] == [
        ("signs", None),
        ("signs", "direction"),
        ("signs", "text"),
        ("signs", "plate"),
    ]
    models = rapidocr_models_dir()
    for record, file in zip(records[:3], [DET, CLS_MODEL_FILE, "ch_PP-OCRv4_rec_infer.onnx"], strict=True):
        assert record["model"] == str(models / file), record
        assert record["prospective"] is True and record["serving"]["artifact"] == file, record
        assert record["decision"]["backend"] == record["serving"]["backend"]
    assert "plate-reader@3" in records[3]["error"] and "store" in records[3]["error"], records[3]

    text = explain(config, "signs")
    assert text.exit_code == 0, text.output
    out = " ".join(text.stdout.split())  # (rich wraps long lines)
    assert f"signs attribute direction ({models / CLS_MODEL_FILE}): would serve first on" in out
    assert "signs attribute plate (plate-reader@3): not to be had here" in out


def live_config(tmp_path: Path, broker: Mosquitto, registry: Path, name: str = "dock") -> Path:
    not_a_model = tmp_path / "reader.onnx"
    not_a_model.write_bytes(b"these are not the weights you are looking for\n" * 20)
    pipeline: dict[str, Any] = {
        "name": name,
        "model": {"name": "pp-ocr-det", "version": "4"},
        "source": {"type": "video", "uri": str(sign_clip(tmp_path / "dock.avi")), "fps": 10, "loop": True},
        "preprocess": {
            "resize": {"width": 320, "height": 192, "mode": "letterbox", "pad": 255},
            **PP_OCR_PIXELS,
        },
        "postprocess": {"type": "regions", "unclip_ratio": 1.5},
        "attributes": [
            {
                "name": "direction",
                "model": {"path": str(rapidocr_models_dir() / CLS_MODEL_FILE)},
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
        "device": {"id": "dock-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": broker.host, "port": broker.port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [pipeline],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_running_agent_says_where_each_second_model_serves_and_why_one_is_left_out(
    tmp_path: Path, mosquitto: Mosquitto, start_agent: StartAgent
) -> None:
    registry = tmp_path / "registry"
    FileRegistry(registry).publish(rapidocr_models_dir() / DET, "pp-ocr-det", "4", PublishOptions())
    config = live_config(tmp_path, mosquitto, registry)
    agent = start_agent(config)
    seen: dict[str, Any] = {}

    def answered() -> bool:
        done = explain(config, "dock", "--json")
        seen["records"] = json.loads(done.stdout) if done.exit_code == 0 else done.output
        return isinstance(seen["records"], list) and bool(seen["records"]) and seen["records"][0].get("live")

    wait_until(answered, "explain from the running agent", timeout=120, state=lambda: seen)
    primary, direction, text = seen["records"]
    assert (primary["pipeline"], primary["model"]) == ("dock", "pp-ocr-det@4")
    assert (direction["attribute"], direction["live"]) == ("direction", True), direction
    assert direction["model"] == "ch_ppocr_mobile_v2.0_cls_infer@local"
    assert direction["serving"]["backend"] and direction["serving"]["why"], direction
    # The decision the build recorded for it names the backend the daemon says serves it.
    assert direction["decision"]["backend"] == direction["serving"]["backend"], direction
    assert text["attribute"] == "text" and "reader.onnx is not a valid ONNX model" in text["error"], text

    shown = explain(config, "dock")
    out = " ".join(shown.stdout.split())
    assert "dock attribute direction (ch_ppocr_mobile_v2.0_cls_infer@local): serving now on" in out, out
    reader = tmp_path / "reader.onnx"
    assert f"dock attribute text ({reader}): left out, the pipeline serves without it" in out, out
    agent.stop()

    # The agent stopped and the pipeline left the config: the decisions its builds recorded.
    other = live_config(tmp_path, mosquitto, registry, name="yard")
    later = explain(other, "dock", "--json")
    assert later.exit_code == 0, later.output
    records = json.loads(later.stdout)
    assert [(r["pipeline"], r.get("attribute")) for r in records] == [("dock", None), ("dock", "direction")]
    assert records[1]["decision"]["backend"] == direction["serving"]["backend"]
