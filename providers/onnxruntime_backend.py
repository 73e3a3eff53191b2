"""onnxruntime, one Backend per execution provider (TensorRT, CUDA, OpenVINO, ..., CPU).

Every EP this product cares about is listed, available in this build or not, so `probe()` can
say what to install. After loading, the session is checked to really use the EP asked for:
onnxruntime falls back to the CPU silently when an EP cannot initialise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from providers.base import (
    Backend,
    BackendError,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    TensorSpec,
    computes_in,
    one_line,
    parse_options,
)
from providers.options import CpuOptions, CudaOptions, OpenVinoEpOptions, TensorRtOptions

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

CPU_EP = "CPUExecutionProvider"


@dataclass(frozen=True)
class _Ep:
    options: type[CpuOptions]
    install_hint: str


# The EPs an edge box may have, most wanted first (the ranking itself lives in providers/select/).
_EPS: dict[str, _Ep] = {
    "TensorrtExecutionProvider": _Ep(
        TensorRtOptions,
        "install onnxruntime-gpu with TensorRT (on Jetson: the JetPack onnxruntime-gpu wheel)",
    ),
    "CUDAExecutionProvider": _Ep(CudaOptions, "install onnxruntime-gpu matching the CUDA version"),
    "ROCMExecutionProvider": _Ep(CudaOptions, "install onnxruntime-rocm"),
    "OpenVINOExecutionProvider": _Ep(OpenVinoEpOptions, "install onnxruntime-openvino"),
    "CoreMLExecutionProvider": _Ep(CpuOptions, "CoreML exists only on Apple devices"),
    "XnnpackExecutionProvider": _Ep(CpuOptions, "build onnxruntime with --use_xnnpack"),
    CPU_EP: _Ep(CpuOptions, "reinstall onnxruntime"),
}


def discover() -> list[Backend]:
    """One backend per known EP, plus any other EP this build offers."""
    # AzureExecutionProvider calls a cloud endpoint: not a local backend.
    extra = [ep for ep in ort.get_available_providers() if ep not in _EPS and ep != "AzureExecutionProvider"]
    names = list(_EPS) + extra
    return [OnnxRuntimeBackend(ep) for ep in names]


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, (int, str)) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))


class OnnxRuntimeSession(Session):
    def __init__(self, session: ort.InferenceSession, backend: str, precision: str) -> None:
        self._session = session
        self.backend = backend
        self.precision = precision
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
            raise BackendError(f"{self.backend}: run failed: {one_line(exc)}") from exc
        return {name: _as_array(value) for name, value in zip(self._output_names, values, strict=True)}

    def close(self) -> None:
        # Dropping the only reference frees the native session.
        self._session = None


class OnnxRuntimeBackend(Backend):
    runtime = "onnxruntime"
    formats = frozenset({"onnx"})

    def __init__(self, execution_provider: str = CPU_EP) -> None:
        self.execution_provider = self.device = execution_provider
        self.name = f"onnxruntime/{execution_provider}"
        ep = _EPS.get(execution_provider, _Ep(CpuOptions, "use an onnxruntime build with it"))
        self.options_model = ep.options
        self._install_hint = ep.install_hint
        self._support_cache: dict[str, Support] = {}

    def probe(self) -> ProbeResult:
        available = ort.get_available_providers()
        versions = {"onnxruntime": ort.__version__}
        if self.execution_provider not in available:
            return ProbeResult(
                self.name,
                False,
                f"this onnxruntime build has no {self.execution_provider}: {self._install_hint}",
                versions,
            )
        return ProbeResult(self.name, True, "ok", versions, devices=(self.execution_provider,))

    def supports(self, artifact: ModelArtifact) -> Support:
        """Format, then operator coverage: a session that may not fall back to the CPU.

        The answer is cached per artifact hash (building a session is the costly part).
        """
        if artifact.format not in self.formats:
            return Support(False, f"onnxruntime runs ONNX files, not {artifact.format}")
        if artifact.sha256 in self._support_cache:
            return self._support_cache[artifact.sha256]
        try:
            self._session(artifact, {}, strict=True)
            support = Support(True)
        except BackendError as exc:
            ops = tuple(sorted(set(_MISSING_OP.findall(str(exc)))))
            reason = f"unsupported operators: {', '.join(ops)}" if ops else str(exc)
            support = Support(False, reason, ops)
        self._support_cache[artifact.sha256] = support
        return support

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        parsed = parse_options(self.options_model, options, self.name)
        session = self._session(artifact, parsed.model_dump(exclude_none=True), strict=False)
        precision = "fp16" if getattr(parsed, "fp16", False) else "fp32"
        return OnnxRuntimeSession(session, self.name, computes_in(artifact, precision))

    def _session(
        self, artifact: ModelArtifact, options: Mapping[str, Any], strict: bool
    ) -> ort.InferenceSession:
        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3  # warnings about unused initializers are noise here
        if "intra_op_threads" in options:
            session_options.intra_op_num_threads = int(options["intra_op_threads"])
        if "inter_op_threads" in options:
            session_options.inter_op_num_threads = int(options["inter_op_threads"])
        spin = "1" if options.get("allow_spinning", False) else "0"
        session_options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        session_options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        if strict and self.execution_provider != CPU_EP:
            # Operator coverage: fail instead of quietly running unsupported nodes on the CPU.
            session_options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        provider = (self.execution_provider, _provider_options(self.execution_provider, options))
        try:
            session = ort.InferenceSession(
                str(artifact.path), sess_options=session_options, providers=[provider]
            )
        except Exception as exc:
            raise BackendError(f"{self.name} cannot load {artifact.label}: {one_line(exc)}") from exc
        # onnxruntime silently falls back to CPU when an EP cannot initialise.
        used = session.get_providers()
        if not used or used[0] != self.execution_provider:
            raise BackendError(
                f"{self.name}: session fell back to {used} instead of {self.execution_provider}"
            )
        return session


def _provider_options(ep: str, options: Mapping[str, Any]) -> dict[str, str]:
    """Our option names -> the EP's own provider options (strings, as onnxruntime wants them)."""
    out: dict[str, str] = {}
    if "device_id" in options:
        out["device_id"] = str(options["device_id"])
    if ep == "TensorrtExecutionProvider":
        out["trt_fp16_enable"] = str(bool(options.get("fp16", False)))
        if options.get("engine_cache_dir"):
            out["trt_engine_cache_enable"] = "True"
            out["trt_engine_cache_path"] = str(options["engine_cache_dir"])
        if options.get("timing_cache_dir"):
            out["trt_timing_cache_enable"] = "True"
            out["trt_timing_cache_path"] = str(options["timing_cache_dir"])
    if ep == "OpenVINOExecutionProvider":
        out["device_type"] = str(options.get("device_type", "CPU"))
        if options.get("cache_dir"):
            out["cache_dir"] = str(options["cache_dir"])
    return out


def _as_array(value: Any) -> np.ndarray:
    """Outputs as arrays: a ZipMap's list of {label: probability} becomes [N, classes] by sorted label."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        keys = sorted(value[0])
        return np.asarray([[row[k] for k in keys] for row in value], dtype=np.float32)
    return np.asarray(value)


# "Could not find an implementation for ZipMap(1) node with name 'ZipMap'" and the like.
_MISSING_OP = re.compile(r"implementation for (\w+)\(\d+\) node")
