"""The page's server: uvicorn on a thread of its own with its own event loop, started and stopped
by the daemon. Bounded: few connections, small headers, idle connections closed; it reads only the
daemon's status (cached, agent/web/app.py), so no client can slow a pipeline."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agent.config.web import WebConfig
from agent.errors import EdgeAgentError

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32  # more at once get 503: a crowd of clients costs a bounded amount
KEEP_ALIVE_S = 5.0  # an idle connection is closed after this
HEADER_TIMEOUT_S = 10.0  # a request's line and headers must arrive within this (slowloris)
MAX_HEADER_BYTES = 16 * 1024
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class WebServer:
    def __init__(
        self,
        config: WebConfig,
        status: Callable[[], dict[str, Any]],
        device: str,
        pages: Sequence[Callable[[Any], None]] = (),
    ) -> None:
        """`pages`: each is called with the WebApp (agent/web/app.py) once it is built, to add its
        pages with `add_page` (typed Any here: the app's module needs the `web` extra)."""
        self.config = config
        self._pages = pages
        self._status = status
        self._device = device
        self._server: Any = None  # uvicorn.Server
        self._thread: threading.Thread | None = None
        self.port: int | None = None  # the port it listens on (config.port, or the one chosen for 0)

    def start(self) -> None:
        """Listen and serve; EdgeAgentError (saying what to do) when the stack is missing, the
        address is taken or the certificate cannot be loaded."""
        try:
            import uvicorn

            from agent.web.app import WebApp
        except ImportError as exc:
            raise EdgeAgentError(
                f"web.enabled is true but the page's stack is not installed ({exc.name})",
                hint="pip install 'edge-agent[web]', or set web.enabled: false",
            ) from None
        config = self.config
        tls = config.tls
        web_app = WebApp(config, self._status, self._device)
        for add in self._pages:
            add(web_app)
        settings = uvicorn.Config(
            web_app.app,
            loop="asyncio",
            http=_bounded_h11(),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,  # app.py `secure` dates each answer: no 10 wakeups a second for it
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=int(KEEP_ALIVE_S),
            timeout_graceful_shutdown=int(STOP_TIMEOUT_S),
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            ssl_certfile=None if tls is None else str(tls.cert_file),
            ssl_keyfile=None if tls is None else str(tls.key_file),
        )
        where = f"web: {config.listen}:{config.port}"
        try:
            settings.load()  # reads the certificate and key now, not on the thread
        except (OSError, ssl.SSLError) as exc:
            raise EdgeAgentError(f"{where}: cannot load the TLS certificate or key: {exc}") from None
        sock = _listen(config.listen, config.port, where)
        self.port = sock.getsockname()[1]
        self._server = _quiet_server()(settings)
        self._thread = threading.Thread(target=self._run, args=(sock,), name="web", daemon=True)
        self._thread.start()
        self._server.ready.wait(START_TIMEOUT_S)  # set once listening, or when the thread ends
        if not self._server.started:
            self.stop()
            raise EdgeAgentError(f"{where}: the server did not start")
        scheme = "https" if tls else "http"
        log.info("web page on %s://%s:%d/", scheme, _bracketed(config.listen), self.port)

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The server thread's event loop while it serves (None before and after)."""
        return None if self._server is None else self._server.loop

    def _run(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        finally:
            self._server.ready.set()

    def stop(self) -> None:
        if self._server is not None:
            self._server.wake_to_exit()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S + 1)
            if self._thread.is_alive():
                log.warning("web: the server thread did not stop within %.0f s", STOP_TIMEOUT_S + 1)
        self._server = self._thread = None


def _quiet_server() -> Any:
    """uvicorn's Server without its housekeeping tick: uvicorn wakes 10 times a second (to date its
    answers and to look at should_exit), about 2 ms of CPU a second with no client at all
    (scripts/bench_web_stack.py). This one sleeps until `wake_to_exit`."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.ready = threading.Event()  # listening (or failed: see `started`)
            self._wake = asyncio.Event()
            self.loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            self.ready.set()

        async def main_loop(self) -> None:
            self.loop = asyncio.get_running_loop()
            await self.on_tick(0)  # what uvicorn does once a second, done once
            while not self.should_exit:
                await self._wake.wait()

        def wake_to_exit(self) -> None:
            """From any thread: stop (uvicorn's graceful shutdown follows)."""
            self.should_exit = True
            loop = self.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._wake.set)

    return QuietServer


def _bounded_h11() -> type:
    """uvicorn's h11 protocol with a deadline for each request's line and headers: uvicorn closes a
    connection idle between requests (timeout_keep_alive) but waits forever for a first request
    or one sent a byte at a time, so a few slow clients could hold every connection. And a new
    connection that finds every place taken closes connections idle between requests (keep-alive)
    to make room: uvicorn counts them against limit_concurrency, so a crowd of idle clients would
    hold the page for everyone else (503) for as long as it kept asking now and then."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._make_room()
            self._arm_header_deadline()

        def _make_room(self) -> None:
            connections = self.server_state.connections
            idle = [
                c
                for c in connections
                if c is not self and isinstance(c, H11Protocol) and c.timeout_keep_alive_task is not None
            ]
            for connection in idle[: max(0, len(connections) - MAX_CONNECTIONS + 1)]:
                connection.timeout_keep_alive_handler()  # as its idle timeout would: closed, not counted

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            waiting_for = self.cycle  # a new request replaces it; none by the deadline: too slow
            self.loop.call_later(HEADER_TIMEOUT_S, self._too_slow, waiting_for)

        def _too_slow(self, waiting_for: object) -> None:
            if self.cycle is waiting_for and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int, where: str) -> socket.socket:
    """The listening socket, bound here so that a taken port is an error at start, not on the thread."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise EdgeAgentError(f"{where}: cannot listen: {exc}", hint="check web.listen") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise EdgeAgentError(
            f"{where}: cannot listen: {exc}", hint="is another program on that port?"
        ) from None
    sock.set_inheritable(True)
    return sock
