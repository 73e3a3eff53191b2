"""One loaded session per (backend, artifact, options), shared by every pipeline that runs it.

Several cameras on one model load it once: memory for one copy of the weights and one compiled
engine. Sessions are one-caller-at-a-time, so a shared session runs its callers in turn (a lock);
it is closed when the last pipeline lets go of it (a pipeline that switches backend lets go).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from providers import Backend, ModelArtifact, Session, TensorSpec


class SharedSession(Session):
    """A pipeline's handle on a pooled session: runs in turn with the other users; close() lets go."""

    def __init__(self, pool: SessionPool, key: str, inner: Session, lock: threading.Lock) -> None:
        self._pool, self._key, self._inner, self._lock = pool, key, inner, lock
        self.backend = inner.backend
        self.precision = inner.precision
        self._closed = False

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inner.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._inner.outputs

    @property
    def compute_ms(self) -> float | None:  # type: ignore[override]  # read from the shared session
        return self._inner.compute_ms

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            return self._inner.run(feeds)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._key)


class SessionPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> (the session, the lock its users take turns on, how many pipelines use it)
        self._entries: dict[str, tuple[Session, threading.Lock, int]] = {}

    @staticmethod
    def key(backend: str, artifact: ModelArtifact, options: Mapping[str, Any]) -> str:
        return json.dumps([backend, artifact.sha256, dict(options)], sort_keys=True, default=str)

    def load(
        self, backend: Backend, artifact: ModelArtifact, options: Mapping[str, Any] | None = None
    ) -> Session:
        """The pooled session for this backend, artifact and options: loaded by the first user."""
        options = dict(options or {})
        key = self.key(backend.name, artifact, options)
        # Loading under the pool lock: two pipelines starting at once load it once (pipelines are
        # built one after the other anyway, by the daemon's builder thread).
        with self._lock:
            if key in self._entries:
                session, run_lock, users = self._entries[key]
                self._entries[key] = (session, run_lock, users + 1)
            else:
                session, run_lock = backend.load(artifact, options), threading.Lock()
                self._entries[key] = (session, run_lock, 1)
        return SharedSession(self, key, session, run_lock)

    def release(self, key: str) -> None:
        with self._lock:
            session, run_lock, users = self._entries[key]
            if users > 1:
                self._entries[key] = (session, run_lock, users - 1)
                return
            del self._entries[key]
        session.close()

    def stats(self) -> list[dict[str, Any]]:
        """Every loaded session: its backend and how many pipelines use it."""
        with self._lock:
            return [
                {"backend": session.backend, "artifact": json.loads(key)[1], "users": users}
                for key, (session, _lock, users) in self._entries.items()
            ]
