"""A real HTTP(S) server on loopback that serves a registry folder the way a web server does, and can
be told to misbehave: for the HTTP registry tests.

It does what nginx does for static files (ETag and Last-Modified, If-None-Match -> 304, Range with
If-Range -> 206), checks basic or bearer auth when asked, and logs every request. `faults` maps a
URL path to what goes wrong there, each fault used `times` times (then the path behaves again):

- ("status", code): answer `code` with a short text body
- ("garbage", body): answer 200 with these bytes instead of the file
- ("truncate", n): promise the whole file, send its first n bytes, close
- ("stall", n): send n bytes, then nothing for `stall_s` seconds
- ("redirect", url): 302 to `url`
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class Fault:
    kind: str
    value: Any
    times: int = 1


@dataclass
class Served:
    """One request as the server saw it."""

    path: str
    status: int
    headers: dict[str, str]
    body_bytes: int


@dataclass
class RegistryServer:
    root: Path
    username: str | None = None
    password: str | None = None
    token: str | None = None
    stall_s: float = 30.0
    tls: tuple[Path, Path] | None = None  # (certificate, key): serve https
    port: int = 0  # 0: a free one
    faults: dict[str, Fault] = field(default_factory=dict)
    requests: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        self._httpd.daemon_threads = True
        if self.tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="registry-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def fault(self, path: str, kind: str, value: Any = None, times: int = 1) -> None:
        with self._lock:
            self.faults[path] = Fault(kind, value, times)

    def take_fault(self, path: str) -> Fault | None:
        with self._lock:
            fault = self.faults.get(path)
            if fault is None:
                return None
            fault.times -= 1
            if fault.times <= 0:
                del self.faults[path]
            return fault

    def record(self, served: Served) -> None:
        with self._lock:
            self.requests.append(served)

    def served(self, suffix: str = "") -> list[Served]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith(suffix)]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def etag_of(data: bytes) -> str:
    """The ETag this server gives a body."""
    return '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


def _handler_for(server: RegistryServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read `requests`
            pass

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            headers = {k: v for k, v in self.headers.items()}
            if not self._authorised():
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="registry"')
                self._finish_text(path, 401, b"unauthorised\n", headers)
                return
            fault = server.take_fault(path)
            if fault is not None and fault.kind == "status":
                self.send_response(int(fault.value))
                self._finish_text(path, int(fault.value), b"injected failure\n", headers)
                return
            if fault is not None and fault.kind == "redirect":
                self.send_response(302)
                self.send_header("Location", str(fault.value))
                self._finish_text(path, 302, b"", headers)
                return
            file = (server.root / path.lstrip("/")).resolve()
            if not file.is_relative_to(server.root.resolve()) or not file.is_file():
                self.send_response(404)
                self._finish_text(path, 404, b"not found\n", headers)
                return
            data = file.read_bytes() if fault is None or fault.kind != "garbage" else bytes(fault.value)
            etag = etag_of(data)
            modified = email.utils.formatdate(file.stat().st_mtime, usegmt=True)
            if self.headers.get("If-None-Match") == etag:
                self.send_response(304)
                self.send_header("ETag", etag)
                self._finish_text(path, 304, b"", headers, length=False)
                return
            start = 0
            wanted = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if (
                wanted
                and wanted.startswith("bytes=")
                and wanted.endswith("-")
                and if_range in (None, etag, modified)
            ):
                start = int(wanted[len("bytes=") : -1])
            if 0 < start < len(data):
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                status, body = 206, data[start:]
            else:
                self.send_response(200)
                status, body = 200, data
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
            self.send_header("Accept-Ranges", "bytes")
            sent = body
            if fault is not None and fault.kind == "length":  # declares (and sends) fewer bytes than the file
                body = sent = body[: int(fault.value)]
            self.send_header("Content-Length", str(len(body)))
            if fault is not None and fault.kind in ("truncate", "stall"):
                sent = body[: int(fault.value)]
            server.record(Served(path, status, headers, len(sent)))  # before the client can see it
            self.end_headers()
            self.wfile.write(sent)
            self.wfile.flush()
            if fault is not None and fault.kind == "stall":
                time.sleep(server.stall_s)
            if len(sent) < len(body):
                self.close_connection = True

        def _authorised(self) -> bool:
            given = self.headers.get("Authorization", "")
            if server.token is not None:
                return given == f"Bearer {server.token}"
            if server.username is not None:
                pair = f"{server.username}:{server.password}".encode()
                return given == "Basic " + base64.b64encode(pair).decode()
            return True

        def _finish_text(
            self, path: str, status: int, body: bytes, headers: dict[str, str], length: bool = True
        ) -> None:
            if length:
                self.send_header("Content-Length", str(len(body)))
            server.record(Served(path, status, headers, len(body)))  # before the client can see it
            self.end_headers()
            self.wfile.write(body)

    return Handler
