"""What a source's URI says without opening it: whether it is a URL, and how to show it safely.
Shared by the video source and the diagnosis of one that does not open (which imports the source)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def redact_uri(uri: str) -> str:
    """The URI with any password replaced, safe for logs, status and results."""
    if not URL.match(uri):
        return uri
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]  # as written: keeps [IPv6] brackets, never parses the port
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def hide_password(text: str, uri: str) -> str:
    """`text` (a library's message about `uri`) with the URI's password replaced, as redact_uri does."""
    if not URL.match(uri):
        return text
    password = urlsplit(uri).password
    return text.replace(uri, redact_uri(uri)).replace(password, "***") if password else text
