"""`edge-agent doctor` on real components: a mosquitto that wants a password (mosquitto_passwd), the
HTTP registry server, a model store holding the real PP-OCR classifier pulled from it, a rendered
video file, a TLS broker with tests/pki.py's certificates. Each broken thing must be a FAIL naming
it with the right fix, a healthy box all OK, and the exit code 0 / 1 / 2. Only loopback; every wait
is bounded (doctor's own timeouts are what is under test)."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import AgentConfig
from agent.config_loader import load_config
from agent.registry import FileRegistry, HttpRegistry, PublishOptions
from agent.registry.signing import generate_key
from agent.store import ModelStore
from agent.tools.doctor.box import BUILD_YEAR, check_clock, check_secret_files
from agent.tools.doctor.broker import check_broker, doctor_client_id
from agent.tools.doctor.core import FAIL, OK, SKIPPED, WARN, Check, bounded
from agent.tools.doctor.pipelines import check_backend_of, check_source_of, running_agent
from agent.tools.doctor.storage import check_registry, check_store
from tests.cli_runs import cli
from tests.media_fixtures import demo_video_module
from tests.mosquitto import Mosquitto
from tests.pki import Pki, run_tool, tool
from tests.registry_server import RegistryServer
from tests.store_fixtures import CLS_NAME, CLS_VERSION
from tests.waits import free_port

USER, PASSWORD = "doctor-box", "doctor-s3cret"  # a throwaway test login
DEVICE = "doctor-box"
MODEL = f"{CLS_NAME}@{CLS_VERSION}"
TIMEOUT_S = 5.0  # doctor's --timeout: generous for a busy machine; the healthy checks take far less


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """mosquitto that lets in USER with PASSWORD and nobody else."""
    workdir = tmp_path_factory.mktemp("broker")
    passwords = workdir / "passwd"
    run_tool([tool("mosquitto_passwd", "mosquitto"), "-b", "-c", str(passwords), USER, PASSWORD], workdir)
    os.chmod(passwords, 0o600)
    with Mosquitto(
        workdir / "mosquitto", allow_anonymous=False, extra_config=f"password_file {passwords}"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, cls_model_path: Path) -> Iterator[RegistryServer]:
    """The real classifier published as pp-ocr-cls@2.0, served over HTTP."""
    folder = FileRegistry(tmp_path_factory.mktemp("registry") / "registry")
    folder.publish(cls_model_path, CLS_NAME, CLS_VERSION, PublishOptions(metadata={"labels": ["0", "180"]}))
    served = RegistryServer(folder.root)
    yield served
    served.close()


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media") / "door.mp4"
    demo_video_module().make_orientation_video(path, fps=10, seconds_per_sign=0.2)
    return path


class Box:
    """A box set up as install.sh would: an owner-only state dir whose store holds the model its
    pipeline names, a password file readable by its owner only, and agent.yaml."""

    def __init__(self, root: Path, broker: Mosquitto, registry: RegistryServer, video: Path) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.state_dir.mkdir(mode=0o700)
        self.password_file = root / "mqtt.pw"
        self.password_file.write_text(PASSWORD + "\n")
        os.chmod(self.password_file, 0o600)
        self.config_path = root / "agent.yaml"
        self.settings: dict[str, Any] = {
            "device": {"id": DEVICE},
            "state_dir": str(self.state_dir),
            "mqtt": {
                "host": broker.host,
                "port": broker.port,
                "username": USER,
                "password_file": str(self.password_file),
            },
            "registry": {"url": registry.url},
            "pipelines": [
                {
                    "name": "door",
                    "model": {"name": CLS_NAME, "version": CLS_VERSION},
                    "source": {"type": "video", "uri": str(video)},
                    "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
                }
            ],
        }
        self.write()
        self.store = ModelStore(self.state_dir / "store")
        http = HttpRegistry(registry.url)
        try:
            self.store.pull(http, CLS_NAME, CLS_VERSION)
        finally:
            http.close()

    def write(self) -> Path:
        self.config_path.write_text(json.dumps(self.settings, indent=2))  # JSON is YAML
        os.chmod(self.config_path, 0o640)
        return self.config_path

    def change(self, section: str, **values: Any) -> Box:
        self.settings[section] = {**self.settings[section], **values}
        self.write()
        return self

    def source(self, uri: str) -> Box:
        self.settings["pipelines"][0]["source"]["uri"] = uri
        self.write()
        return self

    @property
    def config(self) -> AgentConfig:
        return load_config(self.config_path)

    def saved(self) -> AgentConfig:
        """The config after changes made to `settings` by hand."""
        self.write()
        return self.config

    def doctor(self, *args: str, expect: int) -> dict[str, Any]:
        """`edge-agent doctor --json` as a command, its exit status checked."""
        out = cli(
            "doctor", "-c", str(self.config_path), "--timeout", str(TIMEOUT_S), "--json", *args, expect=expect
        )
        return json.loads(out[: out.rindex("}") + 1])  # a failed run's stderr comes after the JSON


@pytest.fixture
def box(tmp_path: Path, broker: Mosquitto, registry: RegistryServer, video: Path) -> Box:
    return Box(tmp_path, broker, registry, video)


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in document["checks"]}


# --- the whole command ----------------------------------------------------------------------


def test_a_healthy_box_is_all_ok_and_exits_0(box: Box) -> None:
    document = box.doctor(expect=0)
    names = [row["name"] for row in document["checks"]]
    assert names == [
        "config", "broker", "registry", "store", "source:door", "backend:door",
        "disk", "state dir", "devices", "secret files", "clock",
    ]  # fmt: skip
    assert {row["status"] for row in document["checks"]} == {"OK"}, document
    assert document["summary"] == {"ok": 11, "warn": 0, "fail": 0} and document["exit_code"] == 0
    for row in document["checks"]:
        assert set(row) == {"name", "status", "detail", "fix", "seconds"} and row["fix"] == ""
        assert isinstance(row["seconds"], float) and row["seconds"] < TIMEOUT_S
    rows = by_name(document)
    assert (
        f"as '{USER}'" in rows["broker"]["detail"]
        and f"client id edge-agent-{DEVICE}-doctor" in (rows["broker"]["detail"])
    )
    assert "every pipeline's model in it" in rows["registry"]["detail"]
    assert "1 version(s), every file's sha256 matches" in rows["store"]["detail"]
    assert (
        "a frame after" in rows["source:door"]["detail"] and "80x320x3 uint8" in rows["source:door"]["detail"]
    )
    assert rows["backend:door"]["detail"].startswith(f"{MODEL}: onnxruntime/CPUExecutionProvider loads")
    assert (
        "mode 0700" in rows["state dir"]["detail"]
        and str(box.password_file) in rows["secret files"]["detail"]
    )


def test_a_warning_exits_1_and_the_table_shows_status_and_fix(box: Box) -> None:
    os.chmod(box.state_dir, 0o755)  # the results and models readable by every user
    # Wide enough that the row's detail is not wrapped: the temp path is in it and in the fix, and
    # its length varies (pytest-99 / pytest-1023, a worker's popen-gw0).
    wide = {"COLUMNS": "500"}
    out = cli("doctor", "-c", str(box.config_path), "--timeout", str(TIMEOUT_S), expect=1, env=wide)
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("state dir "))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[0] == "state dir" and cells[1] == "WARN"
    assert "mode 0755: others can read the results" in cells[2] and cells[3] == f"chmod 700 {box.state_dir}"
    assert "10 OK, 1 WARN, 0 FAIL" in out


def test_an_invalid_config_fails_and_every_check_that_needs_it_says_so(box: Box) -> None:
    box.settings["mqtt"]["port"] = 70000
    box.settings["pipelines"][0]["source"]["type"] = "camera"
    box.write()
    document = box.doctor(expect=2)
    rows = by_name(document)
    assert (
        rows["config"]["status"] == FAIL
        and rows["config"]["fix"] == f"edge-agent config validate {box.config_path}"
    )
    assert f"{box.config_path}:" in rows["config"]["detail"] and "mqtt.port" in rows["config"]["detail"]
    assert "pipelines[0].source" in rows["config"]["detail"]  # every problem, each with its line
    skipped = ["broker", "registry", "store", "pipelines", "disk", "state dir", "secret files"]
    for name in skipped:  # visible rows, not missing ones
        assert rows[name]["status"] == WARN and rows[name]["detail"] == SKIPPED, rows[name]
    assert rows["clock"]["status"] == OK and rows["devices"]["status"] == OK  # these need no config
    assert document["exit_code"] == 2 and document["summary"] == {"ok": 2, "warn": 7, "fail": 1}


# --- broker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_wrong_broker_password_fails_with_the_login_hint(box: Box, protocol: str) -> None:
    box.password_file.write_text("wrong-" + PASSWORD)
    check = check_broker(box.change("mqtt", protocol=protocol).config, TIMEOUT_S)
    assert check.status == FAIL
    # mosquitto says "not authorized" (0x87, or 3.1.1's 5), not "bad user name or password" (0x86)
    assert f"refused the login of '{USER}': Not authorized (0x87)" in check.detail, check
    assert "first line of mqtt.password_file" in check.fix and "broker's password file" in check.fix
    box.settings["mqtt"].pop("username")  # anonymous: not allowed on this broker
    box.settings["mqtt"].pop("password_file")
    check = check_broker(box.saved(), TIMEOUT_S)
    assert check.status == FAIL and "an anonymous client: Not authorized (0x87)" in check.detail, check
    assert check.fix.startswith("the broker wants a login: set mqtt.username and mqtt.password_file")


def test_doctor_logs_in_without_kicking_the_running_agent_off(box: Box, broker: Mosquitto) -> None:
    """The broker drops the older of two clients with one id: doctor's is the agent's plus -doctor."""
    agent = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-agent-{DEVICE}", protocol=mqtt.MQTTv5)
    agent.username_pw_set(USER, PASSWORD)
    connected, dropped = threading.Event(), threading.Event()
    agent.on_connect = lambda *_args: connected.set()
    agent.on_disconnect = lambda *_args: dropped.set()
    agent.connect(broker.host, broker.port, keepalive=10)
    agent.loop_start()
    try:
        assert connected.wait(TIMEOUT_S)
        check = check_broker(box.config, TIMEOUT_S)
        assert check.status == OK and f"client id edge-agent-{DEVICE}-doctor" in check.detail
        published = agent.publish("edge/doctor-box/probe", b"still here", qos=1)
        published.wait_for_publish(TIMEOUT_S)  # acknowledged: the agent's session is still there
        assert published.is_published() and not dropped.is_set()
    finally:
        agent.disconnect()
        agent.loop_stop()
    assert doctor_client_id("x" * 128) == "x" * 121 + "-doctor"  # within MQTT's client id limit


def test_nothing_listening_and_a_broker_that_never_answers(box: Box) -> None:
    check = check_broker(box.change("mqtt", port=free_port()).config, TIMEOUT_S)
    assert check.status == FAIL and "refused the connection: nothing listens there" in check.detail
    assert "mqtt.host / mqtt.port" in check.fix
    with socket.socket() as silent:  # takes TCP connections (the backlog), never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        check = check_broker(box.change("mqtt", port=port).config, 0.5)
        assert time.monotonic() - started < 3
    assert check.status == FAIL and check.detail.startswith(f"no CONNACK from 127.0.0.1:{port} within 0.5 s")
    assert "MQTT port" in check.fix


def test_tls_an_untrusted_certificate_and_a_name_mismatch(tmp_path: Path, box: Box, pki: Pki) -> None:
    tls = [f"cafile {pki.ca}", "require_certificate false"]
    good = Mosquitto(
        tmp_path / "good",
        extra_config="\n".join([*tls, f"certfile {pki.server_cert}", f"keyfile {pki.server_key}"]),
    )
    misnamed = Mosquitto(
        tmp_path / "misnamed",
        extra_config="\n".join(
            [*tls, f"certfile {pki.misnamed_server_cert}", f"keyfile {pki.misnamed_server_key}"]
        ),
    )
    with good, misnamed:
        box.settings["mqtt"] = {"host": "127.0.0.1", "port": good.port, "tls": {"ca_file": str(pki.ca)}}
        check = check_broker(box.saved(), TIMEOUT_S)
        assert check.status == OK and "(MQTT 5, TLS," in check.detail, check
        box.change("mqtt", tls={"ca_file": str(pki.other_ca)})
        check = check_broker(box.config, TIMEOUT_S)
        assert check.status == FAIL and "certificate is not trusted" in check.detail, check
        assert check.fix == "mqtt.tls.ca_file must be the CA that signed the broker's certificate"
        box.change("mqtt", port=misnamed.port, tls={"ca_file": str(pki.ca)})
        check = check_broker(box.config, TIMEOUT_S)
        assert check.status == FAIL and "the broker's certificate is not for '127.0.0.1'" in check.detail, (
            check
        )
        assert "mqtt.host" in check.fix
        box.settings["mqtt"].pop("tls")  # the TLS port spoken to in plain MQTT
        check = check_broker(box.saved(), TIMEOUT_S)
        assert check.status == FAIL and "closed the connection before answering" in check.detail, check
        assert "give mqtt.tls" in check.fix


# --- registry -------------------------------------------------------------------------------


def test_an_unreachable_registry_and_refused_credentials(box: Box, registry: RegistryServer) -> None:
    closed = f"http://127.0.0.1:{free_port()}/models"
    started = time.monotonic()
    check = check_registry(box.change("registry", url=closed).config, TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S  # no retries with backoff: one try
    assert check.status == FAIL and check.detail.startswith(f"cannot reach registry at {closed}/index.json")
    assert check.fix == "check registry.url and that the registry server is up and reachable from this box"
    locked = RegistryServer(registry.root, username="edge", password="right-pass")
    try:
        wrong = box.root / "registry.pw"
        wrong.write_text("wrong-pass")
        box.change("registry", url=locked.url, username="edge", password_file=str(wrong))
        check = check_registry(box.config, TIMEOUT_S)
    finally:
        locked.close()
    assert check.status == FAIL and "401 Unauthorized" in check.detail, check
    assert "registry.username / password_file / token_file" in check.fix


def test_a_file_registry_that_is_not_there(box: Box) -> None:
    check = check_registry(box.change("registry", url=f"file://{box.root}/nfs/models").config, TIMEOUT_S)
    assert check.status == FAIL and "does not exist" in check.detail, check
    assert check.fix.startswith("check registry.url: a folder on this box")


def test_a_model_the_registry_does_not_have(box: Box) -> None:
    box.settings["pipelines"][0]["model"]["version"] = "9.9"
    check = check_registry(box.saved(), TIMEOUT_S)
    assert check.status == FAIL and f"{CLS_NAME}@9.9 is not in it" in check.detail
    assert "edge-agent registry publish" in check.fix


# --- store, sources, backends ---------------------------------------------------------------


def test_a_corrupt_blob_fails_naming_the_model_and_the_fix_repairs_it(box: Box) -> None:
    blob = next(iter((box.state_dir / "store" / "blobs" / "sha256").iterdir()))
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot: same size, other bytes
    blob.write_bytes(bytes(data))
    check = check_store(box.config)
    assert check.status == FAIL and check.detail.startswith(f"{MODEL}: artifact ")
    assert "(bit rot or modified)" in check.detail
    assert check.fix == f"edge-agent models rm {MODEL} --force && edge-agent models pull {MODEL}"
    for command in check.fix.split(" && "):  # the hint, run as given
        cli(*command.split()[1:], "-c", str(box.config_path))
    assert check_store(box.config).status == OK


def test_a_version_no_trusted_key_signed_fails_where_signatures_are_required(box: Box) -> None:
    _, public_key = generate_key(box.root / "signing.key")
    check = check_store(box.change("registry", trusted_keys=[{"key": str(public_key)}]).config)
    assert check.status == FAIL and check.detail.startswith(f"{MODEL}: installed copy of {MODEL}: manifest ")
    assert check.detail.endswith(
        "is unsigned, and this agent runs only signed models (registry.trusted_keys lists 1 key(s))"
    )
    assert check.fix == f"edge-agent models rm {MODEL} --force && edge-agent models pull {MODEL}"


def test_a_missing_camera_or_video_file_fails_naming_it(box: Box) -> None:
    pipeline = box.source("/dev/video99").config.pipelines[0]
    check = check_source_of(pipeline, TIMEOUT_S, None)
    assert check == Check(
        "source:door", FAIL, "camera /dev/video99 does not exist",
        "plug the camera in, or fix source.uri (ls /dev/video* lists the cameras)",
    )  # fmt: skip
    gone = box.root / "gone.mp4"
    check = check_source_of(box.source(str(gone)).config.pipelines[0], TIMEOUT_S, None)
    assert check.status == FAIL and check.detail == f"video file {gone} does not exist"
    assert check.fix == "fix pipelines[door].source.uri, or put the video file there"
    garbage = box.root / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    check = check_source_of(box.source(str(garbage)).config.pipelines[0], 1.0, None)
    assert check.status == FAIL and check.detail.startswith(f"{garbage}: no frame"), check


def test_a_port_the_running_agent_reads_is_not_opened_again(box: Box) -> None:
    """A serial port (or V4L2 camera) takes one reader: while an agent runs on this state dir,
    doctor asks its status.json instead of taking the port from it."""
    device, tty = os.openpty()
    path = os.ttyname(tty)
    box.settings["pipelines"][0].update(
        source={"type": "serial", "uri": path}, preprocess={"type": "series"}, postprocess={"type": "raw"}
    )
    pipeline = box.saved().pipelines[0]
    stop = threading.Event()

    def sensor() -> None:
        while not stop.wait(0.05):
            os.write(device, b"21.5\n")

    writer = threading.Thread(target=sensor, daemon=True)
    writer.start()
    try:
        assert running_agent(box.state_dir) is None
        check = check_source_of(pipeline, TIMEOUT_S, None)  # no agent: doctor reads the port itself
        assert check.status == OK and check.detail.startswith(f"{path}: a frame after"), check
        status_file = box.state_dir / "status.json"
        source: dict[str, Any] = {"state": "streaming", "error": None}
        status = {"pid": os.getpid(), "pipelines": {"door": {"state": "running", "source": source}}}
        status_file.write_text(json.dumps(status))
        running = running_agent(box.state_dir)
        assert running is not None and running["pid"] == os.getpid()
        check = check_source_of(pipeline, TIMEOUT_S, running)
        assert check == Check("source:door", OK, f"read by the running agent (pid {os.getpid()}): streaming")
        source.update(state="retrying", error=f"cannot open serial port {path}: no such device")
        status_file.write_text(json.dumps(status))
        check = check_source_of(pipeline, TIMEOUT_S, running_agent(box.state_dir))
        assert check.status == FAIL and check.detail.endswith(
            f"retrying: cannot open serial port {path}: no such device"
        )
        assert "baud rate" in check.fix
        old = time.time() - 120  # left behind by an agent that stopped a while ago
        os.utime(status_file, (old, old))
        assert running_agent(box.state_dir) is None
    finally:
        stop.set()
        writer.join(5)
        for fd in (device, tty):
            os.close(fd)


def test_backends_a_model_not_pulled_yet_and_one_no_backend_can_run(box: Box) -> None:
    config = box.config
    check = check_backend_of(config, config.pipelines[0])
    assert check.status == OK and "(not proven yet: what a first start serves" in check.detail
    box.settings["pipelines"][0]["model"]["version"] = "3.0"
    config = box.saved()
    check = check_backend_of(config, config.pipelines[0])
    assert check.status == WARN and check.detail == f"not checked: {CLS_NAME}@3.0 is not in the store yet"
    box.settings["pipelines"][0]["model"]["version"] = CLS_VERSION
    box.settings["pipelines"][0]["backend"] = {"fixed": "tflite/cpu"}  # reads .tflite files only
    config = box.saved()
    check = check_backend_of(config, config.pipelines[0])
    assert check.status == FAIL and check.detail.startswith(f"no backend can run {MODEL}"), check
    assert f"edge-agent models check {MODEL}" in check.fix


@pytest.mark.slow
def test_a_model_file_given_by_path_is_checked_where_it_is(box: Box, cls_model_path: Path) -> None:
    """`model: {path: ...}`: the file the agent imports at start is checked where it is (there, the
    format its suffix says, loaded on the backend the agent would serve it on), never reported as
    "not in the store yet" with a `models pull` that cannot help."""
    model = box.root / "models" / "door.onnx"
    model.parent.mkdir()
    model.write_bytes(b"\x08\x07corrupt: half an export\n")
    box.settings["pipelines"][0]["model"] = {"path": str(model)}
    box.write()
    rows = by_name(box.doctor(expect=2))
    row = rows["backend:door"]
    assert row["status"] == FAIL, row
    assert row["detail"].startswith(f"model file {model}: door.onnx is not a valid ONNX model: "), row
    assert row["fix"].startswith("export the model again, or fix pipelines[door].model.path")
    assert f"edge-agent models inspect {model}" in row["fix"]
    assert {r["status"] for name, r in rows.items() if name != "backend:door"} == {OK}, rows
    # The table says the same: the FAIL row, the file named.
    out = cli("doctor", "-c", str(box.config_path), "--timeout", str(TIMEOUT_S), expect=2)
    line = next(line for line in out.splitlines() if line.strip("│ ").startswith("backend:door "))
    cells = [cell.strip() for cell in line.strip("│").split("│")]
    assert cells[:2] == ["backend:door", "FAIL"] and cells[2].startswith("model file /"), cells
    assert "10 OK, 0 WARN, 1 FAIL" in out

    model.unlink()
    row = by_name(box.doctor(expect=2))["backend:door"]
    assert (row["status"], row["detail"]) == (FAIL, f"model file {model} does not exist"), row
    assert row["fix"] == "fix pipelines[door].model.path, or put the model file there"
    model.mkdir()
    row = by_name(box.doctor(expect=2))["backend:door"]
    assert (row["status"], row["detail"]) == (FAIL, f"model file {model} is not a file"), row
    model.rmdir()

    model.write_bytes(cls_model_path.read_bytes())  # the real classifier: loads where the agent runs it
    document = box.doctor(expect=0)
    row = by_name(document)["backend:door"]
    assert row["status"] == OK, row
    assert row["detail"].startswith(
        f"door@local ({model}): onnxruntime/CPUExecutionProvider loads door.onnx (not proven yet"
    ), row
    assert document["summary"] == {"ok": 11, "warn": 0, "fail": 0}
    assert not (box.state_dir / "store" / "models" / "door").exists()  # checked, not imported


# --- the box --------------------------------------------------------------------------------


def test_a_password_readable_by_every_user_is_a_warning(box: Box) -> None:
    box.settings["mqtt"].pop("password_file")
    box.change("mqtt", password=PASSWORD)
    os.chmod(box.config_path, 0o644)
    check = check_secret_files(box.config_path, box.config)
    assert (
        check.status == WARN and str(box.config_path) in check.detail and "holds a password" in check.detail
    )
    assert check.fix.startswith(f"chmod o-rwx {box.config_path}")
    os.chmod(box.config_path, 0o640)
    assert check_secret_files(box.config_path, box.config).status == OK
    assert stat.S_IMODE(box.config_path.stat().st_mode) == 0o640


def test_the_clock() -> None:
    assert check_clock(datetime(BUILD_YEAR, 6, 1, tzinfo=timezone.utc), True).status == OK
    behind = check_clock(datetime(1970, 1, 1, tzinfo=timezone.utc), None)  # a box without an RTC
    assert behind.status == FAIL and "1970-01-01 00:00 UTC: before this version was made" in behind.detail
    assert behind.fix.startswith("timedatectl set-ntp true")
    assert check_clock(datetime(BUILD_YEAR + 30, 1, 1, tzinfo=timezone.utc), True).status == WARN
    unsynced = check_clock(datetime(BUILD_YEAR, 6, 1, tzinfo=timezone.utc), False)
    assert unsynced.status == WARN and "not synchronised with NTP" in unsynced.detail


def test_a_check_that_hangs_is_a_fail_not_a_hang() -> None:
    release = threading.Event()
    started = time.monotonic()
    rows = bounded("camera", lambda: Check("camera", OK, "never") if release.wait(30) else [], 0.2)
    assert time.monotonic() - started < 2
    release.set()
    assert [(r.name, r.status, r.detail) for r in rows] == [("camera", FAIL, "did not finish within 0.2 s")]
