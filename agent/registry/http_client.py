"""HTTP(S) transport shared by the registries that speak HTTP (the folder layout served by a web
server, agent/registry/http_registry.py; OCI distribution, agent/registry/oci_registry.py).

What a fleet on flaky links needs from every request:
- connect and read timeouts; retries of connection failures, timeouts, 408/425/429 and 5xx with
  capped, jittered exponential backoff (a whole fleet coming back at once must not hammer the
  server), Retry-After honoured;
- small documents (indexes, manifests) revalidated with If-None-Match against the ETag of the last
  answer (kept in memory), and capped in size;
- large files streamed from an offset with Range and If-Range (the ETag, else Last-Modified), so a
  pull cut off half way resumes; a file that changed meanwhile comes whole (200) and restarts;
- secrets never shown: URLs in logs and errors lose their user:password@; passwords and tokens
  are read from files;
- a custom CA bundle for a private PKI; redirects followed only to the same scheme, host and port
  unless the config names other hosts (never from https to http).
"""

from __future__ import annotations

import io
import logging
import ssl
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

import httpx

from agent.config import RegistryConnection
from agent.errors import RegistryError
from agent.registry.urls import public_url
from agent.retry import backoff_delay

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_REDIRECTS = 5
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024  # an index or a manifest; artifacts stream

# A request body that can be sent again on a retry: bytes, or a function opening a fresh stream.
Body = bytes | Callable[[], IO[bytes]]


class NotFound(Exception):
    """A 404: each registry says what was missing in its own words."""


def read_secret(path: Path, what: str) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise RegistryError(f"cannot read the registry {what} file {path}: {exc.strerror}") from None
    if not secret:
        raise RegistryError(f"the registry {what} file {path} is empty")
    return secret


class BearerAuth(httpx.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


def settings_auth(settings: RegistryConnection, url: str) -> httpx.Auth | None:
    """Basic or bearer auth from the settings (secrets read from files), else user:password@ in
    the URL, else none."""
    if settings.token_file is not None:
        return BearerAuth(read_secret(settings.token_file, "token"))
    if settings.password_file is not None:
        if not settings.username:
            raise RegistryError("registry.password_file needs registry.username")
        return httpx.BasicAuth(settings.username, read_secret(settings.password_file, "password"))
    parts = urlsplit(url)
    if parts.username is not None:
        return httpx.BasicAuth(parts.username, parts.password or "")
    return None


class RegistryClient:
    """One connection pool to a registry's origin, with the behaviour in the module docstring."""

    def __init__(self, origin_url: str, settings: RegistryConnection, auth: httpx.Auth | None) -> None:
        parts = urlsplit(origin_url)
        self.settings = settings
        self._origin = (parts.scheme, parts.hostname, parts.port)
        self._etags: dict[str, tuple[str, bytes, httpx.Headers]] = {}  # URL -> the last 200's ETag, body
        self._client = httpx.Client(
            auth=auth,
            verify=self._tls_context(),
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
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

    def close(self) -> None:
        self._client.close()

    # --- requests --------------------------------------------------------------------------

    def document(self, url: str, headers: dict[str, str] | None = None) -> tuple[bytes, httpx.Headers]:
        """A small document (index, manifest) and the answer's headers, revalidated with its ETag;
        NotFound on 404."""
        cached = self._etags.get(url)
        asked = dict(headers or {})
        if cached:
            asked["If-None-Match"] = cached[0]
        response = self.send(url, asked)
        try:
            if response.status_code == 304 and cached:
                return cached[1], cached[2]
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_DOCUMENT_BYTES:
                raise RegistryError(f"{public_url(url)} is {declared} bytes, too big for a registry document")
            stream, parts, size = ResponseStream(response, public_url(url)), [], 0
            while (chunk := stream.read(1 << 16)) and size <= MAX_DOCUMENT_BYTES:
                parts.append(chunk)
                size += len(chunk)
            body = b"".join(parts)
            if size > MAX_DOCUMENT_BYTES:
                raise RegistryError(f"{public_url(url)} is over {MAX_DOCUMENT_BYTES} bytes, too big")
        finally:
            response.close()
        etag = response.headers.get("ETag")
        if etag:
            self._etags[url] = (etag, body, response.headers)
        return body, response.headers

    def stream_from(
        self, url: str, offset: int, validator: str | None, headers: dict[str, str] | None = None
    ) -> tuple[int, ResponseStream]:
        """(where the stream starts, the stream) of a large file: from `offset` when the server can
        resume there and the file is still the one `validator` (an ETag or Last-Modified from an
        earlier answer) names, else from 0. NotFound on 404."""
        asked = dict(headers or {})
        if offset > 0:
            asked["Range"] = f"bytes={offset}-"
            if validator:
                asked["If-Range"] = validator
        response = self.send(url, asked)
        start = 0
        if response.status_code == 206:
            start = _range_start(response)
            if start != offset:
                response.close()
                raise RegistryError(
                    f"{public_url(url)} answered a range from byte {start}, asked for {offset}"
                )
        return start, ResponseStream(response, public_url(url))

    def send(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        method: str = "GET",
        body: Body | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """A request with retries and checked redirects: a 2xx/304 response whose body is not read
        yet (the caller reads or streams it, and closes it), NotFound on 404, or a RegistryError."""
        cfg = self.settings
        shown = public_url(url)
        asked = shown if method == "GET" else f"{method} {shown}"
        for attempt in range(cfg.retries + 1):
            last_try = attempt == cfg.retries
            opened = body() if callable(body) else None
            try:
                content = opened if opened is not None else body
                response = self._send_following_redirects(method, url, headers or {}, content, params)
            except httpx.TransportError as exc:
                why = f"cannot reach registry at {shown}: {transport_error(exc)}"
                if last_try:
                    raise RegistryError(why, hint="the agent keeps running what its store has") from None
                self._pause(attempt, why)
                continue
            finally:
                if opened is not None:
                    opened.close()
            status = response.status_code
            if 200 <= status < 300 or status == 304:
                return response
            detail = _error_detail(response)
            response.close()
            if status == 404:
                raise NotFound(shown)
            if status in (401, 403):
                raise RegistryError(
                    f"registry refused {asked}: {status} {response.reason_phrase}{detail}",
                    hint="check registry.username / password_file / token_file and the server's access rules",
                )
            why = f"registry answered {status} {response.reason_phrase} for {asked}{detail}"
            if status not in RETRY_STATUSES or last_try:
                raise RegistryError(why)
            self._pause(attempt, why, response.headers.get("Retry-After"))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _send_following_redirects(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        content: Any,
        params: dict[str, str] | None,
    ) -> httpx.Response:
        for _ in range(MAX_REDIRECTS + 1):
            request = self._client.build_request(method, url, headers=headers, content=content, params=params)
            response = self._client.send(request, stream=True)
            if not response.has_redirect_location or method not in ("GET", "HEAD"):
                return response
            target = urljoin(str(response.url), response.headers.get("Location", ""))
            response.close()
            self._check_redirect(url, target)
            url, params = target, None
        raise RegistryError(f"more than {MAX_REDIRECTS} redirects from {public_url(url)}")

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
        delay = backoff_delay(attempt + 1, cfg.backoff_s, cfg.backoff_max_s, jitter="full")
        if retry_after is not None and retry_after.strip().isdigit():
            delay = max(delay, min(cfg.backoff_max_s, float(retry_after)))
        log.warning("%s; retrying in %.1f s (%d of %d)", why, delay, attempt + 1, cfg.retries)
        time.sleep(delay)


def _error_detail(response: httpx.Response) -> str:
    """The error codes of an OCI distribution error body ({"errors": [{"code", "message"}]}), if any."""
    if "json" not in response.headers.get("Content-Type", ""):
        return ""
    try:
        response.read()
        errors = response.json().get("errors", [])
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError, httpx.HTTPError):
        return ""
    return f" ({text})" if text else ""


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


def transport_error(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return text


class ResponseStream(io.RawIOBase):
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
            raise RegistryError(f"download of {self._shown} failed: {transport_error(exc)}") from None

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()
