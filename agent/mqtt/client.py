"""A paho client from the `mqtt:` config, and what its TLS failures mean: the daemon's connection,
the MQTT sensor sources and `edge-agent doctor` set their clients up the same way."""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from agent.config import MqttConfig
from agent.errors import ConfigError


def use_credentials(client: mqtt.Client, cfg: MqttConfig) -> None:
    """The broker login and TLS of `mqtt:` on a paho client (the agent's, and its MQTT sensor sources').
    mqtt.password_file is read here: ConfigError when it cannot be."""
    if cfg.username is not None:
        client.username_pw_set(cfg.username, cfg.login_password())
    if cfg.tls is not None:
        tls = cfg.tls
        try:
            client.tls_set(
                ca_certs=str(tls.ca_file) if tls.ca_file else None,
                certfile=str(tls.cert_file) if tls.cert_file else None,
                keyfile=str(tls.key_file) if tls.key_file else None,
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(
                [f"mqtt.tls: cannot load the TLS files: {exc}"],
                hint="check mqtt.tls.ca_file, cert_file and key_file exist and are readable PEM files",
            ) from exc
        client.tls_insecure_set(tls.insecure)


def make_client(cfg: MqttConfig, client_id: str) -> mqtt.Client:
    """A paho client for `mqtt:`: its protocol (an MQTT 3.1.1 session lives until the broker drops
    it unless session_expiry_s is 0), window, login and TLS. Callbacks are the caller's."""
    if cfg.protocol == "5":
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    else:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=cfg.session_expiry_s == 0,
        )
    client.max_inflight_messages_set(cfg.outbox.max_inflight)
    use_credentials(client, cfg)
    return client


def connect_failure(error: BaseException | None, cfg: MqttConfig) -> str:
    """Why a connection attempt failed before any MQTT was spoken, with what to check: a TLS failure
    (an untrusted certificate, one for another host name) must not read like a broker that is down."""
    broker = f"{cfg.host}:{cfg.port}"
    if not isinstance(error, ssl.SSLError):
        return f"cannot reach MQTT broker {broker}" + (f": {error}" if error is not None else "")
    why = f"TLS handshake with MQTT broker {broker} failed: {error}"
    if isinstance(error, ssl.SSLCertVerificationError) and "mismatch" in str(error):
        why += (
            f"; the broker's certificate is not for the host name {cfg.host!r} "
            "(mqtt.host): connect by a host name or address the certificate holds, or give the "
            "broker a certificate for this one (mqtt.tls.insecure skips this check: testing only)"
        )
    return why


def tls_ended(cfg: MqttConfig, socket_error: str | None) -> bool:
    """The broker ended the TLS session before the CONNACK: with an alert, or (TLS 1.3, when it
    closes before the alert is read) with a bare end of the stream or a plain close (None)."""
    if cfg.tls is None:
        return False
    text = (socket_error or "").lower()
    return socket_error is None or "alert" in text or "eof occurred in violation" in text


def tls_alert_hint(cfg: MqttConfig) -> str:
    """What to check when the broker ended the TLS session with an alert before the CONNACK."""
    tls = cfg.tls
    if tls is None or tls.cert_file is None:
        return (
            "the broker ended the TLS session: if it wants a client certificate, give "
            "mqtt.tls.cert_file and key_file"
        )
    return (
        f"the broker ended the TLS session: check that mqtt.tls.cert_file ({tls.cert_file}) is a "
        "client certificate it trusts"
    )
