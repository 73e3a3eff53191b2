"""Pick a backend for a model: filter candidates with reasons, rank, load the first that works.

Selection is a function over data (backends' probe results and the model's artifacts), so it
can be tested without hardware. Issue 4 adds ranking by hardware, on-device benchmarks and
output checks; the shape (every rejected candidate keeps its reason) stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.base import Backend, BackendError, ModelArtifact, Session
from providers.registry import all_backends


@dataclass(frozen=True)
class Candidate:
    backend: str
    artifact: ModelArtifact
    ok: bool
    reason: str


@dataclass
class Choice:
    """The backend chosen for a model, and why every other candidate was not."""

    backend: str
    artifact: ModelArtifact
    candidates: list[Candidate] = field(default_factory=list)

    def explain(self) -> str:
        others = [
            f"{c.backend} on {c.artifact.label}: {c.reason}"
            for c in self.candidates
            if (c.backend, c.artifact) != (self.backend, self.artifact)
        ]
        text = f"chose {self.backend} for {self.artifact.label}"
        return text + (f" (not chosen: {'; '.join(others)})" if others else "")


class NoBackendError(BackendError):
    def __init__(self, candidates: list[Candidate]) -> None:
        reasons = "; ".join(f"{c.backend}: {c.reason}" for c in candidates) or "no backends are registered"
        super().__init__(f"no backend can run this model ({reasons})")
        self.candidates = candidates


def select_backend(
    artifacts: Sequence[ModelArtifact],
    options: Mapping[str, Mapping[str, Any]] | None = None,
    backends: Sequence[Backend] | None = None,
) -> tuple[Session, Choice]:
    """Load the model on the first candidate that probes, supports and loads it.

    `options` maps a backend name to its load options. Raises NoBackendError listing every
    candidate's reason when none works.
    """
    candidates: list[Candidate] = []
    for backend in backends if backends is not None else all_backends():
        probe = backend.probe()
        for artifact in artifacts:
            if not probe.available:
                candidates.append(Candidate(backend.name, artifact, False, probe.reason))
                continue
            support = backend.supports(artifact)
            if not support.ok:
                candidates.append(Candidate(backend.name, artifact, False, support.reason))
                continue
            try:
                session = backend.load(artifact, (options or {}).get(backend.name))
            except BackendError as exc:
                candidates.append(Candidate(backend.name, artifact, False, str(exc)))
                continue
            candidates.append(Candidate(backend.name, artifact, True, "ok"))
            return session, Choice(backend.name, artifact, candidates)
    raise NoBackendError(candidates)
