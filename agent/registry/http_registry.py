"""A model registry served over HTTP(S): the folder `edge-agent registry publish` writes, served as is
by any web server or object store (nginx, an S3-style bucket, `python -m http.server`)::

    <base>/index.json                          {"schema_version": 1, "models": {"<name>": ["1.0", ...]}}
    <base>/<name>/<version>/manifest.json      the version's manifest (agent/registry/manifest.py)
    <base>/<name>/<version>/manifest.json.sig  its signatures, when signed (agent/registry/signing.py)
    <base>/<name>/<version>/<artifact file>    its files, named as in the manifest

Timeouts, retries, ETag revalidation, resumed downloads, auth, CAs and the redirect policy are the
shared transport's (agent/registry/http_client.py).
"""

from __future__ import annotations

import json
from typing import BinaryIO, cast
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from agent.config import RegistryConnection
from agent.errors import RegistryError
from agent.registry.file_registry import check_name, version_sort_key
from agent.registry.http_client import NotFound, RegistryClient, settings_auth
from agent.registry.manifest import (
    INDEX_FILE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Artifact,
    Manifest,
    ManifestDocument,
    check_manifest_digest,
    parse_version_manifest,
)
from agent.registry.urls import public_url


class HttpRegistry:
    """Registry over HTTP(S); see the module docstring."""

    def __init__(self, url: str, settings: RegistryConnection | None = None) -> None:
        """`settings`: auth, TLS, timeouts, retries and redirects; the agent passes its whole
        `registry:` config (a RegistryConnection)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RegistryError(f"not an http(s):// registry URL: {public_url(url)!r}")
        self.settings = settings or RegistryConnection()
        self._base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", "", ""))
        self._http = RegistryClient(url, self.settings, settings_auth(self.settings, url))

    @property
    def url(self) -> str:
        return public_url(self._base.rstrip("/"))

    def __repr__(self) -> str:
        return f"HttpRegistry({self.url})"

    def close(self) -> None:
        self._http.close()

    # --- the Registry protocol --------------------------------------------------------------

    def list_models(self) -> list[str]:
        return sorted(self._index())

    def list_versions(self, name: str) -> list[str]:
        check_name("name", name, RegistryError)
        models = self._index()
        if name not in models:
            available = ", ".join(sorted(models)) or "none"
            raise RegistryError(
                f"model {name!r} not found in registry {self.url} (models available: {available})"
            )
        return sorted(models[name], key=version_sort_key)

    def get_manifest(self, name: str, version: str) -> Manifest:
        return self.fetch_manifest(name, version).manifest

    def fetch_manifest(self, name: str, version: str, digest: str | None = None) -> ManifestDocument:
        """The manifest with its exact bytes and its signature file (None when the server has none);
        `digest` ("sha256:<hex>") pins the manifest's bytes."""
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        url = self._url(name, version, MANIFEST_FILE)
        try:
            body, _headers = self._http.document(url)
        except NotFound:
            raise self._version_missing(name, version) from None
        if digest is not None:
            check_manifest_digest(body, digest, public_url(url))
        manifest = parse_version_manifest(body, public_url(url), name, version)
        try:
            signature: bytes | None = self._http.document(self._url(name, version, SIGNATURE_FILE))[0]
        except NotFound:
            signature = None
        return ManifestDocument(manifest, body, signature, public_url(url))

    def open_artifact(self, name: str, version: str, artifact: Artifact | str) -> BinaryIO:
        """The artifact's bytes, streamed (the caller closes the stream)."""
        return self.open_artifact_at(name, version, artifact, 0)[1]

    def open_artifact_at(
        self, name: str, version: str, artifact: Artifact | str, offset: int, validator: str | None = None
    ) -> tuple[int, BinaryIO]:
        """(where the stream starts, the stream): from `offset` when the server can resume there
        and the file is still the one `validator` (an ETag or Last-Modified from an earlier
        answer) names, else from 0."""
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        file = artifact.file if isinstance(artifact, Artifact) else artifact
        if not file or "/" in file or "\\" in file or ".." in file or file.startswith("."):
            raise RegistryError(f"invalid artifact file name {file!r}")
        url = self._url(name, version, file)
        try:
            start, stream = self._http.stream_from(url, offset, validator)
        except NotFound:
            raise RegistryError(
                f"artifact {file} of {name}@{version} not found at {public_url(url)}"
            ) from None
        return start, cast(BinaryIO, stream)

    # --- internals -------------------------------------------------------------------------

    def _url(self, *parts: str) -> str:
        return urljoin(self._base, "/".join(quote(p, safe="") for p in parts))

    def _index(self) -> dict[str, list[str]]:
        url = self._url(INDEX_FILE)
        try:
            body, _headers = self._http.document(url)
        except NotFound:
            raise RegistryError(
                f"registry {self.url} has no {INDEX_FILE} ({public_url(url)} answered 404)",
                hint="is the URL the registry's root, the folder `edge-agent registry publish` writes to?",
            ) from None
        try:
            data = json.loads(body)
            models = data["models"]
            if not isinstance(models, dict) or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in models.values()
            ):
                raise TypeError("models must map names to lists of versions")
        except (ValueError, KeyError, TypeError) as exc:
            raise RegistryError(f"invalid registry index {public_url(url)}: {exc}") from None
        return {str(k): list(v) for k, v in models.items()}

    def _version_missing(self, name: str, version: str) -> RegistryError:
        versions = self.list_versions(name)  # raises when the model itself is missing
        return RegistryError(
            f"model {name!r} version {version!r} not found in registry {self.url}, "
            f"versions available: {', '.join(versions) or 'none'}"
        )
