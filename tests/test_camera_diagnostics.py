"""Why a camera could not be opened (agent/sources/diagnose.py), asked of real things: device nodes
made with mknod, a process holding one, loopback ports nobody listens on or nobody answers on, a
network namespace without routes, a real HTTP server answering 401/403/404/200, GStreamer's RTSP
server with a login; then through `edge-agent source` and `edge-agent doctor` as a user meets it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from agent.sources.diagnose import diagnose_device, diagnose_url, holders
from tests.agent_process import EDGE_AGENT
from tests.media_fixtures import demo_video_module
from tests.rtsp_camera import RtspServer
from tests.waits import free_port

# --- device nodes ----------------------------------------------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder any user can enter (pytest's tmp_path is root's only), for the non-root checks."""
    path = Path(tempfile.mkdtemp(prefix="edge-agent-diag-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_missing_device_names_the_cameras_there_are(tmp_path: Path) -> None:
    (tmp_path / "video0").write_bytes(b"")
    said = diagnose_device(tmp_path / "video7")
    assert said == f"no such device {tmp_path}/video7 (video devices on this box: {tmp_path}/video0)"
    assert diagnose_device(tmp_path / "video0") == f"{tmp_path}/video0 is not a device node"


def test_a_device_without_permission_names_its_group(open_dir: Path) -> None:
    node = open_dir / "video42"
    os.mknod(node, 0o020600, os.makedev(81, 242))  # char device, root only
    # Asked as user nobody: a forked child that drops root (this interpreter lives under /root,
    # which nobody may execute, so no new process).
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os.write(write_end, diagnose_device(node).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        said = answer.read().decode()
    assert os.waitpid(child, 0)[1] == 0
    denied = f"permission denied on {node} (owner root:root, mode 600): add the agent's user to group root"
    assert said == denied


def test_a_node_without_a_driver_and_one_held_by_another_process(open_dir: Path) -> None:
    orphan = open_dir / "video43"
    os.mknod(orphan, 0o020660, os.makedev(81, 243))  # video4linux minor nobody registered
    said = diagnose_device(orphan)
    # Bare metal: no driver (ENXIO); in a container its device policy may refuse it first.
    assert said in (
        f"{orphan} has no driver behind it (unplugged, or the driver is not loaded)",
        f"the system refuses access to {orphan}: a device policy (the unit's DeviceAllow=, or a container's "
        "device list) does not include it",
    ), said
    # A node that opens (a copy of /dev/null) while another process holds it.
    node = open_dir / "video44"
    os.mknod(node, 0o020666, os.makedev(1, 3))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); print('ok', flush=True); "
         "time.sleep(60)", str(node)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        assert any(pid == holder.pid for pid, _ in holders(node)), holders(node)
        assert diagnose_device(node).startswith(
            f"{node} opens but gives no frames: it is in use by pid {holder.pid}"
        )
    finally:
        holder.kill()
        holder.wait(10)
    assert diagnose_device(node).startswith(f"{node} opens but gives no frames: not a capture node")


# --- network cameras -------------------------------------------------------------------------------


def test_nothing_listening_and_nobody_answering() -> None:
    port = free_port()
    assert diagnose_url(f"rtsp://127.0.0.1:{port}/stream") == (
        f"connection refused by 127.0.0.1:{port}: nothing listens there (wrong port, or service off)"
    )
    # A listener whose queue is full drops further SYNs: the connect times out, as with a camera
    # that is off behind a switch.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = socket.create_connection(server.getsockname(), timeout=5)
    try:
        host, busy_port = server.getsockname()
        started = time.monotonic()
        said = diagnose_url(f"rtsp://{host}:{busy_port}/stream", timeout_s=1.0)
        assert (
            said == f"no answer from {host}:{busy_port} within 1 s (camera off, a firewall, a wrong address)"
        )
        assert time.monotonic() - started < 30
    finally:
        filler.close()
        server.close()


def test_no_route_in_a_network_namespace_without_one() -> None:
    code = "from agent.sources.diagnose import diagnose_url; print(diagnose_url('rtsp://10.77.0.9/live'))"
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1], check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no route to 10.77.0.9:554 (Network is unreachable)"


class _Camera(BaseHTTPRequestHandler):
    """An HTTP camera: /video needs user cam:s3cret, /private is forbidden, the rest is missing."""

    def do_GET(self) -> None:
        import base64

        good = "Basic " + base64.b64encode(b"cam:s3cret").decode()
        if self.path == "/private":
            self._answer(403, b"no")
        elif self.path == "/page":
            self._answer(200, b"<html>a web page, not a stream</html>", "text/html")
        elif self.path != "/video":
            self._answer(404, b"no such path")
        elif self.headers.get("Authorization") != good:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="camera"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(200, b"not video either", "text/plain")

    def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_camera() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_http_camera_says_what_is_wrong(http_camera: str) -> None:
    base = f"http://{http_camera}"
    assert diagnose_url(f"{base}/video") == (
        "the camera refused the login (HTTP 401 Unauthorized): the URI has no user:password"
    )
    assert diagnose_url(f"http://cam:wrong@{http_camera}/video") == (
        "the camera refused the login (HTTP 401 Unauthorized): the URI's user or password is wrong"
    )
    assert diagnose_url(f"{base}/private") == (
        "the camera refused access (HTTP 403 Forbidden): this user may not read /private"
    )
    assert (
        diagnose_url(f"{base}/nothing")
        == f"no stream at /nothing (HTTP 404 Not Found): check the path in {base}/nothing"
    )
    assert diagnose_url(f"{base}/page") == (
        "the camera answers (HTTP 200 OK) but no stream could be decoded (text/html): "
        "OpenCV could not decode it as video"
    )
    said = diagnose_url(f"http://cam:s3cret@{http_camera}/nothing")
    assert "s3cret" not in said and "cam:***@" in said


@pytest.fixture
def rtsp_camera(tmp_path: Path) -> Iterator[RtspServer]:
    image = demo_video_module().render_sign("GATE 4", True, np.random.default_rng(3))
    path = tmp_path / "sign.png"
    assert cv2.imwrite(str(path), image)
    server = RtspServer(path, "--user", "cam", "--password", "s3cret")
    server.start()
    yield server
    server.kill()


def test_an_rtsp_camera_with_a_login(rtsp_camera: RtspServer) -> None:
    where = f"127.0.0.1:{rtsp_camera.port}"
    assert diagnose_url(f"rtsp://{where}/stream") == (
        "the camera refused the login (RTSP 401 Unauthorized): the URI has no user:password"
    )
    assert diagnose_url(f"rtsp://cam:wrong@{where}/stream") == (
        "the camera refused the login (RTSP 401 Unauthorized): the URI's user or password is wrong"
    )
    assert diagnose_url(f"rtsp://cam:s3cret@{where}/other") == (
        f"no stream at /other (RTSP 404 Not Found): check the path in rtsp://cam:***@{where}/other"
    )
    # The right login gets past the server's check (what it says then is about the stream).
    assert "refused the login" not in diagnose_url(f"rtsp://cam:s3cret@{where}/stream")

    # As a user meets it: `edge-agent source` says why, and so does `edge-agent doctor`.
    uri = f"rtsp://cam:wrong@{where}/stream"
    done = subprocess.run([EDGE_AGENT, "source", uri, "--seconds", "3", "--json"], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the camera refused the login (RTSP 401 Unauthorized)" in done.stdout, done.stdout
    assert "wrong" not in done.stdout.replace("is wrong", "")  # the password is never shown


@pytest.mark.slow
def test_doctor_names_the_cause(tmp_path: Path, http_camera: str, cls_model_path: Path) -> None:
    config = {
        "device": {"id": "diag-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": free_port()},
        "pipelines": [
            {
                "name": "door",
                "model": {"path": str(cls_model_path)},
                "source": {"type": "video", "uri": f"http://{http_camera}/video"},
                "postprocess": {"type": "classification"},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([EDGE_AGENT, "doctor", "-c", str(path), "--json", "--timeout", "10"],
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    rows = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    door = rows["source:door"]
    assert door["status"] == "FAIL", door
    assert (
        "the camera refused the login (HTTP 401 Unauthorized): the URI has no user:password" in door["detail"]
    )
