"""Mutual TLS and broker host name checks against a real mosquitto (nothing patched): what
tests/test_mqtt_tls_auth.py does not already cover.

Covered there: server verification with the right CA delivers; the wrong CA never connects and keeps
the results; a broker that requires a client certificate refuses a client without one, and one with
a certificate from the trusted CA connects and delivers (case a).
Here: (b) a client certificate from a CA the broker does not trust is refused, with a clear error,
the results stay in the outbox and nothing crashes; (c) a broker whose certificate is for another
host name is refused with an error that says so, and `tls.insecure: true` connects to it anyway
(the certificate chain is still checked) with a WARNING once per start, not per reconnect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from agent.config import TlsConfig
from agent.mqtt import MqttConnection, Outbox
from tests.mosquitto import Mosquitto
from tests.pki import Pki
from tests.tls_fixtures import (
    ConnectionFactory,
    Watcher,
    assert_delivers,
    assert_refused,
    no_tracebacks,
    put_results,
    tls_listener,
)
from tests.tls_fixtures import brokers as brokers  # fixtures
from tests.tls_fixtures import connections as connections
from tests.tls_fixtures import outbox as outbox
from tests.tls_fixtures import watchers as watchers
from tests.waits import wait_until


def _misnamed_listener(pki: Pki) -> str:
    """A broker on 127.0.0.1 whose certificate (from the trusted CA) is for broker.example only."""
    return f"cafile {pki.ca}\ncertfile {pki.misnamed_server_cert}\nkeyfile {pki.misnamed_server_key}"


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "agent.mqtt.connection" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


def _stops_cleanly(conn: MqttConnection) -> None:
    # Still running while refused (it did not crash), then gone on stop.
    assert conn.publisher.is_alive() and conn.subscriptions.is_alive()
    conn.stop()
    assert not conn.publisher.is_alive() and not conn.subscriptions.is_alive()


def test_a_client_certificate_from_an_untrusted_ca_is_refused_and_the_results_wait(
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
    put_results(None, outbox, ["u1", "u2", "u3"])

    # The agent trusts the broker (right CA), but its own certificate is from another CA.
    untrusted = connections(
        broker, tls=TlsConfig(ca_file=pki.ca, cert_file=pki.other_client_cert, key_file=pki.other_client_key)
    )
    error = assert_refused(untrusted, outbox, 3, ("unknown ca",))
    # status.json shows this `last_error`: what happened, where, and what to check.
    assert f"127.0.0.1:{untrusted._config.port}" in error and "closed before CONNACK" in error
    assert "mqtt.tls.cert_file" in error, error
    wait_until(  # it kept retrying, each attempt refused by the broker
        lambda: broker.log_tail(500).count("certificate verify failed") >= 2,
        "a second refused attempt",
        timeout=30.0,
        state=lambda: broker.log_tail(50),
    )
    # The agent says so itself, once (paho's own socket error lines come on each attempt).
    said = _warnings(caplog, "closed before CONNACK")
    assert len(said) == 1 and "mqtt.tls.cert_file" in said[0], said  # (the alert, or a bare EOF: see above)
    _stops_cleanly(untrusted)
    assert outbox.pending() == 3
    assert watcher.statuses() == [] and watcher.result_ids() == []
    no_tracebacks(caplog)

    # Nothing was lost: with the trusted certificate the same outbox delivers all of it.
    trusted = connections(
        broker, tls=TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    )
    assert_delivers(trusted, outbox, watcher, ["u1", "u2", "u3"], ["u4"])


def test_a_broker_certificate_for_another_host_name_is_refused(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = brokers(extra_config=_misnamed_listener(pki))
    watcher = watchers(broker, ca=pki.ca, insecure=True)
    put_results(None, outbox, ["h1", "h2"])

    # Signed by the CA the agent trusts, but for broker.example, while the agent dials 127.0.0.1.
    checked = connections(broker, tls=TlsConfig(ca_file=pki.ca))
    error = assert_refused(checked, outbox, 2, ("mismatch",))
    assert "TLS handshake with MQTT broker" in error and f"127.0.0.1:{broker.port}" in error
    assert "not for the host name '127.0.0.1' (mqtt.host)" in error, error
    said = _warnings(caplog, "not for the host name")
    assert len(said) == 1, said  # once, not at every retry
    _stops_cleanly(checked)
    assert not _warnings(caplog, "mqtt.tls.insecure is true")  # hostname checks are on unless turned off
    assert watcher.statuses() == [] and watcher.result_ids() == []
    no_tracebacks(caplog)


def test_insecure_skips_the_host_name_check_with_a_warning_once_per_start(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    watchers: Callable[..., Watcher],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = brokers(extra_config=_misnamed_listener(pki))
    watcher = watchers(broker, ca=pki.ca, insecure=True)
    put_results(None, outbox, ["i1"])

    insecure = connections(broker, tls=TlsConfig(ca_file=pki.ca, insecure=True))
    assert_delivers(insecure, outbox, watcher, ["i1"], ["i2"])
    warned = _warnings(caplog, "mqtt.tls.insecure is true")
    assert len(warned) == 1, warned
    assert "not checked against the host name 127.0.0.1" in warned[0]
    assert "pose as the broker" in warned[0]  # names the risk

    # A reconnect (the broker restarted) is no new start: no second warning.
    broker.restart()
    wait_until(
        lambda: insecure.stats()["connects"] == 2 and insecure.connected,
        "the reconnect after the broker restarted",
        timeout=60.0,
        state=insecure.stats,
    )
    after = watchers(broker, ca=pki.ca, insecure=True)  # subscribed on the restarted broker
    put_results(insecure, outbox, ["i3"])
    after.wait_until(lambda: "i3" in after.result_ids(), "i3 after the reconnect", timeout=60.0)
    assert len(_warnings(caplog, "mqtt.tls.insecure is true")) == 1
    no_tracebacks(caplog)


def test_insecure_still_checks_the_certificate_chain(
    pki: Pki,
    brokers: Callable[..., Mosquitto],
    connections: ConnectionFactory,
    outbox: Outbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """insecure skips only the host name: a broker certificate from a CA the agent does not trust is
    refused as before."""
    caplog.set_level(logging.DEBUG)
    broker = brokers(extra_config=tls_listener(pki))
    put_results(None, outbox, ["c1"])
    conn = connections(broker, tls=TlsConfig(ca_file=pki.other_ca, insecure=True))
    error = assert_refused(conn, outbox, 1, ("certificate verify failed",))
    assert "mismatch" not in error
    assert len(_warnings(caplog, "mqtt.tls.insecure is true")) == 1
    _stops_cleanly(conn)
    no_tracebacks(caplog)
