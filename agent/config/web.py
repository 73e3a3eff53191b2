"""The optional local web page (docs/web.md): where it listens, its TLS and its users."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from agent.config.base import Name, Secret, StrictModel

# `python -m agent.web.passwords` writes these (agent/web/passwords.py): scrypt, its cost, salt, hash.
PASSWORD_HASH_PATTERN = r"^scrypt\$n=\d+,r=\d+,p=\d+\$[A-Za-z0-9+/]+=*\$[A-Za-z0-9+/]+=*$"


def is_loopback(host: str) -> bool:
    """`listen` reaches only this box: localhost or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WebTlsConfig(StrictModel):
    """The page's own certificate. Not mqtt.tls's TlsConfig: a server needs both files and has no
    CA to check a peer against (nor an `insecure` switch)."""

    cert_file: Path = Field(description="PEM certificate (chain) the page presents.")
    key_file: Path = Field(description="Its PEM private key.")


class WebUser(StrictModel):
    name: Name = Field(description="Login name.")
    password_hash: Secret = Field(
        description="scrypt hash of the password: `python -m agent.web.passwords` reads the password on "
        "stdin and prints it. Never the password itself; shown as '**********' in logs and dumps (a "
        "hash can be attacked offline).",
        json_schema_extra={"pattern": PASSWORD_HASH_PATTERN},
    )

    @field_validator("password_hash")
    @classmethod
    def _a_hash(cls, value: Secret) -> Secret:
        if not re.fullmatch(PASSWORD_HASH_PATTERN, value.get_secret_value()):
            raise ValueError(
                "is not a password hash: give what `python -m agent.web.passwords` prints "
                "(scrypt$n=...,r=...,p=...$<salt>$<hash>), never the password itself"
            )
        return value


class WebConfig(StrictModel):
    """The local web page: the box's status (docs/web.md). Off by default; on loopback unless told."""

    enabled: bool = Field(False, description="Serve the page (needs the `web` extra installed).")
    listen: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Address to listen on. Off the loopback (e.g. 0.0.0.0) tls and at least one user are "
        "required.",
    )
    port: int = Field(8080, ge=0, le=65535, description="TCP port; 0: any free one (the log says which).")
    tls: WebTlsConfig | None = Field(None, description="HTTPS with this certificate; null: plain HTTP.")
    users: list[WebUser] = Field(
        default_factory=list,
        description="Who may log in; none: no login (allowed on loopback only: anyone on the box can read "
        "the page).",
    )
    session_ttl_s: float = Field(
        43_200, ge=60, le=2_592_000, description="A login lasts this long (12 h by default)."
    )

    @model_validator(mode="after")
    def _safe_off_loopback(self) -> WebConfig:
        names = [user.name for user in self.users]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"users: {', '.join(repr(n) for n in twice)} listed twice")
        if not self.enabled or is_loopback(self.listen):
            return self
        missing = [what for what, absent in (("tls", self.tls is None), ("users", not self.users)) if absent]
        if missing:
            raise ValueError(
                f"listen {self.listen!r} is off the loopback: the page refuses to start without "
                f"{' and '.join(missing)} (give tls.cert_file/key_file and at least one user, "
                "or listen on 127.0.0.1)"
            )
        return self
