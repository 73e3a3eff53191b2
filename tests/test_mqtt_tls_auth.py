"""MqttConnection against a real mosquitto with TLS, mutual TLS and username/password (nothing patched).

Certificates come from the `openssl` CLI at test time (a throwaway EC CA, a server certificate for
the IP 127.0.0.1, a client certificate for mutual TLS, and a second CA that signed nothing we use);
the password file comes from `mosquitto_passwd`.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import MqttConfig, TlsConfig
from agent.errors import ConfigError
from agent.mqtt import MqttConnection, Outbox
from tests.mosquitto import Mosquitto
from tests.pki import Pki, run_tool, tool
from tests.tls_fixtures import (
    DEVICE,
    OFFLINE,
    ONLINE,
    PASSWORD,
    USER,
    ConnectionFactory,
    Watcher,
    assert_delivers,
    assert_never_connects,
    assert_refused,
    no_tracebacks,
    plain_client_connects,
    put_results,
    tls_listener,
)
from tests.tls_fixtures import brokers as brokers  # fixtures
from tests.tls_fixtures import connections as connections
from tests.tls_fixtures import outbox as outbox
from tests.tls_fixtures import watchers as watchers
from tests.waits import wait_until

# -- TLS --------------------------------------------------------------------------------------------


def test_tls_with_server_verification_delivers(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
) -> None:
    broker = brokers(extra_config=tls_listener(pki))
    # The listener really is TLS-only: a plain MQTT client never gets a CONNACK.
    assert not plain_client_connects(broker)
    watcher = watchers(broker, ca=pki.ca)

    conn = connections(broker, tls=TlsConfig(ca_file=pki.ca))
    assert_delivers(conn, outbox, watcher, [], [f"r{i}" for i in range(5)])
    assert watcher.statuses() == [ONLINE]


def test_tls_with_the_wrong_ca_never_connects_and_keeps_the_results(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = brokers(extra_config=tls_listener(pki))
    watcher = watchers(broker, ca=pki.ca)
    put_results(None, outbox, ["a", "b", "c"])

    bad = connections(broker, tls=TlsConfig(ca_file=pki.other_ca))
    error = assert_refused(bad, outbox, 3, ("certificate verify failed",))
    assert f"127.0.0.1:{broker.port}" in error
    # It kept retrying (one handshake per attempt), never got as far as MQTT, and stops cleanly.
    wait_until(
        lambda: broker.log_tail(500).count("alert unknown ca") >= 2,
        "a second refused handshake",
        timeout=30.0,
        state=lambda: broker.log_tail(50),
    )
    assert bad.stats()["connects"] == 0
    # The operator reads why in the agent's log too, not just "cannot reach".
    assert any(
        r.name == "agent.mqtt.connection" and "certificate verify failed" in r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING
    )
    started = time.monotonic()
    bad.stop()
    # Cleanly: its threads are gone (one stuck would outlive stop's 5 s joins), and it did not hang on
    # the reconnect loop (15 s: generous for a busy machine, where a clean stop takes well under 1 s).
    assert not bad.publisher.is_alive() and not bad.subscriptions.is_alive()
    assert time.monotonic() - started < 15.0
    assert watcher.statuses() == [] and watcher.result_ids() == []
    no_tracebacks(caplog)

    # Nothing was lost: with the right CA the same outbox delivers all of it.
    good = connections(broker, tls=TlsConfig(ca_file=pki.ca))
    assert_delivers(good, outbox, watcher, ["a", "b", "c"], ["d"])


def test_mutual_tls_needs_the_client_certificate(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = brokers(extra_config=tls_listener(pki, require_certificate=True))
    watcher = watchers(broker, ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    put_results(None, outbox, ["m1", "m2"])

    anonymous = connections(broker, tls=TlsConfig(ca_file=pki.ca))
    # With TLS 1.3 the client's handshake completes and the broker's alert only arrives on the first
    # read, after CONNECT: paho logs it (through the agent's logger) and treats it as a lost link.
    wait_until(
        lambda: any("certificate required" in r.getMessage() for r in caplog.records),
        "the agent's log to name the missing certificate",
        timeout=30.0,
    )
    wait_until(  # it kept retrying: a second attempt refused too
        lambda: broker.log_tail(500).count("peer did not return a certificate") >= 2,
        "a second refused attempt",
        timeout=30.0,
        state=lambda: broker.log_tail(50),
    )
    assert_never_connects(anonymous, outbox, 2)
    error = str(anonymous.stats()["last_error"])
    # The alert, or (when the broker closes before the client reads it) a bare end of the TLS stream:
    # either way the error says what to do about it.
    assert "closed before CONNACK" in error, error
    assert "certificate required" in error or "EOF occurred in violation of protocol" in error, error
    assert "give mqtt.tls.cert_file and key_file" in error, error
    anonymous.stop()
    assert watcher.statuses() == [] and watcher.result_ids() == []
    no_tracebacks(caplog)

    with_cert = connections(
        broker, tls=TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    )
    assert_delivers(with_cert, outbox, watcher, ["m1", "m2"], ["m3"])


class TlsCutter:
    """A TLS listener on loopback that completes the handshake, reads the client's first bytes (its
    CONNECT) and closes the TCP connection without a TLS alert or close_notify: what a TLS 1.3 broker
    refusing the client can look like when it closes before the client reads its alert."""

    def __init__(self, pki: Pki) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(pki.server_cert, pki.server_key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.5)
        self.host, self.port = "127.0.0.1", self.listener.getsockname()[1]
        self.cut = 0
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="tls-cutter", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:  # the accept timeout, or the listener closed
                continue
            raw.settimeout(5.0)
            try:
                tls = self.context.wrap_socket(raw, server_side=True)
                tls.recv(1)  # the client has sent its CONNECT
                os.close(tls.detach())  # the TCP connection ends; TLS is never closed
                self.cut += 1
            except OSError:
                raw.close()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        self.thread.join(timeout=5)


def test_a_tls_session_cut_without_an_alert_still_says_what_to_check(
    pki: Pki, connections: ConnectionFactory, outbox: Outbox
) -> None:
    cutter = TlsCutter(pki)
    try:
        conn = connections(cutter, tls=TlsConfig(ca_file=pki.ca))
        wait_until(
            lambda: "closed before CONNACK" in str(conn.stats()["last_error"] or "") and cutter.cut >= 2,
            "two attempts cut short",
            timeout=30.0,
            state=conn.stats,
        )
        error = str(conn.stats()["last_error"])
        # (Python's ssl reads a TCP close without close_notify as a plain end of the stream.)
        assert "EOF occurred in violation of protocol" in error or "the broker closed the connection" in error
        assert "the broker ended the TLS session" in error and "give mqtt.tls.cert_file and key_file" in error
        assert conn.stats()["connected"] is False
    finally:
        cutter.close()


# -- username and password ----------------------------------------------------------------------------


@pytest.fixture
def password_broker(brokers: Callable[..., Mosquitto], tmp_path: Path) -> Mosquitto:
    passwd = tool("mosquitto_passwd", "mosquitto")
    password_file = tmp_path / "passwd"
    run_tool([passwd, "-b", "-c", str(password_file), USER, PASSWORD], tmp_path)
    os.chmod(password_file, 0o600)
    return brokers(allow_anonymous=False, extra_config=f"password_file {password_file}")


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_username_and_password(
    protocol: str,
    password_broker: Mosquitto,
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = password_broker
    watcher = watchers(broker, username=USER, password=PASSWORD)
    put_results(None, outbox, ["p1", "p2", "p3"])

    anonymous = connections(broker, protocol)
    assert_refused(anonymous, outbox, 3, ("not authori", "bad user name or password"))
    anonymous.stop()

    wrong = connections(broker, protocol, username=USER, password="wrong-" + PASSWORD)
    error = assert_refused(wrong, outbox, 3, ("not authori", "bad user name or password"))
    assert "refused the connection" in error and f"127.0.0.1:{broker.port}" in error
    assert any(
        "refused the connection" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records
    )
    wrong.stop()
    assert watcher.statuses() == [] and watcher.result_ids() == []
    no_tracebacks(caplog)

    right = connections(broker, protocol, username=USER, password=PASSWORD)
    assert_delivers(right, outbox, watcher, ["p1", "p2", "p3"], ["p4"])


def test_a_password_file_logs_in_and_the_password_is_never_logged(
    password_broker: Mosquitto,
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = password_broker
    watcher = watchers(broker, username=USER, password=PASSWORD)
    put_results(None, outbox, ["f1", "f2"])

    wrong_file = tmp_path / "wrong.pw"
    wrong_file.write_text("wrong-" + PASSWORD + "\n")
    wrong = connections(broker, username=USER, password_file=wrong_file)
    assert_refused(wrong, outbox, 2, ("not authori", "bad user name or password"))
    wrong.stop()

    password_file = tmp_path / "mqtt.pw"
    password_file.write_text(PASSWORD + "\n")  # the newline `echo` leaves is not part of it
    os.chmod(password_file, 0o600)
    right = connections(broker, username=USER, password_file=password_file)
    assert_delivers(right, outbox, watcher, ["f1", "f2"], ["f3"])
    logged = "\n".join(r.getMessage() for r in caplog.records)  # paho's debug lines included
    assert "Sending CONNECT" in logged and PASSWORD not in logged
    assert PASSWORD not in repr(right._config) and PASSWORD not in str(right.stats())
    no_tracebacks(caplog)


def test_tls_files_that_do_not_exist_are_a_config_error(tmp_path: Path, outbox: Outbox) -> None:
    config = MqttConfig(tls=TlsConfig(ca_file=tmp_path / "missing-ca.crt"))
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        MqttConnection(config, DEVICE, outbox, lambda: ONLINE, lambda: OFFLINE)
