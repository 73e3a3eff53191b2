"""Fixtures for the model registry and store: a real ONNX model and a file:// registry holding it; the
config of an agent whose registry is an HTTP server (tests/test_offline.py, tests/test_reload_retry.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agent.registry import FileRegistry, Manifest, PublishOptions
from tests.media_fixtures import CLS_PREPROCESS
from tests.waits import free_port

CLS_MODEL_FILE = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
CLS_NAME = "pp-ocr-cls"
CLS_VERSION = "2.0"


def rapidocr_models_dir() -> Path:
    """rapidocr_onnxruntime's bundled models, located without importing the package."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("rapidocr-onnxruntime is not installed; it provides the real ONNX models these tests use")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


@pytest.fixture(scope="session")
def cls_model_path() -> Path:
    """The real PP-OCR text direction classifier (ONNX, ~570 KiB) shipped in the rapidocr wheel."""
    path = rapidocr_models_dir() / CLS_MODEL_FILE
    if not path.is_file():
        pytest.fail(f"real test model {path} is missing; reinstall rapidocr-onnxruntime==1.4.4")
    return path


@pytest.fixture
def file_registry(tmp_path: Path, cls_model_path: Path) -> FileRegistry:
    """A file:// registry under tmp_path with the cls model published as pp-ocr-cls@2.0."""
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(metadata={"labels": ["0", "180"]}))
    return registry


@pytest.fixture
def cls_manifest(file_registry: FileRegistry) -> Manifest:
    return file_registry.get_manifest(CLS_NAME, CLS_VERSION)


def http_registry_config(tmp_path: Path, port: int, video: Path | None = None) -> Path:
    """An agent whose registry is http://127.0.0.1:PORT (no retries), with two pipelines on the cls
    model: `installed` on CLS_VERSION and `missing` on 2.1; MQTT on a port nothing listens on."""

    def pipeline(name: str, version: str) -> dict[str, object]:
        return {
            "name": name,
            "model": {"name": CLS_NAME, "version": version},
            "source": {"type": "video", "uri": str(video or "file:///dev/null"), "loop": True},
            "preprocess": CLS_PREPROCESS.model_dump(),
            "postprocess": {"type": "classification", "softmax": False},
        }

    config = {
        "device": {"id": "offline-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": free_port(), "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"http://127.0.0.1:{port}", "retries": 0, "connect_timeout_s": 2},
        "backends": {"benchmark": False},
        "pipelines": [pipeline("installed", CLS_VERSION), pipeline("missing", "2.1")],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    return path
