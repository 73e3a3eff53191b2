"""Each backend's options (`backends.options.<backend name>` in agent.yaml): one model per runtime
and device. The backends check their options with these when they load; agent/config/backends.py
checks a config's with the same models, so `edge-agent config validate` names a misspelt option with
its line. Which backend takes which model: `options_model`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from providers.base import BackendOptions


class CpuOptions(BackendOptions):
    """onnxruntime/CPUExecutionProvider, and every execution provider without options of its own."""

    intra_op_threads: int | None = Field(None, ge=1, description="Threads inside one operator.")
    inter_op_threads: int | None = Field(None, ge=1, description="Operators run in parallel.")
    allow_spinning: bool = Field(
        False,
        description="Let idle worker threads spin for the next run. Off: at a camera's pace spinning "
        "burns the CPU between frames (PP-OCR cls at 30 fps here: 34 ms of CPU per result spinning, "
        "1.3 ms not: scripts/bench_spinning.py); on only for a saturated source where latency counts most.",
    )


class CudaOptions(CpuOptions):
    """onnxruntime/CUDAExecutionProvider and onnxruntime/ROCMExecutionProvider."""

    device_id: int = Field(0, ge=0, description="Which GPU.")


class TensorRtOptions(CudaOptions):
    """onnxruntime/TensorrtExecutionProvider."""

    fp16: bool = Field(False, description="Let TensorRT build FP16 kernels (checked against CPU outputs).")
    engine_cache_dir: str | None = Field(
        None,
        description="Keep built engines here (builds take minutes; default: <state_dir>/cache/tensorrt).",
    )
    timing_cache_dir: str | None = Field(None, description="Keep TensorRT's timing cache here.")


class OpenVinoEpOptions(CpuOptions):
    """onnxruntime/OpenVINOExecutionProvider."""

    device_type: str = Field("CPU", description="OpenVINO device: CPU, GPU, NPU, AUTO:GPU,CPU ...")
    cache_dir: str | None = Field(None, description="Keep compiled blobs here.")


class OpenVinoOptions(BackendOptions):
    """openvino/<device> (CPU, GPU, GPU.1, NPU, AUTO ...)."""

    cache_dir: str | None = Field(
        None, description="CACHE_DIR: compiled blobs cached here (default: <state_dir>/cache/openvino)."
    )
    hint: Literal["latency", "throughput"] = Field("latency", description="PERFORMANCE_HINT.")
    precision: Literal["auto", "f32", "bf16", "f16"] = Field(
        "auto", description="INFERENCE_PRECISION_HINT; auto: the device's default."
    )
    num_streams: int | None = Field(None, ge=1, description="NUM_STREAMS.")
    threads: int | None = Field(None, ge=1, description="INFERENCE_NUM_THREADS (CPU, and AUTO's CPU only).")
    weights: str | None = Field(None, description="IR only: the .bin file, when it is not next to the .xml.")


class TfliteOptions(BackendOptions):
    """tflite/cpu."""

    threads: int | None = Field(
        None, ge=1, description="CPU threads (num_threads); unset: the runtime's default (1 in LiteRT 2.x)."
    )


class EdgeTpuOptions(TfliteOptions):
    """tflite/edgetpu."""

    device: str | None = Field(
        None, min_length=1, description='Which Edge TPU: "usb", "usb:0", "pci:0"; unset: the first found.'
    )


# onnxruntime's execution providers with options of their own (the others take CpuOptions).
EP_OPTIONS: dict[str, type[CpuOptions]] = {
    "TensorrtExecutionProvider": TensorRtOptions,
    "CUDAExecutionProvider": CudaOptions,
    "ROCMExecutionProvider": CudaOptions,
    "OpenVINOExecutionProvider": OpenVinoEpOptions,
}
TFLITE_OPTIONS: dict[str, type[TfliteOptions]] = {"cpu": TfliteOptions, "edgetpu": EdgeTpuOptions}


def options_model(backend: str) -> type[BackendOptions] | None:
    """The options model of the backend called `backend` ("openvino/CPU"); None for no such backend."""
    runtime, _, device = backend.partition("/")
    if not device:
        return None
    if runtime == "onnxruntime":
        return EP_OPTIONS.get(device, CpuOptions)
    if runtime == "openvino":
        return OpenVinoOptions
    if runtime == "tflite":
        return TFLITE_OPTIONS.get(device)
    return None
