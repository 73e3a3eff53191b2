"""What the fleet tests share: a registry with versions that succeed and fail in each way a fleet
update can, desired-state documents, and reading an agent's reported state off the broker."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
import yaml
from onnx import TensorProto, helper
from paho.mqtt.enums import CallbackAPIVersion

from agent.fleet import protocol
from agent.registry import file_registry
from agent.registry.file_registry import FileRegistry
from tests.mosquitto import Mosquitto, Subscriber

MODEL = "text-direction"
GOOD, NEWER, BAD_TESTDATA, NAN_LIVE, MISSING = "1.0", "2.0", "3.0", "4.0", "9.9"
LABELS = ["upright", "upside-down"]
INPUT_SHAPE = (1, 3, 48, 192)


def nan_on_live_frames_model(path: Path) -> Path:
    """Gives log(min(x)) for both classes: finite on its test data (all ones), NaN or -inf on any real
    frame (dark pixels normalise to <= 0). Passes validation, fails the health window."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    nodes = [
        helper.make_node("ReduceMin", ["x"], ["m"], keepdims=0),
        helper.make_node("Reshape", ["m", "shape"], ["m2"]),
        helper.make_node("Log", ["m2"], ["l"]),
        helper.make_node("Concat", ["l", "l"], ["y"], axis=1),
    ]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 1])
    graph = helper.make_graph(nodes, "nan_on_live", [x], [y], initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def publish_fleet_versions(root: Path, cls_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """GOOD and NEWER (the real text direction classifier), BAD_TESTDATA (its test data expects
    outputs the model never gives) and NAN_LIVE (right on its test data, NaN on real frames)."""
    registry = FileRegistry(root)
    registry.publish(cls_model_path, MODEL, GOOD)
    registry.publish(cls_model_path, MODEL, NEWER)
    work = root.parent / "fleet-models"
    work.mkdir(exist_ok=True)
    ones = np.ones(INPUT_SHAPE, np.float32)
    wrong = work / "wrong-expected.npz"
    np.savez(
        wrong, x=ones, **{"expected:save_infer_model/scale_0.tmp_1": np.array([[7.0, -7.0]], np.float32)}
    )
    nan_model = nan_on_live_frames_model(work / "nan-on-live.onnx")
    right = work / "nan-testdata.npz"
    np.savez(right, x=ones, **{"expected:y": np.zeros((1, 2), np.float32)})
    registry.publish(nan_model, MODEL, NAN_LIVE, testdata=[right])
    # A publisher whose own box passed it (validation there is skipped here): this box must refuse it.
    monkeypatch.setattr(file_registry, "_require_a_correct_candidate", lambda *args: None)
    registry.publish(cls_model_path, MODEL, BAD_TESTDATA, testdata=[wrong])
    monkeypatch.undo()
    return root


def pipeline_body(version: str, video: Path, fps: float = 5.0) -> dict[str, Any]:
    """A pipeline as desired state carries it (the name is the key)."""
    return {
        "model": {"name": MODEL, "version": version},
        "source": {"type": "video", "uri": str(video), "fps": fps, "loop": True},
        "preprocess": {
            "resize": {"width": 192, "height": 48},
            "color": "bgr",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
        },
        "postprocess": {"type": "classification", "softmax": False, "top_k": 2, "labels": LABELS},
    }


def agent_config(
    tmp_path: Path,
    device: str,
    port: int,
    registry: Path,
    pipelines: dict[str, dict[str, Any]] | None = None,
    groups: tuple[str, ...] = ("lobby",),
    registry_settings: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    config: dict[str, Any] = {
        "device": {"id": device, "groups": list(groups)},
        "state_dir": str(tmp_path / device / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}", **(registry_settings or {})},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "telemetry": {"interval_s": 0},
        "pipelines": [{"name": name, **body} for name, body in (pipelines or {}).items()],
        **extra,
    }
    path = tmp_path / device / "agent.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def document(
    target: str, generation: int, pipelines: dict[str, Any], window_s: float = 3.0, **extra: Any
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "target": target,
        "generation": generation,
        "pipelines": pipelines,
        "health": {"window_s": window_s, "min_frames": 2},
        **extra,
    }


def publish(broker: Mosquitto, topic: str, payload: bytes | dict[str, Any], retain: bool = True) -> None:
    """Publish as the controller does (QoS 1, retained), waiting for the broker's PUBACK."""
    data = protocol.encode(payload) if isinstance(payload, dict) else payload
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-controller-{time.monotonic_ns()}",
                         protocol=mqtt.MQTTv5)  # fmt: skip
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        client.publish(topic, data, qos=1, retain=retain).wait_for_publish(timeout=10)
    finally:
        client.disconnect()
        client.loop_stop()


class Reported:
    """An agent's retained reported state, as the controller sees it."""

    def __init__(self, broker: Mosquitto, device: str, prefix: str = "edge") -> None:
        self.subscriber = Subscriber(broker.host, broker.port, f"{prefix}/{device}/reported")

    def latest(self) -> dict[str, Any]:
        messages = self.subscriber.messages
        return json.loads(messages[-1].payload) if messages else {}

    def wait(self, predicate: Any, what: str, timeout: float = 120.0, since: float = 0.0) -> dict[str, Any]:
        """Wait until the latest reported state satisfies `predicate`; `since` (time.time()): only a
        report made after it counts (a retained one from an earlier run does not)."""

        def holds(messages: list[Any]) -> bool:
            if not messages:
                return False
            state = json.loads(messages[-1].payload)
            made = datetime.fromisoformat(state["updated_at"].replace("Z", "+00:00")).timestamp()
            return made >= since and bool(predicate(state))

        try:
            self.subscriber.wait_until(holds, timeout)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {what}; reported: {self.latest()}") from None
        return self.latest()

    def close(self) -> None:
        self.subscriber.close()


def pipeline_in(reported: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(reported.get("pipelines", {}).get(name) or {})


def refusals(reported: dict[str, Any]) -> list[dict[str, Any]]:
    return list(reported.get("refused", []))
