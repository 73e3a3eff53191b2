"""What the model store keeps: the newest versions of each model, size and age limits, `models rm`,
`models gc`, and never a version a pipeline uses. Real ONNX models in a real file registry."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import onnx
import pytest

from agent.config_loader import load_config
from agent.daemon import Agent
from agent.errors import StoreError
from agent.registry import FileRegistry, PublishOptions
from agent.registry.manifest import MANIFEST_FILE
from agent.store import ModelStore
from tests.cli_runs import edge_agent
from tests.config_cases import assert_both_accept
from tests.store_fixtures import CLS_NAME, CountingRegistry
from tests.waits import wait_until

VERSIONS = ["1", "2", "3", "4", "5"]


@pytest.fixture
def registry(tmp_path: Path, cls_model_path: Path) -> FileRegistry:
    """pp-ocr-cls 1..5, each with its own bytes (a note in the ONNX metadata), so each has its own blob."""
    registry = FileRegistry(tmp_path / "registry")
    model = onnx.load(str(cls_model_path))
    for version in VERSIONS:
        onnx.helper.set_model_props(model, {"note": f"version {version}"})
        path = tmp_path / "models" / version / "model.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(model, str(path))
        registry.publish(path, CLS_NAME, version)
    return registry


def _install_all(store: ModelStore, registry: FileRegistry, days_apart: float = 1.0) -> None:
    """Install 1..5, version 5 the newest (install times set days apart: the store orders by them)."""
    now = time.time()
    for i, version in enumerate(VERSIONS):
        store.pull(registry, CLS_NAME, version)
        when = now - (len(VERSIONS) - i) * days_apart * 86400
        os.utime(store.models_dir / CLS_NAME / version / MANIFEST_FILE, (when, when))


def _versions(store: ModelStore) -> list[str]:
    return [m.version for m in store.list()]


def _blob_names(store: ModelStore) -> set[str]:
    return {p.name for p in store.blobs_dir.iterdir()}


def test_gc_keeps_the_newest_versions_and_those_in_use(tmp_path: Path, registry: FileRegistry) -> None:
    store = ModelStore(tmp_path / "store")
    _install_all(store, registry)
    blobs = {v: store.get(CLS_NAME, v).primary()[0].sha256 for v in VERSIONS}

    dry = store.gc(in_use={(CLS_NAME, "1")}, keep_versions=2, dry_run=True)
    assert [r["version"] for r in dry.removed] == ["3", "2"] and dry.blobs == 2
    assert _versions(store) == VERSIONS  # nothing removed on a dry run

    report = store.gc(in_use={(CLS_NAME, "1")}, keep_versions=2)
    assert [(r["version"], r["why"]) for r in report.removed] == [
        ("3", "more than 2 version(s) of pp-ocr-cls installed"),
        ("2", "more than 2 version(s) of pp-ocr-cls installed"),
    ]
    assert _versions(store) == ["1", "4", "5"]
    assert _blob_names(store) == {blobs["1"], blobs["4"], blobs["5"]}
    assert report.blobs == 2 and report.freed_bytes == sum(
        (registry.root / CLS_NAME / v / "model.onnx").stat().st_size for v in ("2", "3")
    )
    for version in ("1", "4", "5"):
        assert store.verify(CLS_NAME, version) == []


def test_gc_by_age_and_by_size(tmp_path: Path, registry: FileRegistry) -> None:
    store = ModelStore(tmp_path / "store")
    _install_all(store, registry, days_apart=10)  # installed 50, 40, 30, 20 and 10 days ago
    assert [r["version"] for r in store.gc(max_age_s=35 * 86400).removed] == ["2", "1"]
    size = store.get(CLS_NAME, "5").primary()[0].size
    report = store.gc(in_use={(CLS_NAME, "3")}, max_bytes=2 * size)  # room for two: the oldest unused goes
    assert [(r["version"], r["why"]) for r in report.removed] == [
        ("4", f"the store holds more than {2 * size:,} bytes")
    ]
    assert _versions(store) == ["3", "5"]


def test_a_blob_another_version_shares_stays(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(cls_model_path, CLS_NAME, "1", PublishOptions(metadata={"labels": ["0", "180"]}))
    registry.publish(
        cls_model_path, CLS_NAME, "2", PublishOptions(metadata={"labels": ["up", "down"]})
    )  # same file
    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.pull(registry, CLS_NAME, version)
    report = store.remove(CLS_NAME, "1")
    assert report.blobs == 0 and report.freed_bytes == 0
    assert _versions(store) == ["2"] and store.verify(CLS_NAME, "2") == []
    with pytest.raises(
        StoreError, match=r"model pp-ocr-cls@1 is not installed .* \(installed versions of pp-ocr-cls: 2\)"
    ):
        store.remove(CLS_NAME, "1")
    store.remove(CLS_NAME, "2")
    assert store.list() == [] and _blob_names(store) == set()
    assert not (store.models_dir / CLS_NAME).exists()


def test_a_partial_download_survives_gc(tmp_path: Path, registry: FileRegistry) -> None:
    store = ModelStore(tmp_path / "store")
    store.pull(registry, CLS_NAME, "1")
    partial = store.blobs_dir / ("f" * 64 + ".partial")
    partial.write_bytes(b"half a model")
    store.gc(keep_versions=1)
    assert partial.exists()  # the pull that resumes it needs it


@pytest.mark.slow
def test_gc_runs_beside_a_pull_in_progress_and_keeps_what_it_installs(
    tmp_path: Path, registry: FileRegistry
) -> None:
    """A pull holds no store-wide lock while it talks to its registry (issue 26): the clean-up
    runs meanwhile, and the version the pull installs afterwards is whole."""
    store = ModelStore(tmp_path / "store")
    for version in ("1", "3"):
        store.pull(registry, CLS_NAME, version)
    slow = CountingRegistry(registry, delay_s=3.0)
    pulled = threading.Event()

    def pull() -> None:
        store.pull(slow, CLS_NAME, "2")
        pulled.set()

    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    wait_until(lambda: slow.manifest_calls >= 1, "the pull asking its registry")
    report = store.gc(in_use={(CLS_NAME, "2")}, keep_versions=1, wait_s=0.5)  # does not wait for it
    assert not pulled.is_set()
    worker.join(timeout=30)
    assert pulled.is_set()
    assert [r["version"] for r in report.removed] == ["1"]
    assert _versions(store) == ["2", "3"] and store.verify(CLS_NAME, "2") == []


# --- the CLI and the daemon ---------------------------------------------------------------------


def _config(tmp_path: Path, registry: FileRegistry, version: str, store: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"device: {{id: box-1}}\nstate_dir: {tmp_path / 'state'}\n"
        f"registry: {{url: '{registry.url}'}}\n{store}pipelines:\n"
        f"  - name: door\n    source: {{type: video, uri: 'file:///dev/null'}}\n"
        f"    model: {{name: {CLS_NAME}, version: '{version}'}}\n    postprocess: {{type: raw}}\n"
    )
    return path


def test_the_config_written_here_passes_the_validator_and_the_schema(tmp_path: Path) -> None:
    path = _config(tmp_path, FileRegistry(tmp_path / "registry"), "2", store="store: {keep_versions: 2}\n")
    assert_both_accept(path.read_text(), str(path))


def test_cli_rm_and_gc(tmp_path: Path, registry: FileRegistry) -> None:
    config = _config(tmp_path, registry, "2", store="store: {keep_versions: 2}\n")
    store = ModelStore(tmp_path / "state" / "store")
    _install_all(store, registry)

    refused = edge_agent("models", "rm", f"{CLS_NAME}@2", "-c", str(config))
    assert refused.returncode == 1
    assert f"error: {CLS_NAME}@2 is used by a pipeline in {config}; refusing to remove it" in refused.stderr
    removed = edge_agent("models", "rm", f"{CLS_NAME}@1", "-c", str(config), "--json")
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout)[0]["freed_bytes"] > 500_000

    dry = edge_agent("models", "gc", "-c", str(config), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [r["version"] for r in json.loads(dry.stdout)["removed"]] == ["3"]  # keep 2 (5, 4) + 2 in use
    done = edge_agent("models", "gc", "-c", str(config), "--max-size", "1K")
    assert done.returncode == 0, done.stderr
    assert _versions(store) == ["2"]  # only the version in use is left
    assert "removed 3 version(s)" in done.stdout

    bad = edge_agent("models", "gc", "-c", str(config), "--max-size", "lots")
    assert bad.returncode == 1 and "--max-size 'lots': expected a size such as 500M or 2G" in bad.stderr


def test_the_daemon_keeps_what_store_says_after_a_pipeline_starts(
    tmp_path: Path, registry: FileRegistry
) -> None:
    config_path = _config(tmp_path, registry, "3", store="store: {keep_versions: 1}\n")
    store = ModelStore(tmp_path / "state" / "store")
    _install_all(store, registry)
    agent = Agent(load_config(config_path))
    try:
        agent.supervisor._prune_store()
    finally:
        agent.outbox.close()
    assert _versions(store) == ["3", "5"]  # the newest, and the one the pipeline names


@pytest.mark.slow
def test_a_clean_up_does_not_wait_for_a_pull_and_keeps_the_version_it_repairs(
    tmp_path: Path, registry: FileRegistry
) -> None:
    """The daemon's clean-up after a start runs beside a long pull; a version that pull holds (a
    repair of an installed one) is kept for now, not waited for."""
    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.pull(registry, CLS_NAME, version)
    blob = store.get(CLS_NAME, "1").primary()[1]
    os.chmod(blob, 0o644)
    blob.write_bytes(b"\0" * blob.stat().st_size)  # bit rot: the repair downloads it again
    slow = CountingRegistry(registry, delay_s=3.0)
    worker = threading.Thread(target=store.pull, args=(slow, CLS_NAME, "1"), kwargs={"verify": True})
    worker.daemon = True
    worker.start()
    wait_until(lambda: slow.manifest_calls >= 1, "the repair holding version 1")
    started = time.monotonic()
    report = store.gc(keep_versions=1, in_use={(CLS_NAME, "2")}, wait_s=0.2)
    assert time.monotonic() - started < 2.0
    assert report.removed == []  # 1 is being repaired (kept for now), 2 is in use
    worker.join(timeout=60)
    assert _versions(store) == ["1", "2"] and store.verify(CLS_NAME, "1") == []
