"""The daemon's local control socket: `<state_dir>/agent.sock`, for `edge-agent status` on the box.

A unix stream socket, owner-only (0600 in the 0700 state dir: the same user as the daemon, or
root). One request per connection: a line of JSON, `{"command": "status"}`, answered by one line
of JSON, `{"ok": true, "status": {...}}` or `{"ok": false, "error": "..."}`, then closed. Only
commands that read are served here; changes go through the config (reload) or the fleet.

The daemon holds the state dir's instance lock before it binds, so a socket file already there is
a dead daemon's: it is replaced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOCKET_NAME = "agent.sock"
_MAX_REQUEST_BYTES = 4096
_CLIENT_TIMEOUT_S = 5.0  # a client that connects and says nothing is dropped after this
_MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def socket_path(state_dir: Path) -> Path:
    return Path(state_dir) / SOCKET_NAME


class ControlServer:
    def __init__(self, path: Path, commands: dict[str, Callable[[], dict[str, Any]]]) -> None:
        self.path = path
        self.commands = commands
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.served = 0

    def start(self) -> bool:
        """Bind and serve on a thread; False (logged) when it cannot: the daemon runs on without."""
        if len(os.fsencode(self.path)) > _MAX_PATH:
            log.warning(
                "no control socket: %s is longer than a unix socket path may be (%d bytes); "
                "`edge-agent status` cannot reach this daemon (status.json is still written)",
                self.path,
                _MAX_PATH,
            )
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # a dead daemon's (we hold the instance lock)
            # In the owner-only state dir, made under the daemon's umask 077; 0600 besides (the
            # umask is process-wide: changing it here would race with threads creating files).
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(8)
            sock.settimeout(0.5)  # so stop() is noticed
        except OSError as exc:
            sock.close()
            log.warning("no control socket at %s: %s (`edge-agent status` cannot reach it)", self.path, exc)
            return False
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="control-socket", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if not self._stopping.is_set():
                    log.warning("control socket: %s", exc)
                return
            with conn:
                try:
                    self._answer(conn)
                except Exception as exc:  # one bad client never stops the socket or the daemon
                    log.debug("control socket: a request failed: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_CLIENT_TIMEOUT_S)
        request = b""
        while b"\n" not in request and len(request) <= _MAX_REQUEST_BYTES:
            chunk = conn.recv(1024)
            if not chunk:
                break
            request += chunk
        reply = self._reply(request.split(b"\n", 1)[0])
        conn.sendall(json.dumps(reply, default=str, separators=(",", ":")).encode() + b"\n")
        self.served += 1

    def _reply(self, line: bytes) -> dict[str, Any]:
        if len(line) > _MAX_REQUEST_BYTES:
            return {"ok": False, "error": f"request over {_MAX_REQUEST_BYTES} bytes"}
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": 'not JSON; send {"command": "status"} and a newline'}
        name = request.get("command") if isinstance(request, dict) else None
        command = self.commands.get(name) if isinstance(name, str) else None
        if command is None:
            known = ", ".join(sorted(self.commands))
            return {"ok": False, "error": f"unknown command {name!r}; known: {known}"}
        return {"ok": True, str(name): command()}


class NotRunning(Exception):
    """No daemon answers on the socket; the message says why and what to do."""


def ask(path: Path, command: str, timeout: float = 10.0) -> dict[str, Any]:
    """One request to a running daemon's control socket; its answer. Raises NotRunning."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotRunning(f"no edge-agent is running here (nothing answers on {path})") from None
        except PermissionError:
            raise NotRunning(
                f"permission denied on {path}: it is for the daemon's user only; run as that user or "
                "root (sudo edge-agent status)"
            ) from None
        sock.sendall(json.dumps({"command": command}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        raise NotRunning(f"the daemon on {path} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise NotRunning(f"cannot ask the daemon on {path}: {exc}") from None
    finally:
        sock.close()
    try:
        reply: dict[str, Any] = json.loads(data)
    except ValueError:
        raise NotRunning(f"the answer on {path} is not JSON: {data[:200]!r}") from None
    if not reply.get("ok"):
        raise NotRunning(f"the daemon refused the request: {reply.get('error')}")
    return reply
