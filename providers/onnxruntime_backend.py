"""onnxruntime with one execution provider (CPU for now; other EPs reuse this class)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from providers.base import Backend, BackendError, ModelArtifact, ProbeResult, Session, Support, TensorSpec

# onnxruntime reports element types as "tensor(float)"; map them to numpy dtype names.
_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
    "tensor(string)": "str",
}

_OPTION_KEYS = {"intra_op_threads", "inter_op_threads"}


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, (int, str)) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))


class OnnxRuntimeSession(Session):
    def __init__(self, session: ort.InferenceSession, backend: str) -> None:
        self._session = session
        self.backend = backend
        self.precision = "fp32"  # the CPU EP computes in the model's own types
        self._inputs = [_spec(a) for a in session.get_inputs()]
        self._outputs = [_spec(a) for a in session.get_outputs()]
        self._output_names = [o.name for o in self._outputs]

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self._session.run(self._output_names, dict(feeds))
        except Exception as exc:  # onnxruntime raises its own exception types
            raise BackendError(f"{self.backend}: run failed: {_one_line(exc)}") from exc
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        # Dropping the only reference frees the native session.
        del self._session


class OnnxRuntimeBackend(Backend):
    def __init__(self, execution_provider: str = "CPUExecutionProvider") -> None:
        self.execution_provider = execution_provider
        self.name = f"onnxruntime/{execution_provider}"

    def probe(self) -> ProbeResult:
        available = ort.get_available_providers()
        versions = {"onnxruntime": ort.__version__}
        if self.execution_provider not in available:
            return ProbeResult(
                self.name,
                False,
                f"this onnxruntime build has no {self.execution_provider} (it has: {', '.join(available)})",
                versions,
            )
        return ProbeResult(self.name, True, "ok", versions, devices=("cpu",))

    def supports(self, artifact: ModelArtifact) -> Support:
        if artifact.format != "onnx":
            return Support(False, f"onnxruntime runs ONNX files, not {artifact.format}")
        return Support(True)

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        options = dict(options or {})
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise BackendError(
                f"{self.name}: unknown options {sorted(unknown)}; known: {sorted(_OPTION_KEYS)}"
            )
        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3  # warnings about unused initializers are noise here
        if "intra_op_threads" in options:
            session_options.intra_op_num_threads = int(options["intra_op_threads"])
        if "inter_op_threads" in options:
            session_options.inter_op_num_threads = int(options["inter_op_threads"])
        try:
            session = ort.InferenceSession(
                str(artifact.path), sess_options=session_options, providers=[self.execution_provider]
            )
        except Exception as exc:
            raise BackendError(f"{self.name} cannot load {artifact.label}: {_one_line(exc)}") from exc
        # onnxruntime silently falls back to CPU when an EP cannot take the model.
        used = session.get_providers()
        if not used or used[0] != self.execution_provider:
            raise BackendError(
                f"{self.name}: session fell back to {used} instead of {self.execution_provider}"
            )
        return OnnxRuntimeSession(session, self.name)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
