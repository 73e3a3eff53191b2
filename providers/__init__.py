"""Inference backends behind one small interface, plus backend selection.

Nothing here imports `agent/`: providers only move tensors. A backend whose runtime is
not installed is reported by its `probe()`, it never breaks the import of this package.
"""

from providers.base import (
    Backend,
    BackendError,
    BackendOptions,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    TensorSpec,
)
from providers.registry import all_backends, get_backend
from providers.select import (
    CandidateReport,
    Decision,
    NoBackendError,
    SelectionPolicy,
    decide,
    load_decided,
    screen,
)
from providers.trial import TrialRequest, TrialResult, run_trial, run_trial_isolated

__all__ = [
    "Backend",
    "BackendError",
    "BackendOptions",
    "CandidateReport",
    "Decision",
    "ModelArtifact",
    "NoBackendError",
    "ProbeResult",
    "SelectionPolicy",
    "Session",
    "Support",
    "TensorSpec",
    "TrialRequest",
    "TrialResult",
    "all_backends",
    "decide",
    "get_backend",
    "load_decided",
    "run_trial",
    "run_trial_isolated",
    "screen",
]
