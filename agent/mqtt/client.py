"""A paho client's login and TLS from the `mqtt:` config: the daemon's connection, the MQTT sensor
sources and `edge-agent doctor` set their clients up the same way."""

from __future__ import annotations

import paho.mqtt.client as mqtt

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
