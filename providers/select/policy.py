"""What selection goes by: the default preference and the reference backends, the `SelectionPolicy`
(with the spare-core thread options) and the `Sample` inputs candidates are proven on."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from providers.base import ModelArtifact, VariantArtifact
from providers.select.reports import CandidateReport

# Most wanted first; glob patterns over backend names. TensorRT and CUDA on NVIDIA, then the
# dedicated NPUs/TPUs, GPUs, then CPUs (OpenVINO's CPU plugin before onnxruntime's CPU EP).
DEFAULT_PREFERENCE: tuple[str, ...] = (
    "onnxruntime/TensorrtExecutionProvider",
    "onnxruntime/CUDAExecutionProvider",
    "tflite/edgetpu",
    "openvino/NPU*",
    "openvino/GPU*",
    "onnxruntime/ROCMExecutionProvider",
    "onnxruntime/OpenVINOExecutionProvider",
    "onnxruntime/CoreMLExecutionProvider",
    "openvino/CPU",
    "onnxruntime/XnnpackExecutionProvider",
    "onnxruntime/CPUExecutionProvider",
    "tflite/cpu",
    "openvino/AUTO",
    "*",
)

# Where reference outputs come from: the plainest CPU backend that can read the artifact.
REFERENCE_BACKENDS: tuple[str, ...] = ("onnxruntime/CPUExecutionProvider", "tflite/cpu", "openvino/CPU")
# The references that always compute at full precision (OpenVINO's CPU may default to bf16).
FULL_PRECISION_REFERENCES: tuple[str, ...] = ("onnxruntime/CPUExecutionProvider", "tflite/cpu")


@dataclass(frozen=True)
class SelectionPolicy:
    prefer: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    fixed: str | None = None
    benchmark: bool = True
    max_trials: int = 3
    warmup: int = 3
    runs: int = 20
    min_time_s: float = 1.0
    budget_s: float = 5.0
    timeout_s: float = 180.0
    rtol: float = 1e-2
    atol: float = 1e-3
    max_mismatch: float = 0.001  # share of an output's values allowed outside the tolerance
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    spare_core: bool = True  # try CPU backends with one core fewer (spare_core_variant)
    # The correct candidates that compete on speed are timed again side by side: this many rounds,
    # a turn of this many seconds each (providers/rounds.py). 0 rounds: the trials' own figures.
    rounds: int = 5
    turn_s: float = 0.2

    def options_for(self, backend: str) -> dict[str, Any]:
        return dict(self.options.get(backend, {}))


# The option that caps the threads of one inference, for the CPU backends that use every core by
# default. A pipeline decodes, prepares and reports on threads of its own beside inference: a model
# that runs about as fast with one core fewer leaves that core to them (on 2 cores, PP-OCR's
# classifier on OpenVINO: 0.95x the speed alone, 1.37x the pipeline's results/s).
CPU_THREAD_OPTIONS = {"onnxruntime/CPUExecutionProvider": "intra_op_threads", "openvino/CPU": "threads"}
SPARE_CORE_SLOWDOWN = 1.10  # one core fewer is taken when the model is at most this much slower
# ... and only for a model whose run takes less than this on every core: beside a longer run the
# pipeline's own work per frame (about a millisecond of CPU on a small box) hardly counts, and a
# trial fooled by a busy spell would cost a large model up to half its speed for good.
SPARE_CORE_MAX_MS = 5.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a systemd CPUAffinity= or a container's
    cpuset), not every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def spare_core_variant(backend: str, policy: SelectionPolicy) -> dict[str, int] | None:
    """The options that run `backend` with one core fewer, to time beside its defaults; None when it
    has no such option, the box has one core, the policy turns this off or its options set threads."""
    option = CPU_THREAD_OPTIONS.get(backend)
    cores = usable_cores()
    if option is None or cores < 2 or not policy.spare_core or option in policy.options_for(backend):
        return None
    return {option: cores - 1}


def serving_options(policy: SelectionPolicy, report: CandidateReport) -> dict[str, Any]:
    """The options a decided candidate is loaded with: the policy's, plus the thread count its trial
    chose (CandidateReport.threads)."""
    options = policy.options_for(report.backend)
    option = CPU_THREAD_OPTIONS.get(report.backend)
    if report.threads is not None and option is not None:
        options.setdefault(option, report.threads)
    return options


@dataclass(frozen=True)
class Sample:
    """Inputs to prove candidates on, and where they come from.

    `expected` are outputs the model's publisher vouches for (shipped with its test data): when
    present they are the reference. `fits` are the sha256s of the artifacts these inputs are for
    (a .tflite variant may want NHWC where the .onnx wants NCHW); None: every artifact.
    """

    feeds: Mapping[str, np.ndarray]
    origin: str = "a sample input"
    expected: Mapping[str, np.ndarray] | None = None
    fits: frozenset[str] | None = None
    # Tolerances the expected outputs hold to (declared with the test data): every value must be
    # within them. None: the selection policy's.
    rtol: float | None = None
    atol: float | None = None

    def fits_artifact(self, artifact: ModelArtifact) -> bool:
        return self.fits is None or artifact.sha256 in self.fits


Samples = Sequence[Sample] | Mapping[str, np.ndarray] | None


def as_samples(samples: Samples) -> list[Sample]:
    """A bare feeds dict is one sample that fits every artifact."""
    if samples is None:
        return []
    if isinstance(samples, Mapping):
        return [Sample(samples)]
    return list(samples)


def variant_precision(artifact: ModelArtifact) -> str:
    """ "int8" for a reduced-precision variant, "" for a model file as published (or upgraded)."""
    return artifact.precision if isinstance(artifact, VariantArtifact) else ""


Progress = Callable[[str], None]  # hears what selection is doing now, e.g. "trial 2: openvino/CPU on ..."
