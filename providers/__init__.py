"""Inference backends behind one small interface, plus backend selection.

Nothing here imports `agent/`: providers only move tensors. A backend whose runtime is
not installed is reported by its `probe()`, it never breaks the import of this package.

The names below are imported on first use (PEP 562): `from providers import ModelArtifact` loads
providers/base.py alone, not selection and trials (numpy, psutil), which a command that only reads
a config (`edge-agent config validate`) never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from providers.select.candidates import screen
    from providers.select.decide import decide
    from providers.select.load import load_decided
    from providers.select.policy import SelectionPolicy
    from providers.select.reports import CandidateReport, Decision, NoBackendError
    from providers.trial import TrialRequest, TrialResult, run_trial, run_trial_isolated

# name -> the module that defines it.
_WHERE = {
    **dict.fromkeys(
        (
            "Backend",
            "BackendError",
            "BackendOptions",
            "ModelArtifact",
            "ProbeResult",
            "Session",
            "Support",
            "TensorSpec",
        ),
        "providers.base",
    ),
    **dict.fromkeys(("all_backends", "get_backend"), "providers.registry"),
    **dict.fromkeys(
        (
            "CandidateReport",
            "Decision",
            "NoBackendError",
            "SelectionPolicy",
            "decide",
            "load_decided",
            "screen",
        ),
        "providers.select",
    ),
    **dict.fromkeys(("TrialRequest", "TrialResult", "run_trial", "run_trial_isolated"), "providers.trial"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'providers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later look-ups are plain attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
