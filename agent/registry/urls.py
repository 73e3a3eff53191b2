"""URL helpers every registry uses, kept apart from the HTTP client so that a daemon on a
`file://` registry never imports httpx."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


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
