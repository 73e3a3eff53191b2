"""One loaded session per (backend, artifact, options), shared by every pipeline that runs it.

Several cameras on one model load it once: memory for one copy of the weights and one compiled
engine. Sessions are one-caller-at-a-time, so a shared session runs its callers in turn, and
batches frames that wait for it together when the model allows that and it proves faster
(agent/batching.py). It is closed when the last pipeline lets go of it (a pipeline that switches
backend lets go).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from agent.batching import BatchRunner
from providers import Backend, ModelArtifact, Session, TensorSpec
from providers.select import SelectionPolicy


class SharedSession(Session):
    """A pipeline's handle on a pooled session: runs in turn (or batched) with the other users;
    close() lets go."""

    def __init__(self, pool: SessionPool, key: str, inner: Session, runner: BatchRunner) -> None:
        self._pool, self._key, self._inner, self._runner = pool, key, inner, runner
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
        return self._runner.run(feeds)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._key)


class SessionPool:
    def __init__(
        self,
        batching: Literal["auto", "off"] = "auto",
        max_batch: int = 8,
        policy: SelectionPolicy | None = None,
    ) -> None:
        self.batching, self.max_batch, self.policy = batching, max_batch, policy
        self._lock = threading.Lock()
        # key -> (the session, the runner its users take turns on, how many pipelines use it)
        self._entries: dict[str, tuple[Session, BatchRunner, int]] = {}

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
                session, runner, users = self._entries[key]
                self._entries[key] = (session, runner, users + 1)
                runner.measure_again()  # more cameras: batching may pay now (or no longer)
            else:
                session = backend.load(artifact, options)
                runner = BatchRunner(session, self.batching, self.max_batch, self.policy)
                self._entries[key] = (session, runner, 1)
        return SharedSession(self, key, session, runner)

    def release(self, key: str) -> None:
        with self._lock:
            session, runner, users = self._entries[key]
            if users > 1:
                self._entries[key] = (session, runner, users - 1)
                return
            del self._entries[key]
        session.close()

    def stats(self) -> list[dict[str, Any]]:
        """Every loaded session: its backend, how many pipelines use it, and its batching."""
        with self._lock:
            entries = list(self._entries.items())
        return [
            {
                "backend": session.backend,
                "artifact": json.loads(key)[1],
                "users": users,
                "batching": runner.snapshot(),
            }
            for key, (session, runner, users) in entries
        ]
