"""A registry that stalls in the middle of a download holds up nothing but pulls of what it is
sending (issue 26): the store's clean-up (`models gc`, the daemon's clean-up after a start, with its
5 s wait) and pulls of other versions complete meanwhile, and a pull of the same version that gives
up waiting names who holds the lock and what it does. A real HTTP registry on loopback that sends
part of a file and then nothing, a real `edge-agent models pull` stuck on it, and real files."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import onnx
import pytest

from agent.config import RegistryConnection
from agent.errors import RegistryError, StoreError
from agent.registry import FileRegistry, HttpRegistry
from agent.store import PARTIAL_SUFFIX, ModelStore
from tests.agent_process import EDGE_AGENT
from tests.registry_server import RegistryServer
from tests.store_fixtures import CLS_MODEL_FILE, CLS_NAME, CLS_VERSION
from tests.waits import wait_until

SENT_BEFORE_STALL = 64 * 1024
CLI_TIMEOUT_S = 60  # a CLI that waited for the stalled pull would wait 900 s


@pytest.fixture
def stalling(file_registry: FileRegistry, cls_model_path: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The registry over HTTP, its pp-ocr-cls@2.0 file stalling after 64 KiB; `other@1` (its own
    bytes) served normally."""
    model = onnx.load(str(cls_model_path))
    onnx.helper.set_model_props(model, {"note": "another model"})
    other = tmp_path / "other" / "model.onnx"
    other.parent.mkdir()
    onnx.save(model, str(other))
    file_registry.publish(other, "other", "1")
    server = RegistryServer(file_registry.root, stall_s=120.0)
    server.fault(f"/{CLS_NAME}/{CLS_VERSION}/{CLS_MODEL_FILE}", "stall", SENT_BEFORE_STALL, times=10)
    try:
        yield server
    finally:
        server.close()


def _partial(store: ModelStore, file_registry: FileRegistry) -> Path:
    sha256 = file_registry.get_manifest(CLS_NAME, CLS_VERSION).primary("onnx").sha256
    return store.blobs_dir / (sha256 + PARTIAL_SUFFIX)


def _stalled(partial: Path) -> bool:
    return partial.exists() and partial.stat().st_size >= SENT_BEFORE_STALL


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "agent.yaml"
    config = {
        "device": {"id": "stall-box"},
        "state_dir": str(tmp_path / "state"),
        "registry": {"url": url, "retries": 0, "read_timeout_s": 120},
        "pipelines": [
            {
                "name": "door",
                "model": {"name": CLS_NAME, "version": CLS_VERSION},
                "source": {"type": "video", "uri": "file:///dev/null"},
                "postprocess": {"type": "raw"},
            }
        ],
    }
    path.write_text(json.dumps(config))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EDGE_AGENT), *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def test_a_stalled_pull_in_another_process_holds_up_neither_clean_up_nor_other_pulls(
    tmp_path: Path, file_registry: FileRegistry, stalling: RegistryServer
) -> None:
    config = _config(tmp_path, stalling.url)
    store = ModelStore(tmp_path / "state" / "store")
    partial = _partial(store, file_registry)
    stuck = subprocess.Popen(
        [str(EDGE_AGENT), "models", "pull", f"{CLS_NAME}@{CLS_VERSION}", "-c", str(config), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _stalled(partial), "the pull stalled half way through the file", timeout=60)

        # The daemon's clean-up after a start waits 5 s for the store: it gets it at once.
        assert store.gc(keep_versions=1, wait_s=5.0).removed == []
        gc = _cli("models", "gc", "--keep", "1", "-c", str(config), "--json")
        assert gc.returncode == 0, gc.stderr
        pulled = _cli("models", "pull", "other@1", "-c", str(config), "--json")
        assert pulled.returncode == 0, pulled.stderr
        assert json.loads(pulled.stdout)[0]["ok"] is True
        assert store.is_installed("other", "1")

        # A second pull of the stalled version waits for the first; giving up, it names it.
        waiting = ModelStore(store.root, lock_timeout_s=0.5)
        with pytest.raises(StoreError) as info:
            waiting.pull(HttpRegistry(stalling.url), CLS_NAME, CLS_VERSION)
        holder = f"held by process {stuck.pid}: installing {CLS_NAME}@{CLS_VERSION} from {stalling.url}"
        assert holder in str(info.value), str(info.value)
        assert stuck.poll() is None and _stalled(partial)  # still stalled all along
    finally:
        stuck.kill()
        stuck.communicate(timeout=30)


def test_a_stalled_pull_in_this_process_is_named_as_such(
    tmp_path: Path, file_registry: FileRegistry, stalling: RegistryServer
) -> None:
    store = ModelStore(tmp_path / "store")
    partial = _partial(store, file_registry)
    registry = HttpRegistry(stalling.url, RegistryConnection(retries=0, read_timeout_s=4.0))
    failed: list[Exception] = []

    def pull() -> None:
        try:
            store.pull(registry, CLS_NAME, CLS_VERSION)
        except RegistryError as exc:
            failed.append(exc)

    worker = threading.Thread(target=pull, name="build-door", daemon=True)
    worker.start()
    try:
        wait_until(lambda: _stalled(partial), "the pull stalled half way through the file", timeout=30)
        store.pull(HttpRegistry(stalling.url), "other", "1")  # another version: not held up
        assert store.gc(keep_versions=1, wait_s=5.0).removed == []
        waiting = ModelStore(store.root, lock_timeout_s=0.3)
        with pytest.raises(StoreError) as info:
            waiting.pull(HttpRegistry(stalling.url), CLS_NAME, CLS_VERSION)
        message = str(info.value)
        assert f"timed out after 0.3s waiting for the lock on installing {CLS_NAME}@{CLS_VERSION}" in message
        assert "held by this process (pid " in message and "thread build-door" in message
        assert f"installing {CLS_NAME}@{CLS_VERSION} from {stalling.url}" in message.split("held by", 1)[1]
        assert "another process holds it" not in message
    finally:
        worker.join(timeout=30)
    assert failed and "timed out" in str(failed[0])  # the read timeout ends the stalled pull
    assert store.list()[0].ref == "other@1" and not store.is_installed(CLS_NAME, CLS_VERSION)
