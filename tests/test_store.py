"""Verified local model store: real ONNX model, real file:// registry, real threads and processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.errors import IntegrityError, ModelError, StoreError
from agent.registry import FileRegistry, Manifest
from agent.registry.file_registry import file_lock
from agent.store import InstalledModel, ModelStore
from tests.store_fixtures import CLS_NAME, CLS_VERSION, CountingRegistry, publish_by_hand
from tests.waits import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent


def blob_dir(store: ModelStore) -> Path:
    return store.root / "blobs" / "sha256"


def blob_files(store: ModelStore) -> list[str]:
    directory = blob_dir(store)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def temp_files(store: ModelStore) -> list[Path]:
    return [p for p in store.root.rglob("*") if ".tmp-" in p.name]


def registry_file(registry: FileRegistry, name: str, version: str, file: str) -> Path:
    return registry.root / name / version / file


def rewrite_manifest(registry: FileRegistry, name: str, version: str, **artifact_fields: object) -> None:
    path = registry_file(registry, name, version, "manifest.json")
    doc = json.loads(path.read_text())
    doc["artifacts"][0].update(artifact_fields)
    path.write_text(json.dumps(doc))


def assert_nothing_installed(store: ModelStore, name: str, version: str) -> None:
    assert blob_files(store) == []
    assert temp_files(store) == []
    assert not (store.root / "models" / name / version / "manifest.json").exists()
    with pytest.raises(StoreError, match="not installed"):
        store.get(name, version)


# --- install ------------------------------------------------------------------------------------


def test_pull_installs_a_verified_loadable_model(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path
) -> None:
    store = ModelStore(tmp_path / "store")
    installed = store.pull(file_registry, CLS_NAME, CLS_VERSION)

    data = cls_model_path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert isinstance(installed, InstalledModel)
    assert (installed.name, installed.version) == (CLS_NAME, CLS_VERSION)
    artifact, path = installed.primary()
    assert artifact.sha256 == sha and artifact.format == "onnx"
    assert path == tmp_path / "store" / "blobs" / "sha256" / sha
    assert path.read_bytes() == data
    assert installed.artifact_path(artifact.file) == path
    assert installed.manifest.metadata == {"labels": ["0", "180"]}
    assert blob_files(store) == [sha]
    assert temp_files(store) == []
    copy = tmp_path / "store" / "models" / CLS_NAME / CLS_VERSION / "manifest.json"
    assert Manifest.parse_bytes(copy.read_bytes(), str(copy)) == file_registry.get_manifest(
        CLS_NAME, CLS_VERSION
    )

    assert store.get(CLS_NAME, CLS_VERSION) == installed
    assert store.list() == [installed]
    assert store.verify(CLS_NAME, CLS_VERSION) == []
    with pytest.raises(StoreError, match="no tflite artifact"):
        installed.primary("tflite")

    # The installed blob is the real classifier: it runs (text direction: 2 classes).
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: np.zeros((1, 3, 48, 192), np.float32)})
    assert output.shape == (1, 2)


def test_pull_is_idempotent_and_works_offline(tmp_path: Path, file_registry: FileRegistry) -> None:
    store = ModelStore(tmp_path / "store")
    counting = CountingRegistry(file_registry)
    first = store.pull(counting, CLS_NAME, CLS_VERSION)
    assert (counting.manifest_calls, counting.artifact_calls) == (1, 1)
    blob = first.primary()[1]
    mtime = blob.stat().st_mtime_ns

    second = store.pull(counting, CLS_NAME, CLS_VERSION)
    third = store.pull(counting, CLS_NAME, CLS_VERSION, verify=True)
    assert first == second == third
    assert (counting.manifest_calls, counting.artifact_calls) == (1, 1)  # registry not asked again
    assert blob.stat().st_mtime_ns == mtime

    # Installed versions keep working when the registry is gone.
    offline = FileRegistry(tmp_path / "no-such-registry")
    assert store.pull(offline, CLS_NAME, CLS_VERSION) == first


def test_versions_with_the_same_bytes_share_one_blob(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path
) -> None:
    file_registry.publish(cls_model_path, CLS_NAME, "2.1")
    store = ModelStore(tmp_path / "store")
    counting = CountingRegistry(file_registry)
    a = store.pull(counting, CLS_NAME, CLS_VERSION)
    b = store.pull(counting, CLS_NAME, "2.1")
    assert counting.artifact_calls == 1  # the second version found its blob already there
    assert a.primary()[1] == b.primary()[1]
    assert len(blob_files(store)) == 1
    assert [m.version for m in store.list()] == ["2.0", "2.1"]


def test_get_and_verify_of_a_version_that_is_not_installed(
    tmp_path: Path, file_registry: FileRegistry
) -> None:
    store = ModelStore(tmp_path / "store")
    store.pull(file_registry, CLS_NAME, CLS_VERSION)
    with pytest.raises(
        StoreError, match=r"pp-ocr-cls@9 is not installed .*installed versions of pp-ocr-cls: 2.0"
    ):
        store.get(CLS_NAME, "9")
    with pytest.raises(StoreError, match="not installed"):
        store.verify(CLS_NAME, "9")
    with pytest.raises(StoreError, match="invalid model name"):
        store.get("../etc", "1")


# --- integrity ---------------------------------------------------------------------------------


def test_registry_copy_changed_after_publish_is_refused(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    artifact = cls_manifest.artifacts[0]
    path = registry_file(file_registry, CLS_NAME, CLS_VERSION, artifact.file)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))

    store = ModelStore(tmp_path / "store")
    with pytest.raises(IntegrityError) as info:
        store.pull(file_registry, CLS_NAME, CLS_VERSION)
    message = str(info.value)
    assert f"artifact {artifact.file} of {CLS_NAME}@{CLS_VERSION}: sha256 mismatch" in message
    assert f"manifest says {artifact.sha256}, got {hashlib.sha256(bytes(data)).hexdigest()}" in message
    assert "corrupt or was changed after publishing" in message
    assert_nothing_installed(store, CLS_NAME, CLS_VERSION)


def test_truncated_registry_copy_is_caught_by_the_size_check(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    artifact = cls_manifest.artifacts[0]
    path = registry_file(file_registry, CLS_NAME, CLS_VERSION, artifact.file)
    with path.open("r+b") as f:
        f.truncate(1000)

    store = ModelStore(tmp_path / "store")
    with pytest.raises(IntegrityError) as info:
        store.pull(file_registry, CLS_NAME, CLS_VERSION)
    message = str(info.value)
    assert f"size mismatch: manifest says {artifact.size} bytes, got 1000 bytes" in message
    assert "truncated" in message
    assert "sha256" not in message
    assert_nothing_installed(store, CLS_NAME, CLS_VERSION)


def test_truncated_registry_copy_with_matching_size_is_caught_by_the_hash(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    artifact = cls_manifest.artifacts[0]
    path = registry_file(file_registry, CLS_NAME, CLS_VERSION, artifact.file)
    with path.open("r+b") as f:
        f.truncate(1000)
    rewrite_manifest(file_registry, CLS_NAME, CLS_VERSION, size=1000)

    store = ModelStore(tmp_path / "store")
    with pytest.raises(IntegrityError, match=rf"sha256 mismatch: manifest says {artifact.sha256}, got "):
        store.pull(file_registry, CLS_NAME, CLS_VERSION)
    assert_nothing_installed(store, CLS_NAME, CLS_VERSION)


def test_registry_copy_larger_than_published_is_refused(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    artifact = cls_manifest.artifacts[0]
    path = registry_file(file_registry, CLS_NAME, CLS_VERSION, artifact.file)
    with path.open("ab") as f:
        f.write(b"\x00" * (3 << 20))  # more than one copy chunk past the published size

    store = ModelStore(tmp_path / "store")
    with pytest.raises(
        IntegrityError, match=rf"size mismatch: manifest says {artifact.size} bytes, got more than"
    ):
        store.pull(file_registry, CLS_NAME, CLS_VERSION)
    assert_nothing_installed(store, CLS_NAME, CLS_VERSION)


def test_non_onnx_file_with_a_matching_hash_is_refused(tmp_path: Path, file_registry: FileRegistry) -> None:
    publish_by_hand(file_registry, "junk", "1", "model.onnx", b"definitely not an ONNX protobuf\n" * 4)
    store = ModelStore(tmp_path / "store")
    with pytest.raises(ModelError) as info:
        store.pull(file_registry, "junk", "1")
    message = str(info.value)
    assert "artifact model.onnx of junk@1" in message
    assert "model.onnx is not a valid ONNX model: " in message
    assert "ir_version" in message  # the checker's own reason, quoted
    assert "\n" not in message
    assert_nothing_installed(store, "junk", "1")


def test_truncated_onnx_with_a_matching_hash_is_refused(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path
) -> None:
    publish_by_hand(file_registry, "half", "1", "model.onnx", cls_model_path.read_bytes()[:200_000])
    store = ModelStore(tmp_path / "store")
    with pytest.raises(ModelError, match=r"model\.onnx is not a valid ONNX model"):
        store.pull(file_registry, "half", "1")
    assert_nothing_installed(store, "half", "1")


# --- bit rot -----------------------------------------------------------------------------------


def test_bit_rot_is_found_by_verify_and_repaired_by_pull_verify(
    tmp_path: Path, file_registry: FileRegistry
) -> None:
    store = ModelStore(tmp_path / "store")
    installed = store.pull(file_registry, CLS_NAME, CLS_VERSION)
    artifact, blob = installed.primary()
    good = blob.read_bytes()

    os.chmod(blob, 0o644)  # blobs are stored read-only
    rotten = bytearray(good)
    rotten[12345] ^= 0x01
    blob.write_bytes(bytes(rotten))

    problems = store.verify(CLS_NAME, CLS_VERSION)
    assert len(problems) == 1
    assert f"artifact {artifact.file}" in problems[0]
    assert f"manifest says {artifact.sha256}" in problems[0] and "bit rot" in problems[0]

    # A plain pull trusts an intact-looking store (size only); verify=True re-hashes and repairs.
    counting = CountingRegistry(file_registry)
    store.pull(counting, CLS_NAME, CLS_VERSION)
    assert counting.artifact_calls == 0
    repaired = store.pull(counting, CLS_NAME, CLS_VERSION, verify=True)
    assert counting.artifact_calls == 1
    assert repaired.primary()[1].read_bytes() == good
    assert store.verify(CLS_NAME, CLS_VERSION) == []
    assert blob_files(store) == [artifact.sha256]
    assert temp_files(store) == []
    assert blob.stat().st_mode & 0o777 == 0o444


def test_missing_or_short_blob_is_noticed_by_get_and_repaired_by_pull(
    tmp_path: Path, file_registry: FileRegistry
) -> None:
    store = ModelStore(tmp_path / "store")
    blob = store.pull(file_registry, CLS_NAME, CLS_VERSION).primary()[1]
    blob.unlink()
    with pytest.raises(StoreError, match=r"damaged: artifact .* is missing"):
        store.get(CLS_NAME, CLS_VERSION)
    assert "missing" in store.verify(CLS_NAME, CLS_VERSION)[0]
    # A crashed earlier pull left a temp file behind: the next download clears it.
    stale = blob.with_name(f"{blob.name}.tmp-999999-1-deadbeef")
    stale.write_bytes(b"half")
    store.pull(file_registry, CLS_NAME, CLS_VERSION)
    assert store.verify(CLS_NAME, CLS_VERSION) == []
    assert temp_files(store) == []


# --- concurrency -------------------------------------------------------------------------------


def test_eight_threads_pull_the_same_version_at_once(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    store_root = tmp_path / "store"
    counting = CountingRegistry(file_registry, delay_s=0.05)
    barrier = threading.Barrier(8, timeout=60)

    def pull() -> InstalledModel:
        barrier.wait()
        return ModelStore(store_root, lock_timeout_s=120).pull(counting, CLS_NAME, CLS_VERSION)

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(pull) for _ in range(8)]
        results = [f.result(timeout=120) for f in futures]

    assert all(r == results[0] for r in results)
    assert counting.artifact_calls == 1  # downloaded once; the others waited and found it installed
    store = ModelStore(store_root)
    sha = cls_manifest.artifacts[0].sha256
    assert blob_files(store) == [sha]
    assert temp_files(store) == []
    assert hashlib.sha256((blob_dir(store) / sha).read_bytes()).hexdigest() == sha
    assert store.verify(CLS_NAME, CLS_VERSION) == []


_PULL_IN_A_PROCESS = """
import logging, sys, time
from pathlib import Path
from agent.registry import open_registry
from agent.store import ModelStore

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
registry_url, store_root, go, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()  # imported: at the start line
deadline = time.monotonic() + 120
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("start signal never came")
    time.sleep(0.002)
installed = ModelStore(store_root, lock_timeout_s=120).pull(open_registry(registry_url), "pp-ocr-cls", "2.0")
sys.stdout.write(str(installed.primary()[1]) + "\\n")
"""


def test_three_processes_pull_the_same_version_at_once(
    tmp_path: Path, file_registry: FileRegistry, cls_manifest: Manifest
) -> None:
    store_root = tmp_path / "store"
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PULL_IN_A_PROCESS,
                file_registry.url,
                str(store_root),
                str(go),
                str(mark),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mark in ready
    ]
    try:
        wait_until(  # all imported and at the start line, so that they really pull at once
            lambda: all(mark.exists() for mark in ready) or any(p.poll() is not None for p in procs),
            "the processes at the start line",
            timeout=120,
            state=lambda: [p.poll() for p in procs],
        )
        go.touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    sha = cls_manifest.artifacts[0].sha256
    expected = str(store_root / "blobs" / "sha256" / sha)
    assert [out.strip() for out, _err in outputs] == [expected] * 3
    logs = "".join(err for _out, err in outputs)
    assert logs.count("stored artifact") == 1, logs  # one process downloaded, the others waited
    assert logs.count("installed pp-ocr-cls@2.0") == 1, logs

    store = ModelStore(store_root)
    assert blob_files(store) == [sha]
    assert temp_files(store) == []
    assert hashlib.sha256((blob_dir(store) / sha).read_bytes()).hexdigest() == sha
    assert store.verify(CLS_NAME, CLS_VERSION) == []


def test_lock_wait_is_bounded(tmp_path: Path, file_registry: FileRegistry) -> None:
    store = ModelStore(tmp_path / "store", lock_timeout_s=0.3)
    lock_path = tmp_path / "store" / "locks" / "models" / f"{CLS_NAME}@{CLS_VERSION}.lock"
    with file_lock(lock_path, timeout_s=30, what="test holds the version"):
        started = time.monotonic()
        with pytest.raises(
            StoreError, match=r"timed out after 0.3s waiting for the lock on installing pp-ocr-cls@2.0"
        ):
            store.pull(file_registry, CLS_NAME, CLS_VERSION)
        # Bounded by the store's 0.3 s, not its 900 s default: 15 s is generous for a busy machine.
        assert time.monotonic() - started < 15
    assert store.pull(file_registry, CLS_NAME, CLS_VERSION).name == CLS_NAME
