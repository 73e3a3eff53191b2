"""A real CNCF distribution registry (Debian's `docker-registry`, v2.8) on loopback, for the OCI tests.

Started per test with its own storage folder, on a free port, over TLS with tests/pki.py's CA, and
with one of two kinds of auth:
- `htpasswd`: basic auth against a bcrypt htpasswd file (the registry answers 401 with a Basic
  challenge);
- `token`: the registry answers 401 with a Bearer challenge naming our token server (a real HTTPS
  server in this process) that checks basic credentials and issues ES256 JWTs for the scopes asked,
  signed by a key whose self-signed certificate is the registry's `rootcertbundle`, as Docker Hub,
  GHCR and Harbor do it.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import bcrypt
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.pki import Pki, tool
from tests.waits import free_port, wait_until

USER, PASSWORD = "edge", "s3cret-registry-pw"
SERVICE, ISSUER = "edge-test-registry", "edge-test-token-issuer"
START_TIMEOUT_S = 60.0


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """Issues registry tokens (JWT, ES256, x5c header) to clients with the right basic credentials;
    counts what it issued so tests can see the Bearer dance happened."""

    def __init__(self, workdir: Path, pki: Pki) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-test-token-signer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .sign(self._key, hashes.SHA256())
        )
        self.root_cert_bundle = workdir / "token-signer.crt"
        self.root_cert_bundle.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.issued: list[list[str]] = []  # the scopes of each token issued
        self.refused = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != expected or query.get("service") != [SERVICE]:
                    server.refused += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                scopes = query.get("scope", [])
                body = json.dumps({"token": server.token(scopes), "expires_in": 300}).encode()
                server.issued.append(scopes)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.realm = f"https://127.0.0.1:{self._httpd.server_address[1]}/token"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        der = self._cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        claims = {
            "iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 300, "nbf": now - 60, "iat": now,
            "jti": secrets.token_hex(8), "access": access,
        }  # fmt: skip
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass
class DistributionRegistry:
    """`docker-registry serve` with a config written for this test; see the module docstring."""

    workdir: Path
    pki: Pki
    auth: str = "htpasswd"  # or "token"
    port: int = field(default_factory=free_port)
    token_server: TokenServer | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        auth: dict[str, Any]
        if self.auth == "htpasswd":
            htpasswd = self.workdir / "htpasswd"
            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()
            htpasswd.write_text(f"{USER}:{hashed}\n")
            auth = {"htpasswd": {"realm": "edge-test", "path": str(htpasswd)}}
        elif self.auth == "token":
            self.token_server = TokenServer(self.workdir, self.pki)
            auth = {
                "token": {
                    "realm": self.token_server.realm, "service": SERVICE, "issuer": ISSUER,
                    "rootcertbundle": str(self.token_server.root_cert_bundle),
                }
            }  # fmt: skip
        else:
            raise ValueError(f"unknown auth {self.auth!r}")
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.workdir / "storage")},
                "delete": {"enabled": True},
            },
            "http": {
                "addr": f"127.0.0.1:{self.port}",
                "tls": {"certificate": str(self.pki.server_cert), "key": str(self.pki.server_key)},
            },
            "auth": auth,
        }
        self.config_file = self.workdir / "config.yml"
        self.config_file.write_text(json.dumps(config))  # JSON is YAML
        self.log_file = self.workdir / "registry.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = tool("docker-registry", "docker-registry")
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [binary, "serve", str(self.config_file)], stdout=log, stderr=subprocess.STDOUT
            )

        def answers() -> bool:
            assert self._process is not None
            if self._process.poll() is not None:
                pytest.fail(f"docker-registry exited with {self._process.returncode}: {self.log_tail()}")
            try:
                context = ssl.create_default_context(cafile=str(self.pki.ca))
                return httpx.get(f"https://{self.host}/v2/", verify=context, timeout=2).status_code == 401
            except httpx.HTTPError:
                return False

        wait_until(answers, "docker-registry answering on its port", timeout=START_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
        if self.token_server is not None:
            self.token_server.close()


@pytest.fixture
def oci_registry(tmp_path: Path, pki: Pki) -> Iterator[DistributionRegistry]:
    """A distribution registry with htpasswd (basic) auth over TLS."""
    registry = DistributionRegistry(tmp_path / "oci", pki, auth="htpasswd")
    yield registry
    registry.close()


@pytest.fixture
def oci_token_registry(tmp_path: Path, pki: Pki) -> Iterator[DistributionRegistry]:
    """A distribution registry behind a token server (Bearer challenges), over TLS."""
    registry = DistributionRegistry(tmp_path / "oci-token", pki, auth="token")
    yield registry
    registry.close()
