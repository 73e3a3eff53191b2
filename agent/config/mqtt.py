"""The agent's MQTT connection: broker, login, TLS and the outbox of results."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from agent.config.base import (
    Name,
    Secret,
    StrictModel,
    both_or_neither,
    check_login,
    login_schema,
    read_password,
)

# MQTT client identifiers: printable, none of MQTT's topic characters (some brokers and bridges
# build topics from them), and of a length brokers accept.
CLIENT_ID_MAX = 128
_CLIENT_ID_FORBIDDEN = "+#/"


def check_client_id(value: str) -> str:
    if not value:
        raise ValueError("must not be empty (leave it out for edge-agent-<device id>)")
    if len(value) > CLIENT_ID_MAX:
        raise ValueError(f"is {len(value)} characters long; at most {CLIENT_ID_MAX} are allowed")
    bad = sorted({c for c in value if c in _CLIENT_ID_FORBIDDEN or not c.isprintable()})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(f"{value!r} holds {shown}: a client id must be printable, without '+', '#' or '/'")
    return value


class TlsConfig(StrictModel):
    model_config = ConfigDict(json_schema_extra=both_or_neither("cert_file", "key_file"))

    ca_file: Path | None = Field(None, description="CA bundle that signed the broker's certificate.")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client private key (mutual TLS).")
    insecure: bool = Field(
        False,
        description="Skip checking that the broker's certificate names the host connected to (testing "
        "only: anyone holding a certificate from the CA could pose as the broker); the certificate is "
        "still checked against ca_file. A WARNING says so at each start.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")
        return self


class OutboxConfig(StrictModel):
    max_messages: int = Field(
        100_000,
        ge=100,
        description="Outbox capacity in messages; beyond it (or max_bytes) when_full applies.",
    )
    max_bytes: int = Field(
        268_435_456, ge=65_536, description="Outbox capacity in payload bytes (256 MiB by default)."
    )
    when_full: Literal["drop-oldest", "drop-newest", "wait"] = Field(
        "drop-oldest",
        description="When full: drop the oldest results, drop the new one, or wait (the pipelines stop "
        "taking frames, so cameras drop frames, counted, and nothing stored is lost). Drops are counted "
        "per pipeline. While the broker is away the two drop policies keep 5% of each bound free, for "
        "the results made just after it is back.",
    )
    durability: Literal["crash-safe", "power-loss-safe"] = Field(
        "crash-safe",
        description="crash-safe: a stored result survives the process dying (SQLite WAL, synchronous "
        "NORMAL); power-loss-safe: also the box losing power (fsync), committing results together "
        "every commit_interval_ms, so at most that much is lost.",
    )
    commit_interval_ms: float = Field(
        50.0, ge=1, le=5000, description="power-loss-safe: how long results are grouped into one commit."
    )
    max_inflight: int = Field(20, ge=1, le=1000, description="Unacknowledged QoS 1 publishes at once.")
    backlog_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="While a backlog is queued (after an outage), the share of the in-flight window "
        "given to the oldest results; the rest carries the newest, so fresh results are not held behind "
        "the backlog. 1: strictly oldest first. Per pipeline, results then arrive out of order: order "
        "them by seq.",
    )
    flush_timeout_s: float = Field(
        10.0, ge=0, description="On shutdown, how long to keep delivering queued results."
    )
    resend_window_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="Results the broker acknowledged this recently are kept in memory and sent again "
        "when the broker comes back without this agent's session: it restarted without saving its "
        "state (e.g. killed), so it may have lost them before its subscribers had them. Duplicates "
        "are possible then (consumers de-duplicate by pipeline and seq); 0: off.",
    )
    resend_max_bytes: int = Field(
        8_388_608, ge=0, description="Memory for resend_window_s at most (8 MiB); the oldest go first."
    )


class MqttConfig(StrictModel):
    model_config = ConfigDict(json_schema_extra=login_schema)

    host: str = Field("127.0.0.1", min_length=1, description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1"] = Field(
        "5",
        description="MQTT protocol version.",
        # `_protocol_as_text` takes `protocol: 5` (a YAML int) too.
        json_schema_extra=lambda schema: schema.update(type=["string", "integer"], enum=["5", "3.1.1", 5]),
    )
    client_id: str | None = Field(
        None,
        # What `check_client_id` checks, but printable (Unicode's idea of it is beyond a pattern).
        json_schema_extra={
            "minLength": 1,
            "maxLength": CLIENT_ID_MAX,
            "pattern": "^[^+#/\\x00-\\x1f\\x7f]*$",
        },
        description=f"Defaults to edge-agent-<device id>. Printable, 1-{CLIENT_ID_MAX} characters, "
        "without '+', '#' or '/'.",
    )
    topic_prefix: Name = Field("edge", description="First level of every topic.")
    keepalive_s: int = Field(30, ge=5, le=3600)
    username: str | None = Field(None, description="Broker login (with password or password_file).")
    password: Secret | None = Field(
        None, description="Broker password; never shown in logs, status or dumps. Prefer password_file."
    )
    password_file: Path | None = Field(
        None,
        description="File holding the broker password (its first line; read at connect), instead of "
        "password: keep it owner-readable only (0600 or 0640 root:edge-agent).",
    )
    tls: TlsConfig | None = Field(
        None,
        description="Enable TLS by giving this section: ca_file to verify the broker, cert_file and "
        "key_file for mutual TLS (docs/operations.md).",
    )
    max_payload_bytes: int = Field(
        262_144,
        ge=1024,
        le=268_435_455,
        description="Largest message sent; bigger results are refused and counted (brokers limit it too).",
    )
    session_expiry_s: int = Field(
        86_400,
        ge=0,
        le=4_294_967_295,
        description="Keep the MQTT session (subscriptions, QoS 1 messages queued for the agent) this long "
        "after the link drops (MQTT 5; 3.1.1 keeps it until the broker drops it); 0: a clean session.",
    )
    reconnect_min_s: float = Field(
        1.0,
        gt=0,
        description="First reconnect delay; doubles up to the max (a random half of it: jitter). While "
        "waiting the broker's port is probed each second: a broker that is back is reconnected to within "
        "a few seconds (a random spread of up to 3 s, so a fleet does not return at once).",
    )
    reconnect_max_s: float = Field(60.0, gt=0)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, value: object) -> object:
        # YAML reads `protocol: 5` as an int; `3.1.1` is already a string.
        return str(value) if isinstance(value, int) else value

    @field_validator("client_id")
    @classmethod
    def _valid_client_id(cls, value: str | None) -> str | None:
        return None if value is None else check_client_id(value)

    @model_validator(mode="after")
    def _check(self) -> MqttConfig:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        check_login(self.username, self.password, self.password_file)
        return self

    def login_password(self) -> str | None:
        """The password to log in with (password_file read now); ConfigError if it cannot be read."""
        return read_password(self.password, self.password_file, "mqtt.password_file")
