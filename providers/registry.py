"""The explicit list of backends, imported lazily.

A backend module is imported only when asked for, so a box without OpenVINO (or with a
broken install of it) still runs onnxruntime; the import error becomes that backend's
probe reason instead of a crash.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from providers.base import Backend, ModelArtifact, ProbeResult, Session, Support

# name -> (module, class, constructor kwargs). Preference order lives in providers/select.py.
_BACKENDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "onnxruntime/CPUExecutionProvider": (
        "providers.onnxruntime_backend",
        "OnnxRuntimeBackend",
        {"execution_provider": "CPUExecutionProvider"},
    ),
}


class UnavailableBackend(Backend):
    """Stands in for a backend whose module failed to import."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    def probe(self) -> ProbeResult:
        return ProbeResult(self.name, False, self._reason)

    def supports(self, artifact: ModelArtifact) -> Support:
        return Support(False, self._reason)

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        from providers.base import BackendError

        raise BackendError(f"{self.name} is not available: {self._reason}")


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called `name`; an UnavailableBackend when its runtime cannot be imported."""
    if name not in _BACKENDS:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(_BACKENDS)}")
    module_name, class_name, kwargs = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken install can raise OSError etc., not only ImportError
        return UnavailableBackend(name, f"cannot import its runtime: {exc}")
    backend: Backend = getattr(module, class_name)(**kwargs)
    return backend


def all_backends() -> list[Backend]:
    return [get_backend(name) for name in _BACKENDS]
