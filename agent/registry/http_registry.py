"""A model registry served over HTTP(S): the folder `edge-agent registry publish` writes, served as is
by any web server or object store (nginx, an S3-style bucket, `python -m http.server`)::

    <base>/index.json                          {"schema_version": 1, "models": {"<name>": ["1.0", ...]}}
    <base>/<name>/<version>/manifest.json      the version's manifest (agent/registry/manifest.py)
    <base>/<name>/<version>/manifest.json.sig  its signatures, when signed (agent/registry/signing.py)
    <base>/<name>/<version>/<artifact file>    its files, named as in the manifest

What a fleet on flaky links needs, on top of plain GETs:
- connect and read timeouts; retries of connection failures, timeouts, 429 and 5xx with capped,
  jittered exponential backoff (a whole fleet coming back at once must not hammer the server);
- manifests fetched with If-None-Match against the ETag of the last answer (kept in memory);
- artifacts streamed from an offset with Range and If-Range (the ETag, else Last-Modified), so a
  pull cut off half way resumes; a file that changed meanwhile comes whole (200) and restarts;
- basic or bearer auth with the secret read from a file, never logged and never in an error
  (URLs are shown without credentials); a custom CA bundle for a private PKI;
- redirects followed only to the same scheme, host and port unless the config names other hosts.
"""

from __future__ import annotations

import io
import json
import logging
import random
import ssl
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import httpx

from agent.config import RegistryConnection
from agent.errors import RegistryError
from agent.registry.file_registry import check_name, version_sort_key
from agent.registry.manifest import (
    INDEX_FILE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Artifact,
    Manifest,
    ManifestDocument,
)

log = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_MAX_REDIRECTS = 5
_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024  # an index or a manifest; artifacts stream


def public_url(url: str) -> str:
    """`url` without user:password@ (for logs and errors)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _read_secret(path: Path, what: str) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise RegistryError(f"cannot read the registry {what} file {path}: {exc.strerror}") from None
    if not secret:
        raise RegistryError(f"the registry {what} file {path} is empty")
    return secret


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
        self._origin = (parts.scheme, parts.hostname, parts.port)
        self._etags: dict[str, tuple[str, bytes]] = {}  # URL -> (ETag, body) of the last 200
        self._client = httpx.Client(
            auth=self._auth(parts),
            verify=self._tls_context(),
            timeout=httpx.Timeout(self.settings.read_timeout_s, connect=self.settings.connect_timeout_s),
            follow_redirects=False,  # followed by hand, to check where they lead
            trust_env=False,  # no proxy or netrc from the environment: the config says everything
            headers={"Accept-Encoding": "identity"},  # byte ranges of the file itself, not of a gzip of it
        )

    def _tls_context(self) -> ssl.SSLContext | bool:
        ca_file = self.settings.ca_file
        if ca_file is None:
            return True  # the system's CAs (certifi's bundle)
        try:
            return ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(
                f"cannot load the registry CA file {ca_file}: {getattr(exc, 'strerror', None) or exc}",
                hint="registry.ca_file must be a readable PEM bundle",
            ) from None

    @classmethod
    def from_url(cls, url: str) -> HttpRegistry:
        return cls(url)

    def _auth(self, parts: Any) -> httpx.Auth | None:
        cfg = self.settings
        if cfg.token_file is not None:
            token = _read_secret(cfg.token_file, "token")
            return _BearerAuth(token)
        if cfg.password_file is not None:
            if not cfg.username:
                raise RegistryError("registry.password_file needs registry.username")
            return httpx.BasicAuth(cfg.username, _read_secret(cfg.password_file, "password"))
        if parts.username is not None:  # user:password@ in the URL itself
            return httpx.BasicAuth(parts.username, parts.password or "")
        return None

    @property
    def url(self) -> str:
        return public_url(self._base.rstrip("/"))

    def __repr__(self) -> str:
        return f"HttpRegistry({self.url})"

    def close(self) -> None:
        self._client.close()

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

    def fetch_manifest(self, name: str, version: str) -> ManifestDocument:
        """The manifest with its exact bytes and its signature file (None when the server has none)."""
        check_name("name", name, RegistryError)
        check_name("version", version, RegistryError)
        url = self._url(name, version, MANIFEST_FILE)
        try:
            body = self._document(url)
        except _NotFound:
            raise self._version_missing(name, version) from None
        manifest = Manifest.parse_bytes(body, public_url(url))
        if manifest.name != name or manifest.version != version:
            raise RegistryError(
                f"invalid model manifest {public_url(url)}: it describes {manifest.ref}, not {name}@{version}"
            )
        try:
            signature: bytes | None = self._document(self._url(name, version, SIGNATURE_FILE))
        except _NotFound:
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
        headers = {}
        if offset > 0:
            headers["Range"] = f"bytes={offset}-"
            if validator:
                headers["If-Range"] = validator
        try:
            response = self._send(url, headers)
        except _NotFound:
            raise RegistryError(
                f"artifact {file} of {name}@{version} not found at {public_url(url)}"
            ) from None
        start = 0
        if response.status_code == 206:
            start = _range_start(response)
            if start != offset:
                response.close()
                raise RegistryError(
                    f"{public_url(url)} answered a range from byte {start}, asked for {offset}"
                )
        return start, cast(BinaryIO, _ResponseStream(response, public_url(url)))

    # --- internals -------------------------------------------------------------------------

    def _url(self, *parts: str) -> str:
        return urljoin(self._base, "/".join(quote(p, safe="") for p in parts))

    def _index(self) -> dict[str, list[str]]:
        url = self._url(INDEX_FILE)
        try:
            body = self._document(url)
        except _NotFound:
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

    def _document(self, url: str) -> bytes:
        """A small JSON document (index, manifest), revalidated with its ETag."""
        cached = self._etags.get(url)
        headers = {"If-None-Match": cached[0]} if cached else {}
        response = self._send(url, headers)
        try:
            if response.status_code == 304 and cached:
                return cached[1]
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > _MAX_DOCUMENT_BYTES:
                raise RegistryError(f"{public_url(url)} is {declared} bytes, too big for a registry document")
            stream, parts, size = _ResponseStream(response, public_url(url)), [], 0
            while (chunk := stream.read(1 << 16)) and size <= _MAX_DOCUMENT_BYTES:
                parts.append(chunk)
                size += len(chunk)
            body = b"".join(parts)
            if size > _MAX_DOCUMENT_BYTES:
                raise RegistryError(f"{public_url(url)} is over {_MAX_DOCUMENT_BYTES} bytes, too big")
        finally:
            response.close()
        etag = response.headers.get("ETag")
        if etag:
            self._etags[url] = (etag, body)
        return body

    def _send(self, url: str, headers: dict[str, str]) -> httpx.Response:
        """GET with retries and checked redirects; a 2xx/304 response whose body is not read yet
        (the caller streams and closes it), or a RegistryError."""
        cfg = self.settings
        shown = public_url(url)
        for attempt in range(cfg.retries + 1):
            last_try = attempt == cfg.retries
            try:
                response = self._get_following_redirects(url, headers)
            except httpx.TransportError as exc:
                why = f"cannot reach registry at {shown}: {_transport_error(exc)}"
                if last_try:
                    raise RegistryError(why, hint="the agent keeps running what its store has") from None
                self._pause(attempt, why)
                continue
            status = response.status_code
            if 200 <= status < 300 or status == 304:
                return response
            response.close()
            if status == 404:
                raise _NotFound(shown)
            if status in (401, 403):
                raise RegistryError(
                    f"registry refused {shown}: {status} {response.reason_phrase}",
                    hint="check registry.username / password_file / token_file and the server's access rules",
                )
            why = f"registry answered {status} {response.reason_phrase} for {shown}"
            if status not in _RETRY_STATUSES or last_try:
                raise RegistryError(why)
            self._pause(attempt, why, response.headers.get("Retry-After"))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _get_following_redirects(self, url: str, headers: dict[str, str]) -> httpx.Response:
        for _ in range(_MAX_REDIRECTS + 1):
            request = self._client.build_request("GET", url, headers=headers)
            response = self._client.send(request, stream=True)
            if not response.has_redirect_location:
                return response
            target = urljoin(url, response.headers.get("Location", ""))
            response.close()
            self._check_redirect(url, target)
            url = target
        raise RegistryError(f"more than {_MAX_REDIRECTS} redirects from {public_url(url)}")

    def _check_redirect(self, source: str, target: str) -> None:
        parts = urlsplit(target)
        if (parts.scheme, parts.hostname, parts.port) == self._origin:
            return
        if parts.scheme in ("http", "https") and parts.hostname in self.settings.redirect_hosts:
            if self._origin[0] == "https" and parts.scheme != "https":
                raise RegistryError(f"{public_url(source)} redirects from https to {public_url(target)}")
            return
        raise RegistryError(
            f"{public_url(source)} redirects to another host ({public_url(target)}); refused",
            hint="list the host in registry.redirect_hosts if that server is trusted (e.g. a CDN)",
        )

    def _pause(self, attempt: int, why: str, retry_after: str | None = None) -> None:
        cfg = self.settings
        delay = random.uniform(0, min(cfg.backoff_max_s, cfg.backoff_s * 2**attempt))  # full jitter
        if retry_after is not None and retry_after.strip().isdigit():
            delay = max(delay, min(cfg.backoff_max_s, float(retry_after)))
        log.warning("%s; retrying in %.1f s (%d of %d)", why, delay, attempt + 1, cfg.retries)
        time.sleep(delay)


class _NotFound(Exception):
    pass


class _BearerAuth(httpx.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


def _range_start(response: httpx.Response) -> int:
    """The first byte of a 206 answer (Content-Range: bytes START-END/TOTAL)."""
    value = response.headers.get("Content-Range", "")
    try:
        unit, spec = value.split(" ", 1)
        start = int(spec.split("-", 1)[0])
        if unit != "bytes":
            raise ValueError(unit)
    except ValueError:
        response.close()
        raise RegistryError(
            f"{public_url(str(response.url))} answered 206 with Content-Range {value!r}"
        ) from None
    return start


def _transport_error(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return text


class _ResponseStream(io.RawIOBase):
    """A streamed HTTP body as a binary file; a stall or a cut is a RegistryError naming the URL."""

    def __init__(self, response: httpx.Response, shown_url: str) -> None:
        self._response = response
        self._shown = shown_url
        self._chunks = response.iter_bytes()
        # What identifies this version of the file for a later If-Range: its ETag, else its date.
        self.validator: str | None = response.headers.get("ETag") or response.headers.get("Last-Modified")
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes as soon as some have come (b"" at the end); all of it for -1.

        Returning what has come, not waiting for `size`, lets a caller write a slow download to
        disk as it arrives, so a pull cut off half way leaves its bytes for the next one."""
        if size < 0:
            parts = [self._buffer]
            while chunk := self._next_chunk():
                parts.append(chunk)
            self._buffer = b""
            return b"".join(parts)
        if not self._buffer:
            self._buffer = self._next_chunk()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _next_chunk(self) -> bytes:
        try:
            return next(self._chunks, b"")
        except httpx.HTTPError as exc:
            raise RegistryError(f"download of {self._shown} failed: {_transport_error(exc)}") from None

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()
