"""The HTTP registry against a real HTTP server on loopback (tests/registry_server.py) serving the
folder `FileRegistry.publish` wrote, with the real store pulling the real PP-OCR classifier; bad
answers are injected on purpose, and each is a clear error naming the URL while the version the
store already has keeps serving."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from agent.config import AgentConfig, RegistryConfig, RegistryConnection
from agent.errors import IntegrityError, RegistryError, StoreError
from agent.registry import FileRegistry, HttpRegistry, PublishOptions, open_registry
from agent.registry.manifest import INDEX_FILE
from agent.store import ModelStore
from tests.agent_process import StartAgent, pipeline_state, read_status
from tests.media_fixtures import CLS_PREPROCESS, demo_video_module
from tests.pki import Pki
from tests.registry_server import RegistryServer, etag_of
from tests.store_fixtures import CLS_NAME, CLS_VERSION
from tests.waits import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
MODEL_FILE = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
FAST = RegistryConnection(retries=2, backoff_s=0.01, backoff_max_s=0.05, read_timeout_s=30.0)


@pytest.fixture
def server(file_registry: FileRegistry, cls_model_path: Path, tmp_path: Path) -> Iterator[RegistryServer]:
    """The file registry (pp-ocr-cls 2.0, and 2.1: the same network with a note in its ONNX
    metadata, so other bytes, and other labels) served over HTTP."""
    model = onnx.load(str(cls_model_path))
    onnx.helper.set_model_props(model, {"note": "2.1"})
    renamed = tmp_path / "v2.1" / MODEL_FILE
    renamed.parent.mkdir()
    onnx.save(model, str(renamed))
    file_registry.publish(renamed, CLS_NAME, "2.1", PublishOptions(metadata={"labels": ["up", "down"]}))
    served = RegistryServer(file_registry.root)
    yield served
    served.close()


def _store_files(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.blobs_dir.iterdir()) if store.blobs_dir.is_dir() else []


# --- the happy path --------------------------------------------------------------------------


def test_publish_writes_an_index_that_lists_every_version(
    file_registry: FileRegistry, cls_model_path: Path
) -> None:
    file_registry.publish(cls_model_path, "other-model", "1")
    index = json.loads((file_registry.root / INDEX_FILE).read_text())
    assert index == {"schema_version": 1, "models": {CLS_NAME: ["2.0"], "other-model": ["1"]}}


def test_a_version_is_pulled_over_http_and_verified(server: RegistryServer, tmp_path: Path) -> None:
    registry = HttpRegistry(server.url + "/", FAST)
    assert registry.url == server.url
    assert registry.list_versions(CLS_NAME) == ["2.0", "2.1"]
    assert registry.list_models() == [CLS_NAME]
    store = ModelStore(tmp_path / "store")
    installed = store.pull(registry, CLS_NAME, "2.1")
    assert installed.manifest.metadata == {"labels": ["up", "down"]}
    blob = installed.primary()[1]
    assert blob.read_bytes() == (server.root / CLS_NAME / "2.1" / MODEL_FILE).read_bytes()
    assert store.verify(CLS_NAME, "2.1") == []
    # Pulled once: a second pull is served by the store without asking for the artifact again.
    store.pull(registry, CLS_NAME, "2.1")
    assert len(server.served(MODEL_FILE)) == 1


def test_manifests_are_revalidated_with_their_etag(server: RegistryServer) -> None:
    registry = HttpRegistry(server.url, FAST)
    first = registry.get_manifest(CLS_NAME, CLS_VERSION)
    again = registry.get_manifest(CLS_NAME, CLS_VERSION)
    assert again == first
    asked = server.served("/manifest.json")
    assert [r.status for r in asked] == [200, 304]
    assert asked[1].headers.get("If-None-Match", "").startswith('"')


def test_a_download_resumes_from_an_offset_and_restarts_when_the_file_changed(server: RegistryServer) -> None:
    registry = HttpRegistry(server.url, FAST)
    whole = (server.root / CLS_NAME / CLS_VERSION / MODEL_FILE).read_bytes()
    start, stream = registry.open_artifact_at(CLS_NAME, CLS_VERSION, MODEL_FILE, 0)
    with stream:
        head = stream.read(1000)
    validator = server.served(MODEL_FILE)[-1]
    assert start == 0 and head == whole[:1000] and validator.status == 200
    etag = etag_of(whole)  # what the server sent with it

    start, stream = registry.open_artifact_at(CLS_NAME, CLS_VERSION, MODEL_FILE, 1000, etag)
    with stream:
        rest = stream.read()
    assert start == 1000 and head + rest == whole
    assert (
        server.served(MODEL_FILE)[-1].status == 206
        and server.served(MODEL_FILE)[-1].body_bytes == len(whole) - 1000
    )

    # The file changed since (another ETag): the server sends it whole, from 0.
    start, stream = registry.open_artifact_at(CLS_NAME, CLS_VERSION, MODEL_FILE, 1000, '"changed"')
    with stream:
        assert start == 0 and stream.read() == whole


def test_basic_and_bearer_auth_read_their_secret_from_a_file(
    file_registry: FileRegistry, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret-pass\n")
    token = tmp_path / "token"
    token.write_text("tok-123")
    basic = RegistryServer(file_registry.root, username="edge", password="s3cret-pass")
    bearer = RegistryServer(file_registry.root, token="tok-123")
    try:
        with pytest.raises(RegistryError) as refused:
            HttpRegistry(basic.url, FAST).list_versions(CLS_NAME)
        assert f"registry refused {basic.url}/index.json: 401 Unauthorized" in str(refused.value)
        assert "password_file" in str(refused.value)  # the hint says where credentials go
        assert len(basic.served()) == 1  # a refusal is not retried

        good = HttpRegistry(basic.url, RegistryConnection(username="edge", password_file=secret, retries=0))
        assert good.list_versions(CLS_NAME) == [CLS_VERSION]
        wrong = tmp_path / "wrong"
        wrong.write_text("guess")
        with pytest.raises(RegistryError) as bad:
            HttpRegistry(
                basic.url, RegistryConnection(username="edge", password_file=wrong, retries=0)
            ).list_models()
        assert "401" in str(bad.value) and "guess" not in str(bad.value)

        assert HttpRegistry(bearer.url, RegistryConnection(token_file=token)).list_models() == [CLS_NAME]
        # Credentials in the URL work, and never show.
        at = basic.url.replace("http://", "http://edge:s3cret-pass@")
        in_url = HttpRegistry(at, FAST)
        assert in_url.list_models() == [CLS_NAME] and "s3cret" not in in_url.url
    finally:
        basic.close()
        bearer.close()


def test_the_agent_config_takes_an_https_registry_with_its_settings(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw")
    config = RegistryConfig(
        url="https://127.0.0.1:1/registry", username="edge", password_file=secret, retries=1
    )
    registry = open_registry(config.url, config)
    assert isinstance(registry, HttpRegistry) and registry.settings.retries == 1
    assert registry.settings.password_file == secret
    for bad, message in [
        ({"url": "ftp://x/"}, "expected a file://, http://, https:// or oci:// registry URL"),
        ({"url": "https://x/", "password_file": str(secret)}, "password_file needs username"),
        ({"url": "https://x/", "token_file": str(secret), "username": "u"}, "exclude each other"),
    ]:
        with pytest.raises(ValueError, match=message):
            AgentConfig.model_validate({"device": {"id": "box"}, "registry": bad})


# --- bad answers -----------------------------------------------------------------------------


def _installed_then(server: RegistryServer, tmp_path: Path) -> tuple[HttpRegistry, ModelStore]:
    """A store that already has 2.0 (it keeps serving whatever 2.1's pull does)."""
    registry = HttpRegistry(server.url, FAST)
    store = ModelStore(tmp_path / "store")
    store.pull(registry, CLS_NAME, CLS_VERSION)
    return registry, store


def _still_serving(store: ModelStore, versions: tuple[str, ...] = (CLS_VERSION,)) -> None:
    assert store.get(CLS_NAME, CLS_VERSION).primary()[1].is_file()
    assert tuple(m.version for m in store.list()) == versions  # nothing half-installed
    assert not [p for p in store.blobs_dir.iterdir() if ".tmp" in p.name]


def test_server_errors_are_retried_then_named(server: RegistryServer, tmp_path: Path) -> None:
    registry, store = _installed_then(server, tmp_path)
    server.fault(f"/{CLS_NAME}/2.1/manifest.json", "status", 503, times=2)
    assert store.pull(registry, CLS_NAME, "2.1").version == "2.1"  # two 503s, then it works
    assert [r.status for r in server.served("2.1/manifest.json")] == [503, 503, 200]

    server.fault(f"/{CLS_NAME}/2.1/manifest.json", "status", 500, times=10)
    other = ModelStore(tmp_path / "other-store")
    with pytest.raises(
        RegistryError, match=rf"registry answered 500 Internal Server Error for {server.url}/"
    ):
        other.pull(registry, CLS_NAME, "2.1")
    assert other.list() == []
    _still_serving(store, ("2.0", "2.1"))


@pytest.mark.parametrize(
    ("path", "fault", "message"),
    [
        (f"/{CLS_NAME}/2.1/manifest.json", ("garbage", b"{oops"), "/2.1/manifest.json"),
        (
            f"/{CLS_NAME}/2.1/manifest.json",
            ("status", 404),
            "model 'pp-ocr-cls' version '2.1' not found in registry",
        ),
        (f"/{CLS_NAME}/2.1/manifest.json", ("status", 403), "registry refused"),
        (
            f"/{CLS_NAME}/2.1/manifest.json",
            ("redirect", "http://127.0.0.2:9/evil"),
            "redirects to another host",
        ),
        (
            f"/{CLS_NAME}/2.1/{MODEL_FILE}",
            ("status", 404),
            f"artifact {MODEL_FILE} of pp-ocr-cls@2.1 not found at",
        ),
        (f"/{CLS_NAME}/2.1/{MODEL_FILE}", ("truncate", 5000), "download of http://127.0.0.1:{port}/"),
    ],
)
def test_bad_answers_are_clear_errors_and_the_store_keeps_what_it_had(
    server: RegistryServer, tmp_path: Path, path: str, fault: tuple[str, object], message: str
) -> None:
    registry, store = _installed_then(server, tmp_path)
    server.fault(path, fault[0], fault[1], times=10)
    with pytest.raises(RegistryError) as caught:
        store.pull(registry, CLS_NAME, "2.1")
    assert message.format(port=server.port) in str(caught.value), caught.value
    _still_serving(store)


def _manifest_of_2_1(server: RegistryServer, **artifact: object) -> bytes:
    """2.1's manifest as served, with its model artifact's fields changed."""
    document = json.loads((server.root / CLS_NAME / "2.1" / "manifest.json").read_bytes())
    document["artifacts"][0].update(artifact)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"file": "../../etc/cron.d/evil.onnx"}, "artifacts[0].file: must be a plain file name without '/'"),
        ({"file": "/etc/cron.d/evil.onnx"}, "artifacts[0].file: must be a plain file name without '/'"),
        ({"file": ".hidden.onnx"}, "artifacts[0].file: must not start with '.'"),
        ({"size": -5}, "artifacts[0].size: Input should be greater than or equal to 0"),
    ],
)
def test_a_manifest_naming_files_outside_its_version_is_refused(
    server: RegistryServer, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    registry, store = _installed_then(server, tmp_path)
    server.fault(f"/{CLS_NAME}/2.1/manifest.json", "garbage", _manifest_of_2_1(server, **change), times=10)
    with pytest.raises(RegistryError) as caught:
        store.pull(registry, CLS_NAME, "2.1")
    assert f"invalid model manifest {server.url}/{CLS_NAME}/2.1/manifest.json: " in caught.value.message
    assert message in caught.value.message, caught.value.message
    _still_serving(store)
    assert not list(tmp_path.rglob("cron.d"))


def test_a_huge_declared_size_is_refused_before_downloading(server: RegistryServer, tmp_path: Path) -> None:
    registry, store = _installed_then(server, tmp_path)
    huge = _manifest_of_2_1(server, size=10**15)
    server.fault(f"/{CLS_NAME}/2.1/manifest.json", "garbage", huge, times=10)
    with pytest.raises(StoreError, match=r"needs 1,000,000,000,000,000 bytes, but the disk holding .* free"):
        store.pull(registry, CLS_NAME, "2.1")
    assert server.served(f"2.1/{MODEL_FILE}") == []
    _still_serving(store)


def test_a_wrong_content_length_fails_the_size_check(server: RegistryServer, tmp_path: Path) -> None:
    """The server declares (and sends) 5000 bytes of a larger file: a complete-looking short answer."""
    registry, store = _installed_then(server, tmp_path)
    server.fault(f"/{CLS_NAME}/2.1/{MODEL_FILE}", "length", 5000, times=10)
    size = registry.get_manifest(CLS_NAME, "2.1").artifact(MODEL_FILE).size
    with pytest.raises(IntegrityError) as caught:
        store.pull(registry, CLS_NAME, "2.1")
    assert f"size mismatch: manifest says {size} bytes, got 5000 bytes; the registry copy is truncated" in (
        caught.value.message
    )
    _still_serving(store)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>not json</html>", "invalid registry index http://127.0.0.1:{port}/index.json: "),
        (b'{"models": ["a"]}', "models must map names to lists of versions"),
        (b'{"schema_version": 1}', "invalid registry index"),
    ],
)
def test_a_bad_index_is_named(server: RegistryServer, body: bytes, message: str) -> None:
    server.fault("/index.json", "garbage", body)
    with pytest.raises(RegistryError) as caught:
        HttpRegistry(server.url, FAST).list_versions(CLS_NAME)
    assert message.format(port=server.port) in str(caught.value), caught.value


def test_a_manifest_for_another_version_is_refused(server: RegistryServer, tmp_path: Path) -> None:
    registry, store = _installed_then(server, tmp_path)
    other = (server.root / CLS_NAME / "2.0" / "manifest.json").read_bytes()
    server.fault(f"/{CLS_NAME}/2.1/manifest.json", "garbage", other)
    with pytest.raises(
        RegistryError, match=r"manifest.json: it describes pp-ocr-cls@2.0, not pp-ocr-cls@2.1"
    ):
        store.pull(registry, CLS_NAME, "2.1")
    _still_serving(store)


def test_other_bytes_under_the_artifact_name_fail_the_hash(server: RegistryServer, tmp_path: Path) -> None:
    registry, store = _installed_then(server, tmp_path)
    whole = (server.root / CLS_NAME / "2.1" / MODEL_FILE).read_bytes()
    tampered = whole[:-1] + bytes([whole[-1] ^ 1])
    server.fault(f"/{CLS_NAME}/2.1/{MODEL_FILE}", "garbage", tampered)
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        store.pull(registry, CLS_NAME, "2.1")
    _still_serving(store)


def test_a_server_that_stalls_mid_body_times_out(server: RegistryServer, tmp_path: Path) -> None:
    _, store = _installed_then(server, tmp_path)
    server.stall_s = 5.0
    stalling = HttpRegistry(server.url, RegistryConnection(retries=0, read_timeout_s=0.5))
    server.fault(f"/{CLS_NAME}/2.1/{MODEL_FILE}", "stall", 4096)
    with pytest.raises(RegistryError, match=r"download of http://127\.0\.0\.1:\d+/.* failed: timed out"):
        store.pull(stalling, CLS_NAME, "2.1")
    _still_serving(store)


def test_an_unreachable_registry_is_named_with_a_hint(tmp_path: Path) -> None:
    registry = HttpRegistry(
        f"http://127.0.0.1:{free_port()}/reg", RegistryConnection(retries=1, backoff_s=0.01)
    )
    with pytest.raises(RegistryError) as caught:
        registry.list_versions(CLS_NAME)
    assert "cannot reach registry at http://127.0.0.1:" in str(caught.value)
    assert "keeps running what its store has" in str(caught.value)


def test_redirects_on_the_same_host_are_followed_and_listed_hosts_allowed(server: RegistryServer) -> None:
    server.fault("/index.json", "redirect", f"{server.url}/{CLS_NAME}/../index.json")
    assert HttpRegistry(server.url, FAST).list_models() == [CLS_NAME]
    server.fault("/index.json", "redirect", f"http://localhost:{server.port}/index.json")
    allowed = HttpRegistry(server.url, RegistryConnection(redirect_hosts=("localhost",)))
    assert allowed.list_models() == [CLS_NAME]


_PULL = """
import sys
from pathlib import Path
from agent.config import RegistryConnection
from agent.registry import HttpRegistry
from agent.store import ModelStore
registry = HttpRegistry(sys.argv[1], RegistryConnection(read_timeout_s=600))
ModelStore(Path(sys.argv[2])).pull(registry, sys.argv[3], sys.argv[4])
"""


def test_a_pull_killed_half_way_resumes_where_it_stopped(server: RegistryServer, tmp_path: Path) -> None:
    registry = HttpRegistry(server.url, FAST)
    artifact = registry.get_manifest(CLS_NAME, "2.1").artifact(MODEL_FILE)
    whole = (server.root / CLS_NAME / "2.1" / MODEL_FILE).read_bytes()
    cut = 200_000
    server.stall_s = 300.0  # the first download sends `cut` bytes, then nothing
    server.fault(f"/{CLS_NAME}/2.1/{MODEL_FILE}", "stall", cut)
    store = ModelStore(tmp_path / "store")
    child = subprocess.Popen(
        [sys.executable, "-c", _PULL, server.url, str(store.root), CLS_NAME, "2.1"], cwd=REPO
    )
    try:
        wait_until(
            lambda: store.partial_bytes(artifact.sha256) == cut, "the first bytes on disk", timeout=120
        )
    finally:
        child.kill()  # SIGKILL: no clean-up runs
        child.wait(timeout=30)
    assert store.list() == [] and store.partial_bytes(artifact.sha256) == cut

    installed = store.pull(registry, CLS_NAME, "2.1")
    resumed = server.served(MODEL_FILE)[-1]
    assert resumed.headers.get("Range") == f"bytes={cut}-" and resumed.headers.get("If-Range") == etag_of(
        whole
    )
    assert resumed.status == 206 and resumed.body_bytes == len(whole) - cut  # only the rest came
    assert installed.primary()[1].read_bytes() == whole
    assert store.partial_bytes(artifact.sha256) == 0 and store.verify(CLS_NAME, "2.1") == []


def test_a_kept_partial_of_another_file_is_caught_by_the_hash_and_dropped(
    server: RegistryServer, tmp_path: Path
) -> None:
    registry = HttpRegistry(server.url, FAST)
    artifact = registry.get_manifest(CLS_NAME, "2.1").artifact(MODEL_FILE)
    store = ModelStore(tmp_path / "store")
    store.blobs_dir.mkdir(parents=True)
    (store.blobs_dir / f"{artifact.sha256}.partial").write_bytes(b"\0" * 1000)  # not the file's first bytes
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        store.pull(registry, CLS_NAME, "2.1")
    assert store.partial_bytes(artifact.sha256) == 0  # dropped: the next pull starts afresh
    assert store.pull(registry, CLS_NAME, "2.1").version == "2.1"


def test_https_with_the_fleet_ca_and_refused_without_it(
    file_registry: FileRegistry, pki: Pki, tmp_path: Path
) -> None:
    served = RegistryServer(file_registry.root, tls=(pki.server_cert, pki.server_key))
    try:
        assert served.url.startswith("https://127.0.0.1:")
        trusted = HttpRegistry(served.url, RegistryConnection(ca_file=pki.ca))
        installed = ModelStore(tmp_path / "store").pull(trusted, CLS_NAME, CLS_VERSION)
        assert installed.primary()[1].is_file()
        # The system's CAs, or another CA: the certificate is not trusted, and the error says so.
        for settings in (RegistryConnection(retries=0), RegistryConnection(ca_file=pki.other_ca, retries=0)):
            with pytest.raises(RegistryError) as caught:
                HttpRegistry(served.url, settings).list_versions(CLS_NAME)
            assert f"cannot reach registry at {served.url}/index.json" in str(caught.value)
            assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value), caught.value
        missing = tmp_path / "no-such-ca.pem"
        with pytest.raises(RegistryError, match="registry CA file"):
            HttpRegistry(served.url, RegistryConnection(ca_file=missing))
    finally:
        served.close()


def test_pull_progress_counts_up_to_the_size(server: RegistryServer, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int, float]] = []
    store = ModelStore(tmp_path / "store")
    store.pull(HttpRegistry(server.url, FAST), CLS_NAME, "2.1", progress=lambda *a: seen.append(a))
    size = (server.root / CLS_NAME / "2.1" / MODEL_FILE).stat().st_size
    assert seen[0][1:3] == (0, size) and seen[-1][1:3] == (size, size), seen
    assert all(w == f"artifact {MODEL_FILE} of pp-ocr-cls@2.1" for w, *_ in seen)
    assert [d for _, d, _, _ in seen] == sorted(d for _, d, _, _ in seen)


@pytest.mark.slow
def test_the_daemon_shows_a_stalled_download_and_resumes_it(
    server: RegistryServer, tmp_path: Path, start_agent: StartAgent
) -> None:
    """`edge-agent run` on an HTTP registry whose server stalls half way through the model: the
    download shows in status.json while it hangs, the read timeout cuts it, and the retry resumes
    from the bytes it kept (a 206 for the rest) and the pipeline runs."""
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    cut = 200_000
    server.stall_s = 60.0
    server.fault(f"/{CLS_NAME}/2.0/{MODEL_FILE}", "stall", cut)
    config = {
        "device": {"id": "http-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": free_port(), "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": server.url, "read_timeout_s": 5.0, "retries": 0},  # the stall: 5 s
        "backends": {"benchmark": False},
        "pipelines": [
            {
                "name": "door",
                "model": {"name": CLS_NAME, "version": CLS_VERSION},
                "source": {"type": "video", "uri": str(video), "loop": True},
                "preprocess": CLS_PREPROCESS.model_dump(),
                "postprocess": {"type": "classification", "softmax": False},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    state_dir = tmp_path / "state"

    def download() -> dict[str, object]:
        shown: dict[str, object] = (
            read_status(state_dir).get("pipelines", {}).get("door", {}).get("download", {})
        )
        return shown

    agent = start_agent(path)
    wait_until(lambda: download().get("bytes") == cut, "the stalled download in status.json", timeout=120)
    assert download()["total"] == (server.root / CLS_NAME / CLS_VERSION / MODEL_FILE).stat().st_size
    assert download()["artifact"] == f"artifact {MODEL_FILE} of {CLS_NAME}@{CLS_VERSION}"
    log = agent.run_until(lambda: pipeline_state(state_dir, "door") == "running", "the pipeline running")
    assert "keeping 200000 of" in log and "resuming the download at byte 200000" in log
    # No broker in this test: said once by the agent, not by paho at every reconnect attempt.
    assert log.count("cannot reach MQTT broker") == 1 and "Client is not connected" not in log
    resumed = server.served(MODEL_FILE)[-1]
    assert resumed.status == 206 and resumed.headers.get("Range") == f"bytes={cut}-"


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A 900 KiB tmpfs (room for one copy of the model, not two; another size by indirect
    parametrisation), unmounted after the test."""
    size = getattr(request, "param", "900k")
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"cannot mount a small tmpfs (these tests run as root): {done.stderr}"
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=60)


@pytest.mark.parametrize("small_disk", ["1400k"], indirect=True)  # room for both copies at the start
def test_a_disk_that_fills_up_mid_download_is_named_and_cleaned_up(
    server: RegistryServer, small_disk: Path
) -> None:
    """There was room when the pull started; another writer takes it while the bytes come."""
    registry = HttpRegistry(server.url, FAST)
    store = ModelStore(small_disk / "store")
    store.pull(registry, CLS_NAME, CLS_VERSION)  # fits
    artifact = registry.get_manifest(CLS_NAME, "2.1").artifact(MODEL_FILE)
    filler = small_disk / "other-writer.log"

    def fill_the_disk(_what: str, done: int, _total: int, _rate: float) -> None:
        if done > 0 and not filler.exists():
            with filler.open("wb") as f, contextlib.suppress(OSError):  # until ENOSPC
                for _ in range(10_000):
                    f.write(b"\0" * 4096)
                    f.flush()

    with pytest.raises(StoreError) as caught:
        store.pull(registry, CLS_NAME, "2.1", progress=fill_the_disk)
    message = str(caught.value)
    assert f"cannot store artifact {MODEL_FILE} of pp-ocr-cls@2.1" in message, message
    assert "is full" in message and "the partial file was removed" in message, message
    assert store.partial_bytes(artifact.sha256) == 0  # the room it took is given back
    _still_serving(store)
    assert store.verify(CLS_NAME, CLS_VERSION) == []


def test_a_version_that_cannot_fit_is_refused_before_any_download(
    server: RegistryServer, small_disk: Path
) -> None:
    registry = HttpRegistry(server.url, FAST)
    store = ModelStore(small_disk / "store")
    store.pull(registry, CLS_NAME, CLS_VERSION)  # fits; another copy does not
    with pytest.raises(StoreError) as caught:
        store.pull(registry, CLS_NAME, "2.1")
    size = registry.get_manifest(CLS_NAME, "2.1").artifact(MODEL_FILE).size
    assert caught.value.message.startswith(
        f"pp-ocr-cls@2.1 from {server.url} needs {size:,} bytes, but the disk holding {store.root} has "
    )
    assert caught.value.message.endswith("free; nothing was downloaded")
    assert [s.path for s in server.served(MODEL_FILE)] == [
        f"/{CLS_NAME}/{CLS_VERSION}/{MODEL_FILE}"
    ]  # 2.1: none
    _still_serving(store)
