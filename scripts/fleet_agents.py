"""A fleet of real agents on one box, for the fleet tests and benchmarks: a file registry with model
versions that succeed and fail in each way a fleet update can, agent configs, and N `edge-agent run`
processes with their own state dirs.

Versions of the model `text-direction` (the real PP-OCR text direction classifier, from the
rapidocr wheel; NAN_LIVE is built here):
  GOOD, NEWER     the classifier (the same bytes under two versions)
  BAD_TESTDATA    the classifier with test data whose expected outputs it never gives: refused on
                  every box (published as by a publisher whose own validation let it through)
  NAN_LIVE        log(min(x)): right on its test data (all ones), NaN or -inf on any real frame, so
                  it passes validation and fails the health window on live frames
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnx
import psutil
import yaml
from onnx import TensorProto, helper

from agent.registry import PublishOptions, file_registry
from agent.registry.file_registry import FileRegistry

MODEL = "text-direction"
GOOD, NEWER, BAD_TESTDATA, NAN_LIVE, MISSING = "1.0", "2.0", "3.0", "4.0", "9.9"
LABELS = ["upright", "upside-down"]
INPUT_SHAPE = (1, 3, 48, 192)
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"
EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")


def cls_model_path() -> Path:
    """The text direction classifier in the rapidocr wheel (located without importing it)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("rapidocr-onnxruntime is not installed; it provides the real model")
    return (
        Path(next(iter(spec.submodule_search_locations))) / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    )


def nan_on_live_frames_model(path: Path) -> Path:
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


def publish_fleet_versions(root: Path, cls_model: Path | None = None) -> Path:
    """A file registry at `root` with GOOD, NEWER, BAD_TESTDATA and NAN_LIVE (module docstring)."""
    cls_model = cls_model or cls_model_path()
    registry = FileRegistry(root)
    registry.publish(cls_model, MODEL, GOOD)
    registry.publish(cls_model, MODEL, NEWER)
    work = root.parent / "fleet-models"
    work.mkdir(parents=True, exist_ok=True)
    ones = np.ones(INPUT_SHAPE, np.float32)
    never_given: dict[str, Any] = {"x": ones, f"expected:{CLS_OUTPUT}": np.array([[7.0, -7.0]], np.float32)}
    np.savez(work / "wrong-expected.npz", **never_given)
    log_of_one: dict[str, Any] = {"x": ones, "expected:y": np.zeros((1, 2), np.float32)}
    np.savez(work / "nan-testdata.npz", **log_of_one)
    nan_model = nan_on_live_frames_model(work / "nan-on-live.onnx")
    registry.publish(nan_model, MODEL, NAN_LIVE, PublishOptions(testdata=[work / "nan-testdata.npz"]))
    # As published by someone whose own box let it through: every device must refuse it.
    with mock.patch.object(file_registry, "_require_a_correct_candidate", lambda *args: None):
        registry.publish(
            cls_model, MODEL, BAD_TESTDATA, PublishOptions(testdata=[work / "wrong-expected.npz"])
        )
    return root


def pipeline_body(version: str, video: Path, fps: float = 5.0) -> dict[str, Any]:
    """The `cam` pipeline on `video`, as desired state carries it (the name is the key)."""
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
    root: Path,
    device: str,
    port: int,
    registry: Path,
    pipelines: dict[str, dict[str, Any]] | None = None,
    groups: tuple[str, ...] = ("lobby",),
    registry_settings: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """`root/<device>/agent.yaml` (state in `root/<device>/state`); returns its path."""
    config: dict[str, Any] = {
        "device": {"id": device, "groups": list(groups)},
        "state_dir": str(root / device / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}", **(registry_settings or {})},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "telemetry": {"interval_s": 0},
        "pipelines": [{"name": name, **body} for name, body in (pipelines or {}).items()],
        **extra,
    }
    path = root / device / "agent.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class AgentFleet:
    """N `edge-agent run` processes, each with its own config, state dir and log file."""

    def __init__(self, configs: dict[str, Path], env: dict[str, str] | None = None) -> None:
        self.configs = configs
        self.env = {**os.environ, **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, device: str) -> None:
        config = self.configs[device]
        with (config.parent / "agent.log").open("ab") as log:
            self.procs[device] = subprocess.Popen(
                [EDGE_AGENT, "run", "-c", str(config)], stdout=log, stderr=subprocess.STDOUT, env=self.env
            )

    def start_all(self) -> None:
        for device in self.configs:
            self.start(device)

    def stop(self, device: str, timeout: float = 60.0) -> int:
        """SIGTERM (as systemd stops it); the exit status."""
        proc = self.procs.pop(device)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def stop_all(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return {device: self.stop(device) for device in list(self.procs)}

    def alive(self) -> list[str]:
        return [device for device, proc in self.procs.items() if proc.poll() is None]

    def log(self, device: str) -> str:
        return (self.configs[device].parent / "agent.log").read_text(errors="replace")

    def memory(self) -> dict[str, dict[str, int]]:
        """Each running agent's memory: `rss` (resident, shared libraries counted in full) and `pss`
        (shared pages divided among the processes sharing them: what the fleet costs the box)."""
        sizes = {}
        for device, proc in self.procs.items():
            with contextlib.suppress(psutil.Error):
                info = psutil.Process(proc.pid).memory_full_info()
                sizes[device] = {"rss": info.rss, "pss": getattr(info, "pss", info.rss)}
        return sizes

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()
