"""Inference backends behind one small interface, plus backend selection.

Nothing here imports `agent/`: providers only move tensors. A backend whose runtime is
not installed is reported by its `probe()`, it never breaks the import of this package.
"""

from providers.base import (
    Backend,
    BackendError,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    TensorSpec,
)
from providers.registry import all_backends, get_backend
from providers.select import Candidate, Choice, NoBackendError, select_backend

__all__ = [
    "Backend",
    "BackendError",
    "Candidate",
    "Choice",
    "ModelArtifact",
    "NoBackendError",
    "ProbeResult",
    "Session",
    "Support",
    "TensorSpec",
    "all_backends",
    "get_backend",
    "select_backend",
]
