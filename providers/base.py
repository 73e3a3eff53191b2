"""The Backend / Session interface every inference runtime implements."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:  # imported where a tensor is made: the options models (a config's) need no numpy
    import numpy as np

Dim = int | str | None  # a fixed size, a symbolic name, or unknown

# Where the box's /proc, /sys, /dev and /etc are read from (tests point it at fixture trees).
SYSROOT_ENV = "EDGE_AGENT_SYSROOT"


def sysroot(root: Path | str | None = None) -> Path:
    """The root to read: `root`, else $EDGE_AGENT_SYSROOT (read now), else "/"."""
    if root is None:
        root = os.environ.get(SYSROOT_ENV, "").strip() or "/"
    return Path(os.path.abspath(root))


OptionsT = TypeVar("OptionsT", bound="BackendOptions")


class BackendError(Exception):
    """A backend cannot load or run a model; the message says why."""


def one_line(exc: BaseException | str, limit: int = 300) -> str:
    """A runtime's (often multi-line) error as one bounded line for logs and explanations."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[Dim, ...]
    dtype: str  # numpy dtype name, e.g. "float32"
    # (scale, zero point) of a quantised integer tensor, when the model file says (TFLite does):
    # the real value is scale * (q - zero_point).
    quantization: tuple[float, int] | None = None

    def fixed_dim(self, index: int) -> int | None:
        """The size of a dimension when the model fixes it, else None."""
        if -len(self.shape) <= index < len(self.shape):
            dim = self.shape[index]
            return dim if isinstance(dim, int) and dim > 0 else None
        return None


@dataclass(frozen=True)
class ModelArtifact:
    """One file of a model version, as the store installed it."""

    path: Path
    format: str  # "onnx", "tflite", "openvino-ir"
    sha256: str
    name: str = ""  # the file name people know it by (store blobs are named by hash)
    derived_from: str = ""  # for an artifact the agent made from another: that one's file name

    @property
    def label(self) -> str:
        """How messages name this artifact."""
        return self.name or self.path.name


@dataclass(frozen=True)
class VariantArtifact(ModelArtifact):
    """A reduced-precision variant of a model file (`registry publish --quantize int8`; the agent
    reads what it is from the file's own metadata: agent/transform.py): one more candidate, proven
    on the reports against the float model's reference, never a reference itself. `derived_from`
    names the float model file it was made from."""

    precision: str = "int8"


def computes_in(artifact: ModelArtifact, runtime_precision: str) -> str:
    """The precision a session on `artifact` reports: a variant's (its quantized ops run in int8,
    whatever the runtime's own precision for the parts left in float), else the runtime's."""
    return artifact.precision if isinstance(artifact, VariantArtifact) else runtime_precision


@dataclass(frozen=True)
class ProbeResult:
    """What a backend found on this box: usable or not, and why."""

    backend: str
    available: bool
    reason: str
    versions: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Support:
    """Whether a backend can run an artifact; when not, why, naming the operators it lacks."""

    ok: bool
    reason: str = ""
    unsupported_ops: tuple[str, ...] = ()


class BackendOptions(BaseModel):
    """Base of every backend's options model (from YAML): unknown keys are errors."""

    # Built when first used: a config names one or two backends, if any (start-up time).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def parse_options(model: type[OptionsT], options: Mapping[str, Any] | None, backend: str) -> OptionsT:
    """Validate a backend's options, or raise BackendError naming the backend and each bad key."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: {e['msg']}" for e in exc.errors()
        )
        known = ", ".join(model.model_fields) or "none"
        raise BackendError(f"{backend}: bad options: {problems} (known options: {known})") from None


class Session(ABC):
    """A loaded model, ready to run. Not required to be thread-safe: one caller at a time."""

    backend: str
    precision: str  # what the runtime actually computes in, e.g. "fp32"
    # The runtime's own timing of the last run, where it keeps one (OpenVINO: InferRequest.latency,
    # what its benchmark_app reports); wall time around run() adds the Python call and output copies.
    compute_ms: float | None = None

    @property
    @abstractmethod
    def inputs(self) -> list[TensorSpec]: ...

    @property
    @abstractmethod
    def outputs(self) -> list[TensorSpec]: ...

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; returns every output by name. Raises BackendError."""

    def close(self) -> None:  # noqa: B027 - optional for runtimes that free on GC
        """Free the runtime's resources."""

    def warm_up(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """Run once on zeros so JIT/compile cost is paid before the first live frame.

        `shapes` gives the real input shapes where the model leaves dimensions open
        (many convolutional models fail on a 1x1 image); other open dimensions become 1.
        """
        import numpy as np

        feeds = {}
        for spec in self.inputs:
            shape = (shapes or {}).get(spec.name) or tuple(
                d if isinstance(d, int) and d > 0 else 1 for d in spec.shape
            )
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
        self.run(feeds)


class Backend(ABC):
    """One runtime on one device, e.g. "onnxruntime/CPUExecutionProvider", "openvino/NPU".

    `name` is "<runtime>/<device>". `formats` are the artifact formats it can read.
    `options_model` validates the options YAML gives for it.
    """

    name: str
    runtime: str
    device: str
    formats: frozenset[str] = frozenset()
    # Formats made for this runtime. Another runtime's format it can also read (OpenVINO reading
    # .tflite) makes a candidate of the second tier: chosen only when no native one works.
    native_formats: frozenset[str] | None = None  # None: all of `formats`

    def is_native(self, artifact_format: str) -> bool:
        native = self.formats if self.native_formats is None else self.native_formats
        return artifact_format in native

    options_model: type[BackendOptions] = BackendOptions

    @abstractmethod
    def probe(self) -> ProbeResult:
        """Is this backend usable here? Never raises: a missing runtime is a reason."""

    @abstractmethod
    def supports(self, artifact: ModelArtifact) -> Support:
        """Can this backend run this artifact (format, operators)?"""

    @abstractmethod
    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        """Load an artifact. Raises BackendError with the runtime's reason."""
