"""Model registries: where model versions (a manifest plus artifact files) are pulled from.

`open_registry(url)` picks the implementation by URL scheme. Only `file://` exists so far;
`http(s)://` and `oci://` registries plug in here later behind the same `Registry` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO, Protocol, runtime_checkable
from urllib.parse import urlsplit

from agent.errors import RegistryError
from agent.registry.file_registry import FileRegistry
from agent.registry.manifest import (
    ARTIFACT_FORMATS,
    MANIFEST_FILE,
    Artifact,
    ArtifactFormat,
    Manifest,
    check_model_file,
)

__all__ = [
    "ARTIFACT_FORMATS",
    "MANIFEST_FILE",
    "Artifact",
    "ArtifactFormat",
    "FileRegistry",
    "Manifest",
    "Registry",
    "check_model_file",
    "open_registry",
]


@runtime_checkable
class Registry(Protocol):
    """What the store needs from a registry. Every failure is a RegistryError."""

    @property
    def url(self) -> str: ...

    def get_manifest(self, name: str, version: str) -> Manifest: ...

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        """A stream of the artifact's bytes; the caller closes it. Not verified: the store hashes."""
        ...

    def list_versions(self, name: str) -> list[str]: ...


_SCHEMES: dict[str, Callable[[str], Registry]] = {
    "file": FileRegistry.from_url,
}
_PLANNED = ("http", "https", "oci")


def open_registry(url: str) -> Registry:
    """The registry at `url`, e.g. `file:///srv/registry`."""
    scheme = urlsplit(url).scheme.lower()
    factory = _SCHEMES.get(scheme)
    if factory is not None:
        return factory(url)
    if scheme in _PLANNED:
        raise RegistryError(
            f"registry URL {url!r}: {scheme}:// registries are not supported yet",
            hint="use a file:// registry, e.g. file:///srv/registry",
        )
    shown = f"scheme {scheme!r}" if scheme else "no scheme"
    raise RegistryError(
        f"registry URL {url!r} has {shown}; expected file:// (http(s):// and oci:// are planned)",
        hint="e.g. file:///srv/registry",
    )
