"""Model registries: where model versions (a manifest plus artifact files) are pulled from.

`open_registry(url, config)` picks the implementation by URL scheme: `file://` (a folder),
`http(s)://` (that folder served by a web server), `oci://` (an OCI registry, artifacts as ORAS
stores them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast, runtime_checkable
from urllib.parse import urlsplit

from agent.config import RegistryConfig
from agent.errors import RegistryError
from agent.registry.file_registry import FileRegistry, PublishOptions
from agent.registry.manifest import (
    ARTIFACT_FORMATS,
    MANIFEST_FILE,
    Artifact,
    ArtifactFormat,
    Manifest,
    ManifestDocument,
    check_model_file,
)
from agent.registry.urls import public_url

if TYPE_CHECKING:  # imported on first use: they bring httpx, which a file:// box never needs
    from agent.registry.http_registry import HttpRegistry
    from agent.registry.oci_registry import OciRegistry

__all__ = [
    "ARTIFACT_FORMATS",
    "MANIFEST_FILE",
    "Artifact",
    "ArtifactFormat",
    "FileRegistry",
    "HttpRegistry",
    "Manifest",
    "ManifestDocument",
    "OciRegistry",
    "PublishOptions",
    "Registry",
    "check_model_file",
    "open_registry",
    "public_url",
]


# Imported on first use, by open_registry or as this module's attributes: they bring httpx.
_LAZY = {"HttpRegistry": "agent.registry.http_registry", "OciRegistry": "agent.registry.oci_registry"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@runtime_checkable
class Registry(Protocol):
    """What the store needs from a registry. Every failure is a RegistryError."""

    @property
    def url(self) -> str: ...

    def get_manifest(self, name: str, version: str) -> Manifest: ...

    def fetch_manifest(self, name: str, version: str, digest: str | None = None) -> ManifestDocument:
        """The manifest, its exact bytes and its signature file (None: unsigned). `digest`
        ("sha256:<hex>") pins the registry's manifest document: its sha256 must match."""
        ...

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        """A stream of the artifact's bytes; the caller closes it. Not verified: the store hashes."""
        ...

    def open_artifact_at(
        self, name: str, version: str, artifact: Artifact | str, offset: int, validator: str | None = None
    ) -> tuple[int, BinaryIO]:
        """(where the stream starts, the stream): from `offset` when the registry can resume there
        and the file is still the one `validator` (the stream's `validator` from the cut-off
        pull) names, else from 0."""
        ...

    def list_versions(self, name: str) -> list[str]: ...

    def close(self) -> None:
        """Let go of connections (HTTP); the registry is not used afterwards."""
        ...


def open_registry(url: str, config: RegistryConfig | None = None) -> Registry:
    """The registry at `url` (`file:///srv/registry`, `https://host/registry`); `config` carries
    the HTTP settings (auth, CA, timeouts, retries, redirects) when it comes from the agent's config."""
    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        return FileRegistry.from_url(url)
    if scheme in ("http", "https"):
        return cast("type[HttpRegistry]", __getattr__("HttpRegistry"))(url, config)
    if scheme == "oci":
        return cast("type[OciRegistry]", __getattr__("OciRegistry"))(url, config)
    shown = f"scheme {scheme!r}" if scheme else "no scheme"
    raise RegistryError(
        f"registry URL {public_url(url)!r} has {shown}; expected file://, http://, https:// or oci://",
        hint="e.g. file:///srv/registry, https://models.example.com/registry or oci://host/edge-models",
    )
