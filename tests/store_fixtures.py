"""Fixtures for the model registry and store: a real ONNX model and a file:// registry holding it, a
registry that counts (and can slow) its calls, an entry published by hand around bytes that are not a
model; the config of an agent whose registry is an HTTP server (tests/test_offline.py,
tests/test_reload_retry.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from agent.registry import Artifact, FileRegistry, Manifest, ManifestDocument, PublishOptions
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


class CountingRegistry:
    """A real FileRegistry that counts calls (and can slow them down to widen race windows)."""

    def __init__(self, inner: FileRegistry, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.manifest_calls = 0
        self.artifact_calls = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.inner.url

    def get_manifest(self, name: str, version: str) -> Manifest:
        return self.fetch_manifest(name, version).manifest

    def fetch_manifest(self, name: str, version: str, digest: str | None = None) -> ManifestDocument:
        with self._lock:
            self.manifest_calls += 1
        time.sleep(self.delay_s)
        return self.inner.fetch_manifest(name, version, digest)

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        with self._lock:
            self.artifact_calls += 1
        time.sleep(self.delay_s)
        return self.inner.open_artifact(name, version, artifact)

    def open_artifact_at(
        self, name: str, version: str, artifact: Artifact | str, offset: int, validator: str | None = None
    ) -> tuple[int, BinaryIO]:
        with self._lock:
            self.artifact_calls += 1
        time.sleep(self.delay_s)
        return self.inner.open_artifact_at(name, version, artifact, offset, validator)

    def list_versions(self, name: str) -> list[str]:
        return self.inner.list_versions(name)

    def close(self) -> None:
        self.inner.close()


def publish_by_hand(registry: FileRegistry, name: str, version: str, file: str, data: bytes) -> None:
    """A registry entry whose manifest truthfully describes bytes that are not a model."""
    version_dir = registry.root / name / version
    version_dir.mkdir(parents=True)
    (version_dir / file).write_bytes(data)
    manifest = Manifest(
        schema_version=1,
        name=name,
        version=version,
        created="2024-05-01T12:00:00Z",
        artifacts=[
            Artifact(file=file, sha256=hashlib.sha256(data).hexdigest(), size=len(data), format="onnx")
        ],
    )
    (version_dir / "manifest.json").write_bytes(manifest.to_bytes())
