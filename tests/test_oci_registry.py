"""OCI registries: the real CNCF distribution registry (Debian's docker-registry) on loopback over TLS
with a CA made at test time, with htpasswd (Basic) auth or behind a token server (Bearer
challenges); push and pull by tag and by digest; interop both ways with the `oras` Python package."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import oras.client
import pytest

from agent.config import RegistryConnection, TrustedKey
from agent.errors import IntegrityError, RegistryError, StoreError
from agent.registry import FileRegistry, OciRegistry, PublishOptions, open_registry
from agent.registry.manifest import MANIFEST_FILE, SIGNATURE_FILE
from agent.registry.oci_registry import EDGE_MANIFEST, OciReference
from agent.registry.publish import sign_version
from agent.registry.signing import SignatureError, TrustPolicy, generate_key, load_private_key
from agent.store import ModelStore
from tests.agent_process import StartAgent, pipeline_state
from tests.media_fixtures import CLS_PREPROCESS, demo_video_module
from tests.oci_registry import PASSWORD, USER, DistributionRegistry
from tests.pki import Pki
from tests.store_fixtures import CLS_MODEL_FILE, CLS_NAME, CLS_VERSION
from tests.waits import free_port


def _settings(tmp_path: Path, pki: Pki, **overrides: object) -> RegistryConnection:
    password = tmp_path / "registry.pw"
    password.write_text(PASSWORD + "\n")
    values: dict[str, object] = {
        "username": USER,
        "password_file": password,
        "ca_file": pki.ca,
        "retries": 1,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
    }
    return RegistryConnection.model_validate({**values, **overrides})


@pytest.fixture
def signing_key(tmp_path: Path) -> tuple[Path, Path, str]:
    private = tmp_path / "keys" / "release.key"
    kid, public = generate_key(private)
    return private, public, kid


@pytest.fixture
def staged(tmp_path: Path, cls_model_path: Path, signing_key: tuple[Path, Path, str]) -> FileRegistry:
    """pp-ocr-cls 2.0 published (signed) in a folder, ready to push."""
    registry = FileRegistry(tmp_path / "staged")
    options = PublishOptions(metadata={"labels": ["0", "180"]}, sign_with=load_private_key(signing_key[0]))
    registry.publish(cls_model_path, CLS_NAME, CLS_VERSION, options)
    return registry


def _push(oci: OciRegistry, staged: FileRegistry, name: str = CLS_NAME, version: str = CLS_VERSION) -> str:
    document = staged.fetch_manifest(name, version)
    files = {a.file: staged.root / name / version / a.file for a in document.manifest.artifacts}
    return oci.push(document, files)


@pytest.fixture
def oci(oci_registry: DistributionRegistry, tmp_path: Path, pki: Pki) -> Iterator[OciRegistry]:
    registry = OciRegistry(f"oci://{oci_registry.host}/edge", _settings(tmp_path, pki))
    yield registry
    registry.close()


def test_push_then_pull_by_tag_and_by_digest(
    oci: OciRegistry, staged: FileRegistry, tmp_path: Path, signing_key: tuple[Path, Path, str]
) -> None:
    digest = _push(oci, staged)
    assert oci.list_versions(CLS_NAME) == [CLS_VERSION]
    assert oci.has_version(CLS_NAME, CLS_VERSION) and not oci.has_version(CLS_NAME, "9")
    trust = TrustPolicy.from_config([TrustedKey(key=signing_key[1])])

    by_tag = ModelStore(tmp_path / "by-tag", trust=trust).pull(oci, CLS_NAME, CLS_VERSION)
    assert by_tag.signed_by == signing_key[2]
    published = staged.root / CLS_NAME / CLS_VERSION
    assert by_tag.primary()[1].read_bytes() == (published / CLS_MODEL_FILE).read_bytes()
    kept = tmp_path / "by-tag" / "models" / CLS_NAME / CLS_VERSION
    for file in (MANIFEST_FILE, SIGNATURE_FILE):  # the signed bytes, carried through OCI unchanged
        assert (kept / file).read_bytes() == (published / file).read_bytes()

    by_digest = ModelStore(tmp_path / "by-digest", trust=trust).pull(
        oci, CLS_NAME, CLS_VERSION, digest=digest
    )
    assert by_digest.manifest == by_tag.manifest
    other = "sha256:" + hashlib.sha256(b"another manifest").hexdigest()
    with pytest.raises(RegistryError, match=f"oci://{oci.url[6:]}/{CLS_NAME}@{other} not found"):
        ModelStore(tmp_path / "wrong-digest").pull(oci, CLS_NAME, CLS_VERSION, digest=other)


def test_a_token_server_behind_a_bearer_challenge(
    oci_token_registry: DistributionRegistry, staged: FileRegistry, tmp_path: Path, pki: Pki
) -> None:
    """As Docker Hub, GHCR and Harbor do it: 401 with `Bearer realm=...,scope=...`, a token for the
    scope from the realm (basic credentials), then the request again with the token."""
    token_server = oci_token_registry.token_server
    assert token_server is not None
    registry = OciRegistry(f"oci://{oci_token_registry.host}/fleet", _settings(tmp_path, pki))
    _push(registry, staged)
    # The scope a push asks for (the registry lists the actions in either order).
    scopes = [
        (scope.rsplit(":", 1)[0], set(scope.rsplit(":", 1)[1].split(","))) for [scope] in token_server.issued
    ]
    assert ("repository:fleet/pp-ocr-cls", {"pull", "push"}) in scopes
    installed = ModelStore(tmp_path / "store").pull(registry, CLS_NAME, CLS_VERSION)
    assert installed.manifest.metadata == {"labels": ["0", "180"]}
    issued = len(token_server.issued)
    ModelStore(tmp_path / "another-store").pull(registry, CLS_NAME, CLS_VERSION)
    assert len(token_server.issued) == issued  # the token is reused for the repository
    registry.close()

    wrong = tmp_path / "wrong.pw"
    wrong.write_text("guess")
    refused = OciRegistry(
        f"oci://{oci_token_registry.host}/fleet", _settings(tmp_path, pki, password_file=wrong)
    )
    with pytest.raises(RegistryError) as caught:
        refused.get_manifest(CLS_NAME, CLS_VERSION)
    assert f"the registry's token server {token_server.realm} refused repository:fleet/pp-ocr-cls:pull" in (
        caught.value.message
    )
    assert "guess" not in str(caught.value) and PASSWORD not in str(caught.value)


def test_basic_auth_without_or_with_wrong_credentials_is_refused_by_name(
    oci: OciRegistry, oci_registry: DistributionRegistry, staged: FileRegistry, tmp_path: Path, pki: Pki
) -> None:
    _push(oci, staged)
    anonymous = OciRegistry(f"oci://{oci_registry.host}/edge", RegistryConnection(ca_file=pki.ca, retries=0))
    with pytest.raises(RegistryError) as caught:
        anonymous.get_manifest(CLS_NAME, CLS_VERSION)
    assert caught.value.message.startswith(
        f"registry refused https://{oci_registry.host}/v2/edge/pp-ocr-cls/manifests/2.0: 401 Unauthorized"
    )
    assert "password_file" in (caught.value.hint or "")


def test_a_registry_certificate_from_an_unknown_ca_is_refused(
    oci_registry: DistributionRegistry, tmp_path: Path, pki: Pki
) -> None:
    for settings in (_settings(tmp_path, pki, ca_file=None), _settings(tmp_path, pki, ca_file=pki.other_ca)):
        registry = OciRegistry(f"oci://{oci_registry.host}/edge", settings)
        with pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED"):
            registry.list_versions(CLS_NAME)


# --- interop with oras ------------------------------------------------------------------------------


def _oras(registry: DistributionRegistry, pki: Pki) -> oras.client.OrasClient:
    client = oras.client.OrasClient(hostname=registry.host, tls_verify=str(pki.ca), auth_backend="basic")
    client.auth.set_basic_auth(USER, PASSWORD)
    return client


def test_what_oras_pushes_the_agent_pulls(
    oci: OciRegistry,
    oci_registry: DistributionRegistry,
    cls_model_path: Path,
    tmp_path: Path,
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`oras push host/edge/model:1 model.onnx inputs.npz notes.txt`: no edge-agent manifest; the
    agent builds one from the layers (the text file is not a model file: ignored)."""
    work = tmp_path / "oras-push"
    work.mkdir()
    (work / CLS_MODEL_FILE).write_bytes(cls_model_path.read_bytes())
    np.savez(work / "inputs.npz", x=np.zeros((1, 3, 48, 192), np.float32))
    (work / "notes.txt").write_text("trained on signs\n")
    monkeypatch.chdir(work)  # oras pushes files below the working directory only
    _oras(oci_registry, pki).push(
        target=f"{oci_registry.host}/edge/{CLS_NAME}:1.0",
        files=[CLS_MODEL_FILE, "inputs.npz", "notes.txt"],
        manifest_annotations={"org.opencontainers.image.created": "2026-11-20T08:00:00Z"},
    )
    document = oci.fetch_manifest(CLS_NAME, "1.0")
    assert document.signature is None
    manifest = document.manifest
    assert [(a.file, a.format) for a in manifest.artifacts] == [
        (CLS_MODEL_FILE, "onnx"),
        ("inputs.npz", "test-data"),
    ]
    assert manifest.created == "2026-11-20T08:00:00Z"
    installed = ModelStore(tmp_path / "store").pull(oci, CLS_NAME, "1.0")
    assert installed.primary()[1].read_bytes() == cls_model_path.read_bytes()
    # Pushed without a signature: a box that requires signatures refuses it.
    _kid, public = generate_key(tmp_path / "k")
    strict = ModelStore(tmp_path / "strict", trust=TrustPolicy.from_config([TrustedKey(key=public)]))
    with pytest.raises(SignatureError, match="is unsigned"):
        strict.pull(oci, CLS_NAME, "1.0")
    # `registry sign` blesses it: the manifest the agent read from its layers is pushed, signed.
    key_file = tmp_path / "k"
    kid, digest = sign_version(oci.url, CLS_NAME, "1.0", load_private_key(key_file), oci.settings)
    assert strict.pull(oci, CLS_NAME, "1.0", digest=digest).signed_by == kid


def test_what_the_agent_pushes_oras_pulls(
    oci: OciRegistry, oci_registry: DistributionRegistry, staged: FileRegistry, tmp_path: Path, pki: Pki
) -> None:
    _push(oci, staged)
    out = tmp_path / "oras-pull"
    pulled = _oras(oci_registry, pki).pull(
        target=f"{oci_registry.host}/edge/{CLS_NAME}:{CLS_VERSION}", outdir=str(out)
    )
    published = staged.root / CLS_NAME / CLS_VERSION
    assert sorted(Path(p).name for p in pulled) == sorted([CLS_MODEL_FILE, MANIFEST_FILE, SIGNATURE_FILE])
    for name in (CLS_MODEL_FILE, MANIFEST_FILE, SIGNATURE_FILE):
        assert (out / name).read_bytes() == (published / name).read_bytes()
    manifest = _oras(oci_registry, pki).get_manifest(f"{oci_registry.host}/edge/{CLS_NAME}:{CLS_VERSION}")
    assert manifest["artifactType"] == "application/vnd.edge-agent.model.v1"
    assert [layer["mediaType"] for layer in manifest["layers"]][-2] == EDGE_MANIFEST


# --- bad answers ------------------------------------------------------------------------------------


def _blob_file(registry: DistributionRegistry, digest: str) -> Path:
    """Where the distribution registry's filesystem storage keeps a blob's bytes."""
    hex_digest = digest.removeprefix("sha256:")
    return (
        registry.workdir
        / "storage"
        / "docker"
        / "registry"
        / "v2"
        / "blobs"
        / "sha256"
        / hex_digest[:2]
        / hex_digest
        / "data"
    )


def _put_manifest(
    registry: DistributionRegistry, pki: Pki, repository: str, tag: str, image: dict[str, object]
) -> None:
    """An image manifest written by hand (what a broken or hostile publisher could push)."""
    import ssl

    import httpx

    media_type = str(image.get("mediaType", "application/vnd.oci.image.manifest.v1+json"))
    response = httpx.put(
        f"https://{registry.host}/v2/{repository}/manifests/{tag}",
        content=json.dumps(image).encode(),
        headers={"Content-Type": media_type},
        auth=(USER, PASSWORD),
        verify=ssl.create_default_context(cafile=str(pki.ca)),
        timeout=30,
    )
    assert response.status_code == 201, response.text


@pytest.fixture
def serving(oci: OciRegistry, staged: FileRegistry, tmp_path: Path) -> ModelStore:
    """A store that installed 2.0 from the OCI registry; it keeps serving whatever later pulls do."""
    _push(oci, staged)
    store = ModelStore(tmp_path / "serving")
    store.pull(oci, CLS_NAME, CLS_VERSION)
    return store


def _still_serving(store: ModelStore) -> None:
    assert store.get(CLS_NAME, CLS_VERSION).manifest.metadata == {"labels": ["0", "180"]}
    assert [m.version for m in store.list()] == [CLS_VERSION]


def _image_of(oci: OciRegistry, version: str = CLS_VERSION) -> tuple[dict[str, object], str, int]:
    """The image manifest of a version, its digest and size."""
    import ssl

    import httpx

    host = oci.url.removeprefix("oci://").split("/")[0]
    assert oci.settings.ca_file is not None
    response = httpx.get(
        f"https://{host}/v2/edge/{CLS_NAME}/manifests/{version}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        auth=(USER, PASSWORD),
        verify=ssl.create_default_context(cafile=str(oci.settings.ca_file)),
        timeout=30,
    )
    image: dict[str, object] = response.json()
    return image, "sha256:" + hashlib.sha256(response.content).hexdigest(), len(response.content)


def test_a_layer_whose_blob_is_gone_is_named(
    oci: OciRegistry,
    oci_registry: DistributionRegistry,
    serving: ModelStore,
    staged: FileRegistry,
    tmp_path: Path,
) -> None:
    """2.1 is pushed, then its model blob disappears from the registry's storage."""
    other = tmp_path / "other.onnx"
    other.write_bytes((staged.root / CLS_NAME / CLS_VERSION / CLS_MODEL_FILE).read_bytes() + b"")
    import onnx

    model = onnx.load(str(other))
    onnx.helper.set_model_props(model, {"note": "2.1"})
    onnx.save(model, str(other))
    staged.publish(other, CLS_NAME, "2.1", PublishOptions(metadata={"labels": ["0", "180"]}))
    _push(oci, staged, version="2.1")
    sha = staged.get_manifest(CLS_NAME, "2.1").artifact("other.onnx").sha256
    _blob_file(oci_registry, "sha256:" + sha).unlink()
    with pytest.raises(RegistryError) as caught:
        serving.pull(oci, CLS_NAME, "2.1")
    assert caught.value.message == (
        f"artifact other.onnx of {CLS_NAME}@2.1: blob sha256:{sha} is missing from "
        f"{oci_registry.host}/edge/{CLS_NAME}"
    )
    _still_serving(serving)


def test_a_layer_whose_bytes_differ_from_its_digest_is_refused(
    oci: OciRegistry, oci_registry: DistributionRegistry, staged: FileRegistry, tmp_path: Path
) -> None:
    _push(oci, staged)
    document = staged.fetch_manifest(CLS_NAME, CLS_VERSION)
    model_blob = _blob_file(oci_registry, "sha256:" + document.manifest.primary().sha256)
    data = bytearray(model_blob.read_bytes())
    data[100] ^= 0xFF
    model_blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        ModelStore(tmp_path / "a").pull(oci, CLS_NAME, CLS_VERSION)
    manifest_blob = _blob_file(oci_registry, "sha256:" + hashlib.sha256(document.data).hexdigest())
    manifest_blob.write_bytes(document.data.replace(b'"180"', b'"190"'))
    fresh = OciRegistry(oci.url, oci.settings)  # no ETag cache: the bytes come again
    with pytest.raises(RegistryError, match=f"layer {MANIFEST_FILE} does not match its digest"):
        ModelStore(tmp_path / "b").pull(fresh, CLS_NAME, CLS_VERSION)
    fresh.close()


def test_hand_written_manifests_that_lie_are_refused(
    oci: OciRegistry,
    oci_registry: DistributionRegistry,
    serving: ModelStore,
    pki: Pki,
    staged: FileRegistry,
    cls_model_path: Path,
) -> None:
    image, image_digest, image_size = _image_of(oci)
    layers = image["layers"]
    assert isinstance(layers, list)
    repository = f"edge/{CLS_NAME}"

    # 2.0's image under another tag: its manifest.json is for another version.
    _put_manifest(oci_registry, pki, repository, "3", image)
    # manifest.json names a file no layer carries (the model layer left out of the image manifest).
    staged.publish(cls_model_path, CLS_NAME, "8")
    _push(oci, staged, version="8")
    image_8, _digest, _size = _image_of(oci, "8")
    layers_8 = image_8["layers"]
    assert isinstance(layers_8, list)
    _put_manifest(oci_registry, pki, repository, "8", {**image_8, "layers": layers_8[1:]})
    # A file name that climbs out of the version folder (oras-style, no manifest.json).
    evil = {**layers[0], "annotations": {"org.opencontainers.image.title": "../../etc/cron.d/x.onnx"}}
    _put_manifest(oci_registry, pki, repository, "4", {**image, "layers": [evil]})
    # A declared size that is not a byte count.
    _put_manifest(oci_registry, pki, repository, "5", {**image, "layers": [{**layers[0], "size": -1}]})
    # An image index (several platforms) instead of one artifact.
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": image_digest,
                "size": image_size,
            }
        ],
    }
    _put_manifest(oci_registry, pki, repository, "6", index)
    expected = {
        "3": f"it describes {CLS_NAME}@{CLS_VERSION}, not {CLS_NAME}@3",
        "8": f"its {MANIFEST_FILE} lists {CLS_MODEL_FILE}",
        "4": "must be a plain file name without '/'",
        "5": "layers[0].size -1 is not a byte count",
        "6": "is an image index (several platforms); the agent pulls single artifacts",
    }
    for tag, problem in expected.items():
        with pytest.raises(RegistryError) as caught:
            serving.pull(oci, CLS_NAME, tag)
        assert problem in caught.value.message, (tag, caught.value.message)
        assert f"oci://{oci_registry.host}/edge/{CLS_NAME}:{tag}" in caught.value.message
    _still_serving(serving)
    assert not list((serving.root).rglob("cron.d"))


def test_a_manifest_that_declares_more_than_the_disk_holds_is_refused_before_downloading(
    oci: OciRegistry, oci_registry: DistributionRegistry, serving: ModelStore, pki: Pki
) -> None:
    image, _digest, _size = _image_of(oci)
    layers = image["layers"]
    assert isinstance(layers, list)
    huge = {**layers[0], "size": 2**50, "annotations": {"org.opencontainers.image.title": "huge.onnx"}}
    # distribution checks that the blob exists, not its size: a lying manifest is accepted by it.
    _put_manifest(oci_registry, pki, f"edge/{CLS_NAME}", "7", {**image, "layers": [huge]})
    with pytest.raises(StoreError, match=r"needs 1,125,899,906,842,624 bytes, but the disk holding .* free"):
        serving.pull(oci, CLS_NAME, "7")
    _still_serving(serving)


def test_a_blob_download_resumes_at_an_offset(oci: OciRegistry, staged: FileRegistry) -> None:
    _push(oci, staged)
    artifact = staged.get_manifest(CLS_NAME, CLS_VERSION).primary()
    whole = (staged.root / CLS_NAME / CLS_VERSION / CLS_MODEL_FILE).read_bytes()
    start, stream = oci.open_artifact_at(CLS_NAME, CLS_VERSION, artifact, 200_000)
    with stream:
        assert start == 200_000 and stream.read() == whole[200_000:]
    validator = getattr(stream, "validator", None)
    assert validator  # the registry's ETag: If-Range on the next resume
    start, stream = oci.open_artifact_at(CLS_NAME, CLS_VERSION, artifact, 1000, '"changed"')
    with stream:
        assert start == 0 and stream.read() == whole


def test_references_and_registry_urls(tmp_path: Path) -> None:
    ref = OciReference.parse("oci://registry.example.com:5000/edge/pp-ocr-cls:2.0")
    assert (ref.host, ref.repository, ref.tag, ref.digest) == (
        "registry.example.com:5000",
        "edge/pp-ocr-cls",
        "2.0",
        None,
    )
    digest = "sha256:" + "a" * 64
    assert OciReference.parse(f"oci://ghcr.io/acme/det@{digest}").digest == digest
    assert str(OciReference.parse(f"oci://ghcr.io/acme/det@{digest}")) == f"oci://ghcr.io/acme/det@{digest}"
    assert isinstance(open_registry("oci://127.0.0.1:5000/edge"), OciRegistry)
    for bad, problem in [
        ("oci://host/Upper/case", "is not a valid OCI repository name"),
        ("oci://host/repo@sha256:abc", "is not sha256:<64 lowercase hex>"),
        ("oci://user:pw@host/repo", "put OCI credentials in registry.username"),
        ("oci:///repo", "is not an oci://host/repository reference"),
    ]:
        with pytest.raises(RegistryError, match=problem):
            OciReference.parse(bad)
    with pytest.raises(RegistryError, match="names a tag or digest"):
        OciRegistry("oci://host:5000/edge/model:1")
    with pytest.raises(RegistryError, match="cannot be part of an OCI repository name"):
        OciRegistry("oci://host:5000/edge").repository("UpperCase")


# --- the CLI and the daemon -------------------------------------------------------------------------


def test_cli_publishes_signs_and_pulls_through_an_oci_registry(
    oci_token_registry: DistributionRegistry,
    cls_model_path: Path,
    tmp_path: Path,
    pki: Pki,
    signing_key: tuple[Path, Path, str],
) -> None:
    from tests.cli_runs import edge_agent

    private, public, kid = signing_key
    password = tmp_path / "registry.pw"
    password.write_text(PASSWORD)
    url = f"oci://{oci_token_registry.host}/edge"
    credentials = ["--username", USER, "--password-file", str(password), "--ca-file", str(pki.ca)]
    publish = [
        "registry",
        "publish",
        str(cls_model_path),
        "--name",
        CLS_NAME,
        "--registry",
        url,
        *credentials,
    ]
    first = edge_agent(*publish, "--version", "1", "--sign", str(private), "--json")
    assert first.returncode == 0, first.stderr
    pushed = json.loads(first.stdout)
    assert pushed["signed_by"] == kid and pushed["digest"].startswith("sha256:")

    again = edge_agent(*publish, "--version", "1")
    assert again.returncode == 1
    assert f"error: model '{CLS_NAME}' version '1' already exists in registry {url}" in again.stderr

    unsigned = edge_agent(*publish, "--version", "2", "--json")
    assert unsigned.returncode == 0, unsigned.stderr
    signed = edge_agent(
        "registry", "sign", f"{CLS_NAME}@2", "--registry", url, "--key", str(private), *credentials
    )
    assert signed.returncode == 0, signed.stderr
    assert f"signed {CLS_NAME}@2 in {url} with key {kid}" in signed.stdout

    config = tmp_path / "agent.yaml"
    config.write_text(
        json.dumps(
            {
                "device": {"id": "oci-box"},
                "state_dir": str(tmp_path / "state"),
                "registry": {
                    "url": url, "username": USER, "password_file": str(password), "ca_file": str(pki.ca),
                    "trusted_keys": [{"key": str(public)}],
                },
                "pipelines": [
                    {
                        "name": f"p{version}",
                        "source": {"type": "video", "uri": "file:///dev/null"},
                        "model": {"name": CLS_NAME, "version": version, **pin},
                        "postprocess": {"type": "raw"},
                    }
                    for version, pin in (("1", {"digest": pushed["digest"]}), ("2", {}))
                ],
            }
        )
    )  # fmt: skip
    pulled = edge_agent("models", "pull", "-c", str(config), "--json")
    assert pulled.returncode == 0, pulled.stderr
    verified = edge_agent("models", "verify", "-c", str(config), "--json")
    assert [(r["version"], r["ok"], r["signed_by"]) for r in json.loads(verified.stdout)] == [
        ("1", True, kid),
        ("2", True, kid),
    ]


@pytest.mark.slow
def test_the_daemon_runs_a_signed_model_pinned_by_digest_from_an_oci_registry(
    oci_token_registry: DistributionRegistry,
    staged: FileRegistry,
    tmp_path: Path,
    pki: Pki,
    signing_key: tuple[Path, Path, str],
    start_agent: StartAgent,
) -> None:
    settings = _settings(tmp_path, pki)
    registry = OciRegistry(f"oci://{oci_token_registry.host}/edge", settings)
    digest = _push(registry, staged)
    registry.close()
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    state_dir = tmp_path / "state"
    config = {
        "device": {"id": "oci-box"},
        "state_dir": str(state_dir),
        "mqtt": {"host": "127.0.0.1", "port": free_port(), "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {
            "url": registry.url,
            **settings.model_dump(mode="json", include={"username", "password_file", "ca_file"}),
            "trusted_keys": [{"key": str(signing_key[1])}],
        },
        "backends": {"benchmark": False},
        "pipelines": [
            {
                "name": "door",
                "model": {"name": CLS_NAME, "version": CLS_VERSION, "digest": digest},
                "source": {"type": "video", "uri": str(video), "loop": True},
                "preprocess": CLS_PREPROCESS.model_dump(),
                "postprocess": {"type": "classification", "softmax": False},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    log = start_agent(path).run_until(
        lambda: pipeline_state(state_dir, "door") == "running", "the pipeline running"
    )
    assert f"{CLS_NAME}@{CLS_VERSION} is signed by trusted key {signing_key[2]}" in log
    assert PASSWORD not in log
