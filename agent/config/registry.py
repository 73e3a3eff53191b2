"""Where models come from: the registry, its connection and trusted keys, and a pipeline's model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from agent.config.base import Name, StrictModel


class RegistryConnection(StrictModel):
    """How to talk to an HTTP(S) registry (agent/registry/http_registry.py): auth, TLS, patience."""

    username: str | None = Field(None, description="Basic auth user (with password_file).")
    password_file: Path | None = Field(None, description="File holding the basic auth password.")
    token_file: Path | None = Field(None, description="File holding a bearer token.")
    ca_file: Path | None = Field(None, description="CA bundle that signed the registry's certificate.")
    connect_timeout_s: float = Field(10.0, gt=0, description="Connecting to the registry.")
    read_timeout_s: float = Field(30.0, gt=0, description="Longest silence while reading an answer.")
    retries: int = Field(4, ge=0, le=20, description="Tries after the first, for failures that may pass.")
    backoff_s: float = Field(
        0.5, gt=0, description="First wait before a retry; doubles up to backoff_max_s, with full jitter."
    )
    backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between two tries.")
    redirect_hosts: list[str] = Field(
        default_factory=list,
        description="Other hosts redirects may lead to (e.g. a CDN); others are refused.",
    )

    @model_validator(mode="after")
    def _auth_is_one_kind(self) -> RegistryConnection:
        if self.password_file is not None and not self.username:
            raise ValueError("password_file needs username (basic auth)")
        if self.token_file is not None and (self.username or self.password_file):
            raise ValueError("token_file (bearer) and username/password_file (basic) exclude each other")
        return self


class TrustedKey(StrictModel):
    key: Path = Field(description="Ed25519 public key (PEM), as `edge-agent registry keygen` writes it.")
    models: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Model names this key may sign, as shell patterns (fnmatch): ['pp-ocr-*'].",
    )


URL_SCHEMES = r"^(file|https?|oci)://"


class RegistryConfig(RegistryConnection):
    url: str = Field(
        description="Model registry: file:///srv/registry or https://models.example.com/registry.",
        json_schema_extra={"pattern": URL_SCHEMES},  # `_known_scheme`
    )
    trusted_keys: list[TrustedKey] = Field(
        default_factory=list,
        description="Keys that sign manifests. When any is listed, only manifests signed by a key "
        "trusted for that model are pulled and served.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not re.match(URL_SCHEMES, value):
            raise ValueError(
                "expected a file://, http://, https:// or oci:// registry URL, e.g. file:///srv/registry, "
                "https://models.example.com/registry or oci://registry.example.com/edge-models"
            )
        return value


LOCAL_VERSION = "local"  # the version of a model imported from a file on the box (model.path)


def _registry_model_or_file(schema: dict[str, Any]) -> None:
    """ModelRef's JSON Schema says what `_local_file` decides: name and version (a registry model), or
    path (a file on this box: name optional, version only 'local', no digest)."""
    del schema["required"]
    schema["oneOf"] = [
        {
            "title": "a model version in the registry",
            "required": ["name", "version"],
            "properties": {"path": {"type": "null"}},
        },
        {
            "title": "a model file on this box",
            "required": ["path"],
            "properties": {
                "path": {"type": "string", "pattern": "^/"},  # absolute (`_absolute`)
                "version": {"const": LOCAL_VERSION},
                "digest": {"type": "null"},
            },
        },
    ]


class ModelRef(StrictModel):
    """A registry model by `name` and `version`, or a model file on this box by `path`."""

    model_config = ConfigDict(json_schema_extra=_registry_model_or_file)

    name: Name = Field(description="Model name in the registry (with `path`: defaults to the file's name).")
    version: Name = Field(description=f"Model version (with `path`: {LOCAL_VERSION!r}).")
    digest: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="Pins the registry's manifest document (OCI: the image manifest's digest; "
        "file/HTTP: sha256 of manifest.json): a version whose manifest changed is refused.",
    )
    path: Path | None = Field(
        None,
        description="A model file on this box (.onnx, .tflite, OpenVINO .xml beside its .bin), used "
        "without a registry: imported into the store, hashed and verified on every start.",
    )

    @model_validator(mode="before")
    @classmethod
    def _local_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("path") in (None, ""):
            return data
        if data.get("version", LOCAL_VERSION) != LOCAL_VERSION or data.get("digest") is not None:
            key = "digest" if data.get("digest") is not None else "version"
            raise ValueError(f"{key} is for registry models; a model given by path has none")
        data = dict(data)
        if "name" not in data:  # the file's name, made a valid model name
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(data["path"])).stem).strip("-_.")[:64]
            data["name"] = stem or "model"
        data["version"] = LOCAL_VERSION
        return data

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(
                f"must be an absolute path (the daemon's working directory is /), got {str(value)!r}"
            )
        return value
