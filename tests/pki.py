"""A throwaway PKI made with the `openssl` CLI at test time, for the TLS tests (MQTT, HTTPS registry):
an EC CA, a server certificate for the IP 127.0.0.1, a client certificate for mutual TLS, a second
CA that signed neither of those (and its own client certificate, which the first CA's brokers must
refuse), and a server certificate from the first CA for another host name (broker.example)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TOOL_TIMEOUT_S = 120.0  # generous: openssl and mosquitto_passwd on a busy machine
CLIENT_CN = "edge-agent-dev1"


def tool(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/usr/bin")
    if found is None:
        pytest.fail(f"{name} is not installed; these tests need it (apt-get install {package})")
    return found


def run_tool(args: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} did not finish within {TOOL_TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed with {done.returncode}:\n{done.stdout}\n{done.stderr}")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed neither the server nor the client certificate
    other_client_cert: Path  # a client certificate from other_ca: untrusted where `ca` is the trust
    other_client_key: Path
    misnamed_server_cert: Path  # from `ca`, for broker.example only: no match for 127.0.0.1
    misnamed_server_key: Path


def _make_ca(openssl: str, workdir: Path, name: str) -> tuple[Path, Path]:
    cert, key = workdir / f"{name}.crt", workdir / f"{name}.key"
    # -addext: basicConstraints and keyUsage are what a strict verifier wants from a CA.
    run_tool(
        [
            openssl, "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ],
        workdir,
    )  # fmt: skip
    return cert, key


def _make_leaf(
    openssl: str, workdir: Path, name: str, subject: str, extensions: list[str], ca: tuple[Path, Path]
) -> tuple[Path, Path]:
    cert, key, csr, ext = (workdir / f"{name}.{suffix}" for suffix in ("crt", "key", "csr", "ext"))
    ext.write_text(
        "\n".join(
            [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature",
                "subjectKeyIdentifier=hash",
                "authorityKeyIdentifier=keyid",
                *extensions,
            ]
        )
        + "\n"
    )
    run_tool(
        [
            openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", subject,
        ],
        workdir,
    )  # fmt: skip
    run_tool(
        [
            openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
            "-set_serial", str(time.time_ns()), "-days", "2", "-extfile", str(ext), "-out", str(cert),
        ],
        workdir,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    openssl = tool("openssl", "openssl")
    workdir = tmp_path_factory.mktemp("pki")
    ca = _make_ca(openssl, workdir, "edge-test-ca")
    other_ca = _make_ca(openssl, workdir, "edge-test-other-ca")
    server_cert, server_key = _make_leaf(
        openssl,
        workdir,
        "server",
        "/CN=127.0.0.1",
        ["extendedKeyUsage=serverAuth", "subjectAltName=IP:127.0.0.1"],
        ca,
    )
    client_cert, client_key = _make_leaf(
        openssl, workdir, "client", f"/CN={CLIENT_CN}", ["extendedKeyUsage=clientAuth"], ca
    )
    other_client_cert, other_client_key = _make_leaf(
        openssl, workdir, "other-client", f"/CN={CLIENT_CN}", ["extendedKeyUsage=clientAuth"], other_ca
    )
    misnamed_cert, misnamed_key = _make_leaf(
        openssl,
        workdir,
        "misnamed-server",
        "/CN=broker.example",
        ["extendedKeyUsage=serverAuth", "subjectAltName=DNS:broker.example"],
        ca,
    )
    return Pki(
        ca[0],
        server_cert,
        server_key,
        client_cert,
        client_key,
        other_ca[0],
        other_client_cert,
        other_client_key,
        misnamed_cert,
        misnamed_key,
    )
