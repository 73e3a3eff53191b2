"""Why a camera could not be opened, in words an operator can act on.

OpenCV says only "cannot open". When it does, the source asks the thing itself: a V4L2 device
node (missing, not a device, no permission, held by another process), a network camera (the name
does not resolve, no route, no answer, connection refused, and over HTTP or RTSP the server's own
answer: 401/403 for credentials, 404 for a wrong path). Used in the log, the pipeline status and
`edge-agent doctor`. Passwords in URIs never appear in what it returns.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import socket
import ssl
import stat
from pathlib import Path
from urllib.parse import SplitResult, urlsplit, urlunsplit

from agent.fsutil import group_name, user_name
from agent.sources.uri import redact_uri


def diagnose_open_failure(uri: str, kind: str, timeout_s: float = 3.0) -> str | None:
    """Why `uri` (a source of `kind`, agent/sources/video.py source_kind) did not open, asking a
    network camera for at most `timeout_s` per step; None for kinds OpenCV's own failure already
    explains (files, GStreamer pipelines)."""
    if kind == "device":
        return diagnose_device(device_path(uri))
    if kind == "url":
        return diagnose_url(uri, timeout_s)
    return None


DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443, "rtmp": 1935, "rtmps": 443}
_READ_LIMIT = 65536


def device_path(uri: str) -> Path:
    """`0` -> /dev/video0; a path stays as it is."""
    return Path(f"/dev/video{uri}") if uri.isdigit() else Path(uri)


# --- V4L2 devices ------------------------------------------------------------------------------


def diagnose_device(path: Path, proc: Path = Path("/proc")) -> str:
    if not path.exists():
        found = sorted(str(p) for p in path.parent.glob("video*")) if path.parent.is_dir() else []
        here = ", ".join(found[:8]) if found else "none"
        return f"no such device {path} (video devices on this box: {here})"
    st = path.stat()
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a device node"
    if not os.access(path, os.R_OK | os.W_OK):
        group, owner = group_name(st.st_gid), user_name(st.st_uid)
        return (
            f"permission denied on {path} (owner {owner}:{group}, mode {stat.S_IMODE(st.st_mode):o}): "
            f"add the agent's user to group {group}"
        )
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENODEV):
            return f"{path} has no driver behind it (unplugged, or the driver is not loaded)"
        if exc.errno == errno.EBUSY:
            return f"{path} is busy{_held_by(path, proc)}"
        if exc.errno == errno.EPERM:  # file permissions were fine: a device cgroup said no
            return (
                f"the system refuses access to {path}: a device policy (the unit's DeviceAllow=, or a "
                "container's device list) does not include it"
            )
        return f"cannot open {path}: {exc.strerror or exc}"
    os.close(fd)
    held = _held_by(path, proc)
    if held:
        return f"{path} opens but gives no frames: it is in use{held}"
    return (
        f"{path} opens but gives no frames: not a capture node (a metadata node?), or no format "
        f"OpenCV can read (v4l2-ctl -d {path} --list-formats-ext)"
    )


def holders(path: Path, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, command name) of other processes with `path` open, as far as /proc lets us see."""
    target = os.path.realpath(path)
    found = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # gone, or another user's (not root)
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    found.append((int(entry.name), (entry / "comm").read_text().strip()))
                    break
            except OSError:
                continue
    return found


def _held_by(path: Path, proc: Path) -> str:
    users = holders(path, proc)
    if not users:
        return ""
    return " by " + ", ".join(f"pid {pid} ({name})" for pid, name in users[:5])


# --- network cameras ---------------------------------------------------------------------------


def diagnose_url(uri: str, timeout_s: float = 3.0) -> str:
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return f"invalid port in {redact_uri(uri)}"
    if not host or port is None:
        return f"cannot tell host and port from {redact_uri(uri)}"
    where = f"{host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve host name {host!r}: {exc.strerror or exc}"
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(address)
        except ConnectionRefusedError:
            return f"connection refused by {where}: nothing listens there (wrong port, or service off)"
        except TimeoutError:
            return f"no answer from {where} within {timeout_s:g} s (camera off, a firewall, a wrong address)"
        except OSError as exc:
            if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
                return f"no route to {where} ({exc.strerror})"
            return f"cannot connect to {where}: {exc.strerror or exc}"
        try:
            if scheme in ("rtsp", "rtsps"):
                return _rtsp_answer(_wrap(sock, scheme == "rtsps", host), uri)
            if scheme in ("http", "https"):
                return _http_answer(_wrap(sock, scheme == "https", host), uri)
        except ssl.SSLError as exc:
            return f"TLS with {where} failed: {exc.reason or exc}"
        return f"{where} accepts connections, but no stream could be opened from {redact_uri(uri)}"
    finally:
        sock.close()


def _rtsp_answer(stream: socket.socket | ssl.SSLSocket, uri: str) -> str:
    """DESCRIBE as a player would (with the URI's credentials, Basic or Digest as asked)."""
    parts = urlsplit(uri)
    bare = _without_credentials(uri)
    code, reason, headers = _exchange(stream, _rtsp_request(bare, 1, None))
    if code == 401 and parts.username is not None:
        authorization = _authorization(headers.get("www-authenticate", ""), parts, "DESCRIBE", bare)
        if authorization is not None:
            code, reason, headers = _exchange(stream, _rtsp_request(bare, 2, authorization))
    return _verdict("RTSP", code, reason, parts, redact_uri(uri))


def _http_answer(stream: socket.socket | ssl.SSLSocket, uri: str) -> str:
    parts = urlsplit(uri)
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}", "User-Agent: edge-agent",
             "Connection: close"]  # fmt: skip
    if parts.username is not None:
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        lines.append(f"Authorization: Basic {token}")
    code, reason, headers = _exchange(stream, ("\r\n".join(lines) + "\r\n\r\n").encode())
    verdict = _verdict("HTTP", code, reason, parts, redact_uri(uri))
    if code is not None and 200 <= code < 300:
        kind = headers.get("content-type", "no content type")
        verdict += f" ({kind}): OpenCV could not decode it as video"
    return verdict


def _verdict(protocol: str, code: int | None, reason: str, parts: SplitResult, shown: str) -> str:
    has_credentials = parts.username is not None
    path = parts.path or "/"
    if code is None:
        return f"the server did not answer {protocol} ({reason})"
    said = f"{protocol} {code} {reason}".rstrip()
    if code == 401:
        fix = "the URI's user or password is wrong" if has_credentials else "the URI has no user:password"
        return f"the camera refused the login ({said}): {fix}"
    if code == 403:
        return f"the camera refused access ({said}): this user may not read {path}"
    if code == 404:
        return f"no stream at {path} ({said}): check the path in {shown}"
    if 200 <= code < 300:
        return f"the camera answers ({said}) but no stream could be decoded"
    return f"the camera answered {said}"


def _rtsp_request(uri: str, cseq: int, authorization: str | None) -> bytes:
    lines = [f"DESCRIBE {uri} RTSP/1.0", f"CSeq: {cseq}", "Accept: application/sdp", "User-Agent: edge-agent"]
    if authorization:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


Answer = tuple[int | None, str, dict[str, str]]  # status code (None: no answer), reason, headers


def _exchange(stream: socket.socket | ssl.SSLSocket, request: bytes) -> Answer:
    """Send one request, read the status line and headers: (code, reason, headers lower-cased)."""
    try:
        stream.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < _READ_LIMIT:
            chunk = stream.recv(4096)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return None, "no answer in time", {}
    except OSError as exc:
        return None, str(exc.strerror or exc), {}
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status, *rest = head.split("\r\n") if head else [""]
    fields = status.split(" ", 2)
    if len(fields) < 2 or not fields[1].isdigit():
        return None, f"not an answer: {status[:60]!r}", {}
    headers = {}
    for line in rest:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(fields[1]), fields[2] if len(fields) > 2 else "", headers


def _authorization(challenge: str, parts: SplitResult, method: str, uri: str) -> str | None:
    user, password = parts.username or "", parts.password or ""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() == "basic":
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    if scheme.lower() != "digest":
        return None
    fields = {}
    for item in params.split(","):
        key, _, value = item.strip().partition("=")
        fields[key.lower()] = value.strip().strip('"')
    realm, nonce = fields.get("realm", ""), fields.get("nonce", "")
    # RFC 2069 digest, as RTSP cameras ask for it (MD5 is the protocol's, not a choice here).
    ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
    ha2 = hashlib.md5(f"{method}:{uri}".encode()).hexdigest()
    response = hashlib.md5(f"{ha1}:{nonce}:{ha2}".encode()).hexdigest()
    return f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{response}"'


def _wrap(sock: socket.socket, tls: bool, host: str) -> socket.socket | ssl.SSLSocket:
    if not tls:
        return sock
    context = ssl.create_default_context()
    return context.wrap_socket(sock, server_hostname=host)


def _without_credentials(uri: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
