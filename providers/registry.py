"""The explicit list of runtimes, imported lazily; each runtime module discovers its backends.

A runtime module is imported only when backends are listed, so a box without OpenVINO (or with
a broken install of it) still runs onnxruntime: the import error becomes that runtime's probe
reason instead of a crash. Each module's `discover()` returns one Backend per device or
execution provider it knows of, available or not; `probe()` says which and why.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from providers.base import Backend, BackendError, ModelArtifact, ProbeResult, Session, Support

# runtime -> module with `discover() -> list[Backend]`. Preference order lives in providers/select/.
_RUNTIMES: dict[str, str] = {
    "onnxruntime": "providers.onnxruntime_backend",
    "openvino": "providers.openvino_backend",
    "tflite": "providers.tflite_backend",
}


class UnavailableBackend(Backend):
    """Stands in for a runtime whose module failed to import."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.runtime, _, self.device = name.partition("/")
        self._reason = reason

    def probe(self) -> ProbeResult:
        return ProbeResult(self.name, False, self._reason)

    def supports(self, artifact: ModelArtifact) -> Support:
        return Support(False, self._reason)

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        raise BackendError(f"{self.name} is not available: {self._reason}")


def runtime_backends(runtime: str) -> list[Backend]:
    """The backends one runtime offers; one UnavailableBackend when it cannot even be imported."""
    try:
        module = importlib.import_module(_RUNTIMES[runtime])
        backends: list[Backend] = module.discover()
    except Exception as exc:  # a broken install can raise OSError etc., not only ImportError
        return [UnavailableBackend(f"{runtime}/*", f"cannot import its runtime: {exc}")]
    return backends


def all_backends() -> list[Backend]:
    return [backend for runtime in _RUNTIMES for backend in runtime_backends(runtime)]


def backend_names() -> list[str]:
    return [b.name for b in all_backends()]


def get_backend(name: str) -> Backend:
    """The backend called `name` (e.g. "openvino/CPU"); KeyError listing the known names.

    Only that backend's runtime is imported (a trial process needs one runtime, not all).
    """
    runtime = name.partition("/")[0]
    if runtime in _RUNTIMES:
        for backend in runtime_backends(runtime):
            if backend.name == name:
                return backend
    backends = all_backends()
    for backend in backends:
        if backend.name == name:
            return backend
    raise KeyError(f"unknown backend {name!r}; known: {', '.join(b.name for b in backends)}")
