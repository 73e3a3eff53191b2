"""A TCP proxy on loopback that a test (or scripts/probe_faults.py) can cut: the uplink between an
agent and its broker failing while both stay up."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.waits import free_port


class CuttableProxy:
    """A TCP proxy on loopback whose link can be cut (every connection closed, new ones refused)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target = target_port
        self.up = threading.Event()
        self.up.set()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and close every link."""
        self.cut()
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self.up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        self.up.clear()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass

    def restore(self) -> None:
        self.up.set()
