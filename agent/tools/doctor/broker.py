"""The broker check: TCP, TLS and the MQTT login, as the agent connects."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from typing import Any

from agent.config import (
    CLIENT_ID_MAX,
    AgentConfig,
    TlsConfig,
)
from agent.errors import ConfigError
from agent.tools.doctor.core import FAIL, OK, Check

# --- broker ---------------------------------------------------------------------------------

# CONNACK reason codes (MQTT 5; paho maps MQTT 3.1.1's return codes onto them) -> what to do.
CONNACK_FIXES = {
    0x84: 'the broker does not speak this MQTT version: set mqtt.protocol to "3.1.1" (or "5")',
    0x85: "the broker refuses the client id: check mqtt.client_id",
    0x86: "check mqtt.username and the password (mqtt.password or the first line of mqtt.password_file) "
    "against the broker's password file",
    0x88: "the broker is unavailable: see its log (starting, overloaded, or a bridge down)",
    0x89: "the broker is busy: see its log, try again in a moment",
    0x8A: "the broker banned this client: ask whoever runs it",
    0x8C: "the broker wants another authentication method: check its auth plugin settings",
    0x9F: "the broker limits how fast clients connect: try again in a moment",
}


def _refusal_fix(code: int, username: str | None) -> str:
    if code != 0x87:  # "not authorized"
        return CONNACK_FIXES.get(code, "see the broker's log for why it refused")
    if username is None:
        return "the broker wants a login: set mqtt.username and mqtt.password_file (or allow_anonymous)"
    # mosquitto answers a wrong password with "not authorized" too, not "bad user name or password".
    return (
        "check mqtt.username and its password (mqtt.password or the first line of mqtt.password_file) "
        "against the broker's password file, and the broker's ACL for this user"
    )


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_NAME_MISMATCH = (62, 64)


def doctor_client_id(agent_client_id: str) -> str:
    """The agent's client id plus "-doctor": a broker drops the older of two clients with one id,
    and doctor must not kick the running agent off."""
    suffix = "-doctor"
    return agent_client_id[: CLIENT_ID_MAX - len(suffix)] + suffix


def check_broker(config: AgentConfig, timeout_s: float) -> Check:
    """TCP connect, TLS handshake (with mqtt.tls), then an MQTT CONNECT with the agent's login."""
    cfg = config.mqtt
    problem = tcp_problem(cfg.host, cfg.port, timeout_s, "mqtt.host / mqtt.port", "the broker")
    if problem is None and cfg.tls is not None:
        problem = _tls_problem(cfg.host, cfg.port, cfg.tls, timeout_s)
    if problem is not None:
        return Check("broker", FAIL, *problem)
    return _mqtt_login(config, timeout_s)


def tcp_problem(host: str, port: int, timeout_s: float, keys: str, what: str) -> tuple[str, str] | None:
    """(detail, fix) when nothing answers at host:port; None when a TCP connection is made."""
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}", f"check {keys.split(' / ')[0]} (DNS, /etc/hosts)"
    except ConnectionRefusedError:
        return (
            f"{where} refused the connection: nothing listens there",
            f"start {what} (e.g. systemctl status mosquitto) or fix {keys}",
        )
    except TimeoutError:
        return (
            f"no answer from {where} within {timeout_s:g} s",
            f"check that {host} is up and that a firewall lets port {port} through",
        )
    except OSError as exc:
        return f"cannot reach {where}: {exc.strerror or exc}", f"check the network route to {host}"


def _tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The checks paho makes with mqtt.tls (agent/mqtt/client.py use_credentials)."""
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    context.check_hostname = not tls.insecure
    return context


def _tls_problem(host: str, port: int, tls: TlsConfig, timeout_s: float) -> tuple[str, str] | None:
    where = f"{host}:{port}"
    try:
        context = _tls_context(tls)
    except (OSError, ssl.SSLError) as exc:
        return (
            f"cannot load the TLS files: {getattr(exc, 'strerror', None) or exc}",
            "check that mqtt.tls.ca_file, cert_file and key_file exist and are readable PEM files",
        )
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in _NAME_MISMATCH:
            return (
                f"the broker's certificate is not for {host!r}: {exc.verify_message}",
                "set mqtt.host to a name or address the certificate holds, or give the broker a "
                "certificate for this one",
            )
        return (
            f"the broker's certificate is not trusted: {exc.verify_message}",
            "mqtt.tls.ca_file must be the CA that signed the broker's certificate",
        )
    except ssl.SSLError as exc:
        return (
            f"TLS handshake with {where} failed: {exc.reason or exc}",
            f"check that {where} is the broker's TLS listener, and mqtt.tls.cert_file / key_file if it "
            "wants a client certificate",
        )
    except TimeoutError:
        return (
            f"no TLS handshake from {where} within {timeout_s:g} s",
            "check that this port is the broker's TLS listener (usually 8883)",
        )
    except OSError as exc:
        return (
            f"{where} closed the connection during the TLS handshake: {exc.strerror or exc}",
            "check that this port is the broker's TLS listener (usually 8883)",
        )


def _mqtt_login(config: AgentConfig, timeout_s: float) -> Check:
    from paho.mqtt.enums import MQTTErrorCode

    from agent.mqtt.client import make_client

    cfg = config.mqtt
    where = f"{cfg.host}:{cfg.port}"
    client_id = doctor_client_id(cfg.client_id or f"edge-agent-{config.device.id}")
    try:
        # A clean session whatever mqtt.session_expiry_s says (that is the agent's own session).
        client = make_client(cfg.model_copy(update={"session_expiry_s": 0}), client_id)
    except ConfigError as exc:
        return Check("broker", FAIL, exc.message, exc.hint or "check mqtt.password_file and mqtt.tls")
    client.connect_timeout = timeout_s
    answers: list[Any] = []
    client.on_connect = lambda _c, _u, _flags, reason, _props: answers.append(reason)
    try:
        client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive_s)
    except (OSError, ValueError) as exc:
        return Check("broker", FAIL, f"cannot connect to {where}: {exc}", "see the broker's log")
    closed = False
    try:
        deadline = time.monotonic() + timeout_s
        while not answers and time.monotonic() < deadline:
            if client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS and not answers:
                closed = True
                break
        if answers and not answers[0].is_failure:
            client.disconnect()
            client.loop(timeout=0.1)  # sends the DISCONNECT
    finally:
        sock = client.socket()
        if sock is not None:  # refused, or no answer: paho leaves its socket open
            with contextlib.suppress(OSError):
                sock.close()
    login = f"{cfg.username!r}" if cfg.username else "an anonymous client"
    if not answers:
        if closed:
            return Check(
                "broker",
                FAIL,
                f"{where} closed the connection before answering the MQTT CONNECT",
                "if the port is TLS, give mqtt.tls; if the broker wants a client certificate, give "
                "mqtt.tls.cert_file / key_file; its log says why",
            )
        return Check(
            "broker",
            FAIL,
            f"no CONNACK from {where} within {timeout_s:g} s: it takes TCP connections but does not "
            "answer MQTT",
            "check that this is the broker's MQTT port (a TLS port needs mqtt.tls), and the broker's "
            "log and load",
        )
    reason = answers[0]
    tls = ", TLS" if cfg.tls is not None else ""
    if reason.is_failure:
        code = reason.value
        return Check(
            "broker",
            FAIL,
            f"{where} refused the login of {login}: {reason} ({code:#x})",
            _refusal_fix(code, cfg.username),
        )
    return Check(
        "broker", OK, f"logged in to {where} as {login} (MQTT {cfg.protocol}{tls}, client id {client_id})"
    )
