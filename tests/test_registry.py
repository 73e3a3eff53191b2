"""file:// model registry: publish, read back, refuse bad input with clear errors. Real ONNX model."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from agent.errors import RegistryError
from agent.registry import (
    FileRegistry,
    HttpRegistry,
    Manifest,
    OciRegistry,
    PublishOptions,
    Registry,
    open_registry,
)
from tests.store_fixtures import CLS_NAME, CLS_VERSION


def _manifest_dict(**overrides: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "schema_version": 1,
        "name": "m",
        "version": "1",
        "created": "2024-05-01T12:00:00Z",
        "artifacts": [{"file": "model.onnx", "sha256": "a" * 64, "size": 10, "format": "onnx"}],
    }
    doc.update(overrides)
    return doc


def _parse_error(doc: object, source: str = "/reg/m/1/manifest.json") -> str:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(RegistryError) as info:
        Manifest.parse_bytes(data, source)
    message = str(info.value)
    assert source in message
    return message


# --- publish ---------------------------------------------------------------------------------


def test_publish_writes_manifest_with_real_hash_and_size(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    before = datetime.now(timezone.utc).replace(microsecond=0)
    manifest = registry.publish(
        cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(metadata={"labels": ["0", "180"]})
    )

    data = cls_model_path.read_bytes()
    assert manifest.name == CLS_NAME and manifest.version == CLS_VERSION
    assert manifest.schema_version == 1
    assert len(manifest.artifacts) == 1
    artifact = manifest.artifacts[0]
    assert artifact.file == cls_model_path.name
    assert artifact.sha256 == hashlib.sha256(data).hexdigest()
    assert artifact.size == len(data) == cls_model_path.stat().st_size
    assert artifact.format == "onnx"
    assert artifact.target == "any"
    assert manifest.metadata == {"labels": ["0", "180"]}
    created = datetime.fromisoformat(manifest.created.replace("Z", "+00:00"))
    assert created >= before and manifest.created.endswith("Z")

    version_dir = tmp_path / "reg" / CLS_NAME / CLS_VERSION
    assert sorted(p.name for p in version_dir.iterdir()) == sorted(["manifest.json", artifact.file])
    assert (version_dir / artifact.file).read_bytes() == data
    on_disk = json.loads((version_dir / "manifest.json").read_text())
    assert on_disk["artifacts"][0]["sha256"] == artifact.sha256
    assert on_disk["artifacts"][0]["size"] == len(data)

    assert registry.get_manifest(CLS_NAME, CLS_VERSION) == manifest
    assert registry.list_versions(CLS_NAME) == [CLS_VERSION]
    with registry.open_artifact(CLS_NAME, CLS_VERSION, artifact) as stream:
        assert stream.read() == data


def test_publish_refuses_to_overwrite_a_version_unless_forced(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    first = registry.publish(cls_model_path, CLS_NAME, "1")
    with pytest.raises(RegistryError, match=r"version '1' already exists.*immutable"):
        registry.publish(cls_model_path, CLS_NAME, "1")
    assert registry.get_manifest(CLS_NAME, "1") == first

    replaced = registry.publish(cls_model_path, CLS_NAME, "1", PublishOptions(target="x86_64", force=True))
    assert replaced.artifacts[0].target == "x86_64"
    assert registry.get_manifest(CLS_NAME, "1") == replaced
    leftovers = [p.name for p in (tmp_path / "reg" / CLS_NAME / "1").iterdir()]
    assert sorted(leftovers) == sorted(["manifest.json", cls_model_path.name])


def test_publish_refuses_a_file_that_is_not_an_onnx_model(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    junk = tmp_path / "model.onnx"
    junk.write_bytes(b"this is not a protobuf at all\n" * 10)
    with pytest.raises(RegistryError) as info:
        registry.publish(junk, "junk", "1")
    message = str(info.value)
    assert "refusing to publish" in message and "not a valid ONNX model" in message
    assert "\n" not in message
    assert not (tmp_path / "reg" / "junk" / "1").exists()

    truncated = tmp_path / "half.onnx"
    truncated.write_bytes(cls_model_path.read_bytes()[:100_000])
    with pytest.raises(RegistryError, match="not a valid ONNX model"):
        registry.publish(truncated, "junk", "1")
    with pytest.raises(RegistryError, match="not found"):
        registry.get_manifest("junk", "1")


def test_forced_republish_of_a_bad_file_keeps_the_old_version(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    good = registry.publish(cls_model_path, "m", "1")
    junk = tmp_path / cls_model_path.name
    junk.write_bytes(b"garbage")
    with pytest.raises(RegistryError, match="not a valid ONNX model"):
        registry.publish(junk, "m", "1", PublishOptions(force=True))
    assert registry.get_manifest("m", "1") == good
    assert sorted(p.name for p in (tmp_path / "reg" / "m" / "1").iterdir()) == sorted(
        ["manifest.json", cls_model_path.name]
    )


def test_publish_needs_a_known_format(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(cls_model_path.read_bytes())
    with pytest.raises(RegistryError, match=r"cannot tell the model format of model\.bin"):
        registry.publish(renamed, "m", "1")
    manifest = registry.publish(renamed, "m", "1", PublishOptions(format="onnx"))
    assert manifest.artifacts[0].format == "onnx"
    with pytest.raises(RegistryError, match="unknown format 'pytorch'"):
        registry.publish(renamed, "m", "2", PublishOptions(format="pytorch"))
    with pytest.raises(RegistryError, match="no such file"):
        registry.publish(tmp_path / "missing.onnx", "m", "3")
    with pytest.raises(RegistryError, match="invalid model version"):
        registry.publish(renamed, "m", "../escape", PublishOptions(format="onnx"))


def test_publish_tflite_checks_the_flatbuffer_identifier(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    fake = tmp_path / "model.tflite"
    fake.write_bytes(b"\x00" * 64)
    with pytest.raises(RegistryError, match="not a valid TFLite model"):
        registry.publish(fake, "t", "1")


# --- reading: missing things -----------------------------------------------------------------


def test_missing_version_names_registry_and_available_versions(file_registry: FileRegistry) -> None:
    with pytest.raises(RegistryError) as info:
        file_registry.get_manifest(CLS_NAME, "3")
    message = str(info.value)
    assert f"model '{CLS_NAME}' version '3' not found in registry {file_registry.url}" in message
    assert "versions available: 2.0" in message
    assert file_registry.url.startswith("file:///")


def test_missing_model_names_the_models_available(file_registry: FileRegistry) -> None:
    with pytest.raises(
        RegistryError, match=rf"model 'nope' not found in registry file://.*available: {CLS_NAME}"
    ):
        file_registry.get_manifest("nope", "1")
    with pytest.raises(RegistryError, match="model 'nope' not found"):
        file_registry.list_versions("nope")


def test_missing_registry_directory(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "absent")
    with pytest.raises(RegistryError, match="does not exist"):
        registry.get_manifest("m", "1")


def test_version_without_manifest_is_invisible(file_registry: FileRegistry) -> None:
    half = file_registry.root / CLS_NAME / "3"
    half.mkdir()
    (half / "model.onnx").write_bytes(b"partial")
    assert file_registry.list_versions(CLS_NAME) == ["2.0"]
    with pytest.raises(RegistryError, match=r"version '3' .* has no manifest.json"):
        file_registry.get_manifest(CLS_NAME, "3")


def test_missing_artifact_file(file_registry: FileRegistry, cls_manifest: Manifest) -> None:
    artifact = cls_manifest.artifacts[0]
    (file_registry.root / CLS_NAME / CLS_VERSION / artifact.file).unlink()
    with pytest.raises(RegistryError, match=rf"artifact {artifact.file} of {CLS_NAME}@2.0 is missing"):
        file_registry.open_artifact(CLS_NAME, CLS_VERSION, artifact)


def test_versions_sort_naturally(tmp_path: Path, cls_model_path: Path) -> None:
    registry = FileRegistry(tmp_path / "reg")
    for version in ["10", "2", "1.10", "1.9"]:
        registry.publish(cls_model_path, "m", version)
    assert registry.list_versions("m") == ["1.9", "1.10", "2", "10"]


def test_manifest_stored_under_the_wrong_version_is_refused(file_registry: FileRegistry) -> None:
    src = file_registry.root / CLS_NAME / CLS_VERSION
    dst = file_registry.root / CLS_NAME / "9"
    dst.mkdir()
    (dst / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
    with pytest.raises(RegistryError, match=r"describes pp-ocr-cls@2.0 but is stored as pp-ocr-cls@9"):
        file_registry.get_manifest(CLS_NAME, "9")


# --- manifest parsing --------------------------------------------------------------------------


def test_bad_manifest_json_in_the_registry_names_file_and_position(file_registry: FileRegistry) -> None:
    path = file_registry.root / CLS_NAME / CLS_VERSION / "manifest.json"
    path.write_text('{"schema_version": 1,\n  "name": }')
    with pytest.raises(RegistryError) as info:
        file_registry.get_manifest(CLS_NAME, CLS_VERSION)
    message = str(info.value)
    assert str(path) in message
    assert "not valid JSON" in message and "line 2" in message


def test_manifest_missing_key_names_the_key_path() -> None:
    doc = _manifest_dict()
    artifacts = doc["artifacts"]
    assert isinstance(artifacts, list)
    del artifacts[0]["sha256"]
    message = _parse_error(doc)
    assert "artifacts[0].sha256: required key is missing" in message

    doc = _manifest_dict()
    del doc["created"]
    assert "created: required key is missing" in _parse_error(doc)


def test_manifest_bad_sha_names_the_key_path() -> None:
    bad = {"file": "model.onnx", "sha256": "ABC" + "0" * 61, "size": 10, "format": "onnx"}
    message = _parse_error(_manifest_dict(artifacts=[bad]))
    assert "artifacts[0].sha256: must be 64 lowercase hex digits" in message


def test_manifest_other_bad_fields() -> None:
    assert "unknown key" in _parse_error(_manifest_dict(extra_field=1))
    assert "schema_version" in _parse_error(_manifest_dict(schema_version=2))
    assert "name" in _parse_error(_manifest_dict(name="has space"))
    assert "created: must be in UTC" in _parse_error(_manifest_dict(created="2024-05-01T12:00:00+02:00"))
    assert "created: must be an ISO 8601 time" in _parse_error(_manifest_dict(created="yesterday"))
    assert "artifacts: " in _parse_error(_manifest_dict(artifacts=[]))
    for bad_file in ["../model.onnx", "sub/model.onnx", "manifest.json", ".hidden"]:
        art = {"file": bad_file, "sha256": "a" * 64, "size": 1, "format": "onnx"}
        assert "artifacts[0].file" in _parse_error(_manifest_dict(artifacts=[art]))
    art = {"file": "m.onnx", "sha256": "a" * 64, "size": -1, "format": "onnx"}
    assert "artifacts[0].size" in _parse_error(_manifest_dict(artifacts=[art]))
    art = {"file": "m.onnx", "sha256": "a" * 64, "size": "10", "format": "onnx"}
    assert "artifacts[0].size" in _parse_error(_manifest_dict(artifacts=[art]))
    art = {"file": "m.pt", "sha256": "a" * 64, "size": 1, "format": "pytorch"}
    assert "artifacts[0].format" in _parse_error(_manifest_dict(artifacts=[art]))
    assert "(top level)" in _parse_error(b"[1, 2]")
    assert "not valid JSON" in _parse_error(b"\xff\xfe\x00garbage")


def test_manifest_round_trips_and_keeps_defaults() -> None:
    manifest = Manifest.parse_bytes(json.dumps(_manifest_dict(metadata={"labels": ["a"]})).encode(), "x")
    assert manifest.artifacts[0].target == "any"
    assert Manifest.parse_bytes(manifest.to_bytes(), "y") == manifest
    assert manifest.primary("onnx").file == "model.onnx"
    with pytest.raises(KeyError, match="no tflite artifact"):
        manifest.primary("tflite")


# --- open_registry -----------------------------------------------------------------------------


def test_open_registry_dispatches_by_scheme(file_registry: FileRegistry) -> None:
    registry = open_registry(file_registry.url)
    assert isinstance(registry, FileRegistry)
    assert isinstance(registry, Registry)
    assert registry.root == file_registry.root
    assert registry.list_versions(CLS_NAME) == [CLS_VERSION]
    assert open_registry("file://localhost" + str(file_registry.root)).list_versions(CLS_NAME) == [
        CLS_VERSION
    ]

    assert isinstance(open_registry("https://models.example.com/"), HttpRegistry)
    assert isinstance(open_registry("http://127.0.0.1:8080/registry"), HttpRegistry)
    oci = open_registry("oci://ghcr.io/acme/models")
    assert isinstance(oci, OciRegistry) and isinstance(oci, Registry)
    with pytest.raises(RegistryError, match="scheme 'ftp'"):
        open_registry("ftp://x/")
    with pytest.raises(RegistryError, match="no scheme"):
        open_registry("/srv/registry")
    with pytest.raises(RegistryError, match="names host 'srv'"):
        open_registry("file://srv/registry")
