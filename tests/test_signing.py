"""Signed manifests: keys, signatures, the trust policy, and what the store and the CLI do with them.

Real ed25519 keys (made by the agent and by openssl), a real ONNX model in a real file registry
and the same registry served over HTTP; every refusal leaves nothing downloaded and the version
the store already had still served."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import RegistryConfig, TrustedKey
from agent.config_loader import load_config
from agent.errors import ConfigError, IntegrityError
from agent.registry import FileRegistry, HttpRegistry, PublishOptions
from agent.registry.manifest import MANIFEST_FILE, SIGNATURE_FILE
from agent.registry.signing import (
    SignatureError,
    TrustPolicy,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    parse_signatures,
    signature_document,
)
from agent.store import ModelStore, store_for
from tests.agent_process import StartAgent, pipeline_state, read_status
from tests.cli_runs import edge_agent
from tests.media_fixtures import CLS_PREPROCESS, demo_video_module
from tests.registry_server import RegistryServer
from tests.store_fixtures import CLS_NAME, CLS_VERSION
from tests.waits import free_port


def _keys(tmp_path: Path, name: str) -> tuple[Path, Path, str]:
    private = tmp_path / "keys" / name
    kid, public = generate_key(private)
    return private, public, kid


def _trust(*entries: tuple[Path, list[str]]) -> TrustPolicy:
    return TrustPolicy.from_config([TrustedKey(key=path, models=models) for path, models in entries])


@pytest.fixture
def release_key(tmp_path: Path) -> tuple[Path, Path, str]:
    return _keys(tmp_path, "release.key")


@pytest.fixture
def signed_registry(
    tmp_path: Path, cls_model_path: Path, release_key: tuple[Path, Path, str]
) -> FileRegistry:
    """pp-ocr-cls 2.0 published unsigned (file_registry's way) and 2.1 published signed."""
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(metadata={"labels": ["0", "180"]}))
    registry.publish(
        cls_model_path,
        CLS_NAME,
        "2.1",
        PublishOptions(metadata={"labels": ["0", "180"]}, sign_with=load_private_key(release_key[0])),
    )
    return registry


def _blobs(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.blobs_dir.iterdir()) if store.blobs_dir.is_dir() else []


# --- keys ----------------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads_and_a_public_key(tmp_path: Path) -> None:
    private, public, kid = _keys(tmp_path, "k")
    assert private.stat().st_mode & 0o777 == 0o600
    assert public == tmp_path / "keys" / "k.pub"
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert key_id(load_public_key(public)) == kid == key_id(load_private_key(private).public_key())
    assert len(kid) == 16
    with pytest.raises(Exception, match="exists; refusing to overwrite a key"):
        generate_key(private)
    assert generate_key(private, force=True)[0] != kid


def test_keys_from_openssl_sign_and_our_signatures_verify_with_openssl(
    tmp_path: Path, signed_registry: FileRegistry
) -> None:
    """The formats are the standard ones: openssl alone can make a key and check a signature."""
    openssl_key = tmp_path / "openssl.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(openssl_key)], check=True)
    kid = signed_registry.sign(CLS_NAME, CLS_VERSION, load_private_key(openssl_key))

    version_dir = signed_registry.root / CLS_NAME / CLS_VERSION
    document = json.loads((version_dir / SIGNATURE_FILE).read_text())
    assert [s["key_id"] for s in document["signatures"]] == [kid]
    raw_signature = tmp_path / "sig.bin"
    raw_signature.write_bytes(base64.b64decode(document["signatures"][0]["signature"]))
    public = tmp_path / "openssl.pub"
    subprocess.run(["openssl", "pkey", "-in", str(openssl_key), "-pubout", "-out", str(public)], check=True)
    verify = [
        "openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(public), "-rawin",
        "-in", str(version_dir / MANIFEST_FILE), "-sigfile", str(raw_signature),
    ]  # fmt: skip
    result = subprocess.run(verify, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "Signature Verified Successfully" in result.stdout, result.stderr
    # ... and openssl refuses it over other bytes.
    other = tmp_path / "other.json"
    other.write_bytes((version_dir / MANIFEST_FILE).read_bytes().replace(b"180", b"181"))
    verify[verify.index(str(version_dir / MANIFEST_FILE))] = str(other)
    assert subprocess.run(verify, capture_output=True, check=False).returncode != 0


# --- the trust policy in the store ------------------------------------------------------------------


def test_a_signed_version_is_pulled_and_its_signature_kept_byte_for_byte(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    _private, public, kid = release_key
    store = ModelStore(tmp_path / "store", trust=_trust((public, ["*"])))
    installed = store.pull(signed_registry, CLS_NAME, "2.1")
    assert installed.signed_by == kid
    published = signed_registry.root / CLS_NAME / "2.1"
    kept = store.models_dir / CLS_NAME / "2.1"
    for file in (MANIFEST_FILE, SIGNATURE_FILE):
        assert (kept / file).read_bytes() == (published / file).read_bytes()
    assert store.get(CLS_NAME, "2.1").signed_by == kid
    assert store.verify(CLS_NAME, "2.1") == []


def test_without_trusted_keys_unsigned_and_signed_versions_are_both_accepted(
    tmp_path: Path, signed_registry: FileRegistry
) -> None:
    store = ModelStore(tmp_path / "store")
    assert store.pull(signed_registry, CLS_NAME, CLS_VERSION).signed_by is None
    assert store.pull(signed_registry, CLS_NAME, "2.1").signed_by is None  # not checked: nothing required


def test_an_unsigned_version_is_refused_before_any_artifact_is_downloaded(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    with pytest.raises(SignatureError) as caught:
        store.pull(signed_registry, CLS_NAME, CLS_VERSION)
    manifest_path = signed_registry.root / CLS_NAME / CLS_VERSION / MANIFEST_FILE
    assert caught.value.message == (
        f"manifest {manifest_path} is unsigned, and this agent runs only signed models "
        "(registry.trusted_keys lists 1 key(s))"
    )
    assert "registry sign" in (caught.value.hint or "")
    assert _blobs(store) == []
    assert store.list() == []


def test_a_key_that_is_not_trusted_is_refused(tmp_path: Path, signed_registry: FileRegistry) -> None:
    _private, other_public, _kid = _keys(tmp_path, "other.key")
    store = ModelStore(tmp_path / "store", trust=_trust((other_public, ["*"])))
    with pytest.raises(
        SignatureError,
        match=r"no valid signature by a key trusted for 'pp-ocr-cls': key [0-9a-f]{16} is not trusted",
    ):
        store.pull(signed_registry, CLS_NAME, "2.1")
    assert _blobs(store) == []


def test_keys_are_trusted_only_for_the_model_names_they_are_scoped_to(
    tmp_path: Path, cls_model_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    private, public, kid = release_key
    signed_registry.publish(
        cls_model_path, "face-detector", "1", PublishOptions(sign_with=load_private_key(private))
    )
    store = ModelStore(tmp_path / "store", trust=_trust((public, ["pp-ocr-*", "text-*"])))
    assert store.pull(signed_registry, CLS_NAME, "2.1").signed_by == kid
    with pytest.raises(SignatureError) as caught:
        store.pull(signed_registry, "face-detector", "1")
    assert (
        f"key {kid} ({public}) is trusted only for models matching pp-ocr-*, text-*, not 'face-detector'"
        in (caught.value.message)
    )


def test_a_manifest_changed_after_signing_is_refused(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    """Tampered: same JSON structure, one label changed (still a valid manifest)."""
    path = signed_registry.root / CLS_NAME / "2.1" / MANIFEST_FILE
    path.write_bytes(path.read_bytes().replace(b'"180"', b'"90"'))
    assert signed_registry.get_manifest(CLS_NAME, "2.1").metadata["labels"] == ["0", "90"]
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    with pytest.raises(SignatureError, match="does not match the signed bytes"):
        store.pull(signed_registry, CLS_NAME, "2.1")
    assert _blobs(store) == []


def test_an_artifact_changed_after_signing_is_refused_by_its_hash(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    """The signature still verifies: the manifest is intact, the file it pins is not."""
    model = next((signed_registry.root / CLS_NAME / "2.1").glob("*.onnx"))
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        store.pull(signed_registry, CLS_NAME, "2.1")
    assert store.list() == []


def test_a_rotated_key_signs_beside_the_old_one_and_either_is_enough(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    new_private, new_public, new_kid = _keys(tmp_path, "new.key")
    signed_registry.sign(CLS_NAME, "2.1", load_private_key(new_private))
    document = (signed_registry.root / CLS_NAME / "2.1" / SIGNATURE_FILE).read_bytes()
    assert [s.key_id for s in parse_signatures(document, "test")] == [release_key[2], new_kid]
    only_new = ModelStore(tmp_path / "new-store", trust=_trust((new_public, ["*"])))
    assert only_new.pull(signed_registry, CLS_NAME, "2.1").signed_by == new_kid
    only_old = ModelStore(tmp_path / "old-store", trust=_trust((release_key[1], ["*"])))
    assert only_old.pull(signed_registry, CLS_NAME, "2.1").signed_by == release_key[2]
    # Signing again with the same key replaces its signature instead of adding a second one.
    signed_registry.sign(CLS_NAME, "2.1", load_private_key(new_private))
    again = (signed_registry.root / CLS_NAME / "2.1" / SIGNATURE_FILE).read_bytes()
    assert len(parse_signatures(again, "test")) == 2


def _one_signature(**entry: object) -> bytes:
    fields = {"algorithm": "ed25519", "key_id": "a", "signature": "", **entry}
    return json.dumps({"schema_version": 1, "signatures": [fields]}).encode()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not json", "invalid signature file of manifest .*: Expecting value"),
        (b"[]", 'expected an object with "schema_version": 1'),
        (b'{"schema_version": 1, "signatures": []}', '"signatures" must be a non-empty list'),
        (_one_signature(algorithm="rsa"), r"signatures\[0\].algorithm must be 'ed25519', got 'rsa'"),
        (_one_signature(key_id=7), r"signatures\[0\].key_id must be a non-empty string"),
        (_one_signature(signature="!!"), r"signatures\[0\].signature is not valid base64"),
        (_one_signature(signature="AAAA"), r"signatures\[0\].signature has 3 bytes; an ed25519 one has 64"),
        (b"\xff\xfe\x00garbage", "invalid signature file"),
    ],
)
def test_a_garbage_signature_file_is_refused_naming_what_is_wrong(
    tmp_path: Path,
    signed_registry: FileRegistry,
    release_key: tuple[Path, Path, str],
    content: bytes,
    problem: str,
) -> None:
    (signed_registry.root / CLS_NAME / "2.1" / SIGNATURE_FILE).write_bytes(content)
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    with pytest.raises(SignatureError, match=problem):
        store.pull(signed_registry, CLS_NAME, "2.1")
    assert _blobs(store) == []


def test_a_forged_signature_by_the_trusted_key_id_is_refused(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    """Someone copies the trusted key's id next to 64 bytes of their own."""
    from agent.registry.signing import Signature

    forged = signature_document([Signature(release_key[2], bytes(range(64)))])
    (signed_registry.root / CLS_NAME / "2.1" / SIGNATURE_FILE).write_bytes(forged)
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    with pytest.raises(SignatureError, match="they were changed after signing, or the signature is forged"):
        store.pull(signed_registry, CLS_NAME, "2.1")


def test_the_installed_copy_is_checked_each_time_it_is_served(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    """Someone edits the manifest in the store: get() refuses it, verify() names it, pull() repairs it."""
    store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
    store.pull(signed_registry, CLS_NAME, "2.1")
    copy = store.models_dir / CLS_NAME / "2.1" / MANIFEST_FILE
    copy.write_bytes(copy.read_bytes().replace(b'"180"', b'"90"'))
    with pytest.raises(
        SignatureError, match=f"installed copy of {CLS_NAME}@2.1: manifest {copy} has no valid"
    ):
        store.get(CLS_NAME, "2.1")
    problems = store.verify(CLS_NAME, "2.1")
    assert len(problems) == 1 and "does not match the signed bytes" in problems[0]
    repaired = store.pull(signed_registry, CLS_NAME, "2.1")
    assert repaired.manifest.metadata["labels"] == ["0", "180"]
    assert store.verify(CLS_NAME, "2.1") == []


def test_a_version_installed_before_signatures_were_required_is_fetched_again_signed(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    private, public, kid = release_key
    ModelStore(tmp_path / "store").pull(signed_registry, CLS_NAME, CLS_VERSION)  # unsigned, no trust yet
    strict = ModelStore(tmp_path / "store", trust=_trust((public, ["*"])))
    with pytest.raises(SignatureError, match="is unsigned"):
        strict.get(CLS_NAME, CLS_VERSION)
    signed_registry.sign(CLS_NAME, CLS_VERSION, load_private_key(private))
    assert strict.pull(signed_registry, CLS_NAME, CLS_VERSION).signed_by == kid


def test_a_forced_republish_drops_the_signature_of_the_old_bytes(
    cls_model_path: Path, signed_registry: FileRegistry
) -> None:
    signed_registry.publish(
        cls_model_path, CLS_NAME, "2.1", PublishOptions(metadata={"labels": ["a", "b"]}, force=True)
    )
    assert signed_registry.fetch_manifest(CLS_NAME, "2.1").signature is None


def test_over_http_the_signature_file_is_fetched_beside_the_manifest(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    server = RegistryServer(signed_registry.root)
    try:
        registry = HttpRegistry(server.url)
        store = ModelStore(tmp_path / "store", trust=_trust((release_key[1], ["*"])))
        assert store.pull(registry, CLS_NAME, "2.1").signed_by == release_key[2]
        with pytest.raises(
            SignatureError, match=rf"manifest {server.url}/{CLS_NAME}/2.0/manifest.json is unsigned"
        ):
            store.pull(registry, CLS_NAME, CLS_VERSION)
        assert [s.status for s in server.served(SIGNATURE_FILE)] == [200, 404]
        registry.close()
    finally:
        server.close()


# --- configuration -------------------------------------------------------------------------------


def test_a_trusted_key_file_that_is_not_a_public_key_is_a_config_error(tmp_path: Path) -> None:
    private, public, _kid = _keys(tmp_path, "k")
    missing = tmp_path / "missing.pub"
    config = RegistryConfig(
        url="file:///srv/registry",
        trusted_keys=[TrustedKey(key=public), TrustedKey(key=private), TrustedKey(key=missing)],
    )
    with pytest.raises(ConfigError) as caught:
        TrustPolicy.from_config(config.trusted_keys)
    assert caught.value.problems[0].startswith(
        f"registry.trusted_keys[1].key: {private} is not a PEM public key"
    )
    assert caught.value.problems[1] == (
        f"registry.trusted_keys[2].key: cannot read the public key {missing}: No such file or directory"
    )


def test_the_agent_store_takes_its_trusted_keys_from_the_config(
    tmp_path: Path, signed_registry: FileRegistry, release_key: tuple[Path, Path, str]
) -> None:
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(
        f"device: {{id: box-1}}\nstate_dir: {tmp_path / 'state'}\n"
        f"registry:\n  url: {signed_registry.url}\n  trusted_keys:\n"
        f"    - key: {release_key[1]}\n      models: ['pp-ocr-*']\n"
    )
    store = store_for(load_config(config_path))
    assert store.trust.required
    assert store.pull(signed_registry, CLS_NAME, "2.1").signed_by == release_key[2]


# --- the CLI --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_keygen_publish_sign_and_verify(tmp_path: Path, cls_model_path: Path) -> None:
    key = tmp_path / "release.key"
    made = edge_agent("registry", "keygen", str(key), "--json")
    assert made.returncode == 0, made.stderr
    kid = json.loads(made.stdout)["key_id"]
    refused = edge_agent("registry", "keygen", str(key))
    assert refused.returncode == 1 and "exists; refusing to overwrite a key" in refused.stderr

    registry = f"file://{tmp_path / 'registry'}"
    published = edge_agent(
        "registry", "publish", str(cls_model_path), "--name", CLS_NAME, "--version", "1",
        "--registry", registry, "--sign", str(key), "--json",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["signed_by"] == kid
    unsigned = edge_agent(
        "registry",
        "publish",
        str(cls_model_path),
        "--name",
        CLS_NAME,
        "--version",
        "2",
        "--registry",
        registry,
    )
    assert unsigned.returncode == 0, unsigned.stderr

    second = tmp_path / "second.key"
    second_kid = json.loads(edge_agent("registry", "keygen", str(second), "--json").stdout)["key_id"]
    signed = edge_agent("registry", "sign", f"{CLS_NAME}@2", "--registry", registry, "--key", str(second))
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.strip() == f"signed {CLS_NAME}@2 in {registry} with key {second_kid}"

    config = tmp_path / "agent.yaml"
    config.write_text(
        f"device: {{id: box-1}}\nstate_dir: {tmp_path / 'state'}\nregistry:\n  url: {registry}\n"
        f"  trusted_keys: [{{key: {key}.pub}}, {{key: {second}.pub}}]\n"
        "pipelines:\n"
        + "".join(
            f"  - name: p{v}\n    source: {{type: video, uri: 'file:///dev/null'}}\n"
            f"    model: {{name: {CLS_NAME}, version: '{v}'}}\n    postprocess: {{type: raw}}\n"
            for v in ("1", "2")
        )
    )
    pulled = edge_agent("models", "pull", "-c", str(config), "--json")
    assert pulled.returncode == 0, pulled.stderr
    verified = edge_agent("models", "verify", "-c", str(config), "--json")
    assert verified.returncode == 0, verified.stderr
    assert [(r["version"], r["ok"], r["signed_by"]) for r in json.loads(verified.stdout)] == [
        ("1", True, kid),
        ("2", True, second_kid),
    ]
    listed = json.loads(edge_agent("models", "list", "-c", str(config), "--json").stdout)
    assert [r["signed_by"] for r in listed] == [kid, second_kid]

    # Someone edits an installed manifest: verify says which and why, exit 1.
    copy = tmp_path / "state" / "store" / "models" / CLS_NAME / "2" / MANIFEST_FILE
    copy.write_bytes(copy.read_bytes().replace(b'"created"', b'"created" '))
    failed = edge_agent("models", "verify", "-c", str(config))
    assert failed.returncode == 1
    assert (
        failed.stdout.strip()
        == f"ok: {CLS_NAME}@1 (every artifact's sha256 matches, signed by trusted key {kid})"
    )
    assert (
        f"FAILED: {CLS_NAME}@2: installed copy of {CLS_NAME}@2: manifest {copy} has no valid signature"
        in (failed.stderr)
    )


def test_cli_publish_with_a_key_that_is_not_one_copies_nothing(tmp_path: Path, cls_model_path: Path) -> None:
    not_a_key = tmp_path / "model-as-key"
    shutil.copy(cls_model_path, not_a_key)
    registry = tmp_path / "registry"
    result = edge_agent(
        "registry", "publish", str(cls_model_path), "--name", CLS_NAME, "--version", "1",
        "--registry", f"file://{registry}", "--sign", str(not_a_key),
    )  # fmt: skip
    assert result.returncode == 1
    assert f"error: {not_a_key} is not an unencrypted PEM private key" in result.stderr
    assert "Traceback" not in result.stderr
    assert not registry.exists()


# --- the daemon ----------------------------------------------------------------------------------


def test_the_daemon_runs_the_signed_version_and_refuses_the_unsigned_one(
    tmp_path: Path,
    signed_registry: FileRegistry,
    release_key: tuple[Path, Path, str],
    start_agent: StartAgent,
) -> None:
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    state_dir = tmp_path / "state"

    def pipeline(name: str, version: str) -> dict[str, object]:
        return {
            "name": name,
            "model": {"name": CLS_NAME, "version": version},
            "source": {"type": "video", "uri": str(video), "loop": True},
            "preprocess": CLS_PREPROCESS.model_dump(),
            "postprocess": {"type": "classification", "softmax": False},
        }

    config = {
        "device": {"id": "signed-box"},
        "state_dir": str(state_dir),
        "mqtt": {"host": "127.0.0.1", "port": free_port(), "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": signed_registry.url, "trusted_keys": [{"key": str(release_key[1])}]},
        "backends": {"benchmark": False},
        "pipelines": [pipeline("signed", "2.1"), pipeline("unsigned", CLS_VERSION)],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))

    def unsigned_error() -> str:
        shown = read_status(state_dir).get("pipelines", {}).get("unsigned", {}).get("error")
        return str(shown or "")

    agent = start_agent(path)
    log = agent.run_until(
        lambda: pipeline_state(state_dir, "signed") == "running" and "is unsigned" in unsigned_error(),
        "the signed pipeline running and the unsigned one refused",
    )
    assert f"{CLS_NAME}@2.1 is signed by trusted key {release_key[2]}" in log
    assert "this agent runs only signed models" in unsigned_error()
    store = ModelStore(state_dir / "store")
    assert [m.version for m in store.list()] == ["2.1"]  # nothing of the unsigned version was stored
