"""The OpenVINO runtime: one backend per device OpenVINO reports (CPU, GPU, GPU.0, NPU, ...) plus AUTO.

Formats: OpenVINO reads ONNX and TFLite files directly, and its own IR (an .xml graph plus a .bin
of weights). The store names blobs by sha256, without extensions, and OpenVINO picks its reader
by the file name (the TFLite reader refuses a file not named *.tflite), so a blob whose name lacks
the format's extension is read through a symlink with the right one in a private temporary dir.

IR weights: the artifact's path is the .xml; the weights are the file named by the `weights`
option when given (load only), else the sibling `path.with_suffix(".bin")` ("model.xml" ->
"model.bin", a store blob "<sha256>" -> "<sha256>.bin"). supports() has no options, so it only
looks for the sibling.

AUTO: OpenVINO's AUTO plugin compiles the whole model on one device it picks (CPU is always a
candidate), so supports() for AUTO asks every hardware device OpenVINO sees and is satisfied when
one of them runs every operator; when none does, it reports the device that lacks the fewest.

Precision: OpenVINO computes in bf16 by default on CPUs with AMX/avx512_bf16 and in f16 on GPU and
NPU, which changes outputs. A session reports what the compiled model really uses ("fp32",
"bf16", "fp16"), read back from the compiled model (for AUTO, from the device it chose); the
`precision` option asks for one, and a device without it silently keeps its default, which the
session then reports.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from providers.base import (
    Backend,
    BackendError,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    TensorSpec,
    computes_in,
    parse_options,
    sysroot,
)
from providers.options import OpenVinoOptions

_OVC = "openvino.tools.ovc"


def _openvino() -> ModuleType:
    """`import openvino`, without the model conversion API it imports too (openvino.tools.ovc, for
    `ov.convert_model`), which the agent never calls: that import loads OpenVINO's usage telemetry,
    walks the stack three times and sends its event from a new process, ~0.1 s of every start of a
    daemon on OpenVINO (docs/performance.md, "Start-up time"). `ov.convert_model` still works: it
    imports the API when first asked for."""
    if "openvino" in sys.modules or _OVC in sys.modules:
        import openvino

        return openvino
    sys.modules[_OVC] = None  # type: ignore[assignment]  # openvino's __init__ skips an ImportError
    try:
        import openvino
    finally:
        if sys.modules.get(_OVC, ...) is None:
            del sys.modules[_OVC]

    def convert_model_on_first_use(name: str) -> Any:
        if name == "convert_model":
            from openvino.tools.ovc import convert_model

            return convert_model
        raise AttributeError(f"module 'openvino' has no attribute {name!r}")

    if not hasattr(openvino, "convert_model"):
        openvino.__getattr__ = convert_model_on_first_use
    return openvino


if TYPE_CHECKING:
    import openvino as ov
else:
    ov = _openvino()

RUNTIME = "openvino"
FORMATS = frozenset({"onnx", "openvino-ir", "tflite"})
_EXTENSIONS = {"onnx": ".onnx", "tflite": ".tflite", "openvino-ir": ".xml"}
# Virtual devices: they pick or combine hardware devices and have no operators of their own.
_VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")

# OpenVINO element type names -> numpy dtype names (bf16 and the sub-byte types have no numpy dtype).
OV_ELEMENT_TYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u64": "uint64",
    "u32": "uint32",
    "u16": "uint16",
    "u8": "uint8",
    "u1": "uint1",
    "boolean": "bool",
    "string": "str",
}
# INFERENCE_PRECISION_HINT values -> the precision names sessions report.
_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "f64": "fp64"}
# What a device computes in when its compiled model does not say (OpenVINO's documented defaults).
_DEFAULT_PRECISION = {"GPU": "fp16", "NPU": "fp16"}

# Why a device family OpenVINO does not see is missing: (user-space runtime, its packages, the
# device node the kernel driver makes, read under EDGE_AGENT_SYSROOT).
_MISSING_DEVICE = {
    "NPU": ("the NPU user-space driver", "intel-level-zero-npu / linux-npu-driver", "/dev/accel"),
    "GPU": ("the Intel GPU compute runtime", "intel-opencl-icd / intel-level-zero-gpu", "/dev/dri"),
}

# Operators named in OpenVINO's conversion errors (TFLite/TF: one op; ONNX: a list with domains).
_NO_TRANSLATOR = re.compile(r"No translator found for (\S+) node")
_NO_CONVERSION_RULE = re.compile(r"No conversion rule found for operations: ([^\n]+)")


@functools.lru_cache(maxsize=1)
def _core() -> ov.Core:
    """One Core per process: creating one loads the plugins (about 0.1 s)."""
    return ov.Core()


def _ov_message(exc: BaseException) -> str:
    """OpenVINO's multi-line exception text, as one line without its source locations."""
    text = str(exc)
    if "Summary:" in text:  # a conversion report: its summary names every operator that failed
        items = [line.strip(" -") for line in text.split("Summary:", 1)[1].splitlines() if line.strip()]
        text = "Model wasn't fully converted: " + "; ".join(items)
    lines = [line.strip() for line in text.splitlines()]
    kept = [
        line
        for line in lines
        if line and not line.startswith("Exception from ") and not re.match(r"Check '.*' failed at ", line)
    ]
    text = " ".join(kept or [line for line in lines if line]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _ops_named_in(message: str) -> set[str]:
    """Operator types an OpenVINO conversion error names ("ai.onnx.ml.ZipMap" -> "ZipMap")."""
    ops = set(_NO_TRANSLATOR.findall(message))
    for listing in _NO_CONVERSION_RULE.findall(message):
        ops.update(item.strip().rsplit(".", 1)[-1] for item in listing.split(",") if item.strip())
    return ops


def _onnx_unconverted_ops(path: Path) -> set[str]:
    """The ONNX operators OpenVINO's ONNX reader has no conversion rule for, when reading failed.

    OpenVINO stops at the first problem, and for ONNX-ML models (scikit-learn via skl2onnx) that is
    ZipMap's sequence-of-maps output type, before it looks at any operator. So retype non-tensor
    values as tensors, convert partially, and collect the operators left as framework nodes. (Read
    from a file: read from memory, every operator that failed looks alike, including those that
    only failed because their input did.)
    """
    try:
        import onnx
        from openvino.frontend import FrontEndManager

        proto = onnx.load(str(path), load_external_data=False)
        for values in (proto.graph.input, proto.graph.output, proto.graph.value_info):
            for value in values:
                if value.type.WhichOneof("value") != "tensor_type":
                    value.type.Clear()
                    value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        with tempfile.TemporaryDirectory(prefix="edge-agent-ov-") as tmp:
            retyped = Path(tmp) / "retyped.onnx"
            onnx.save(proto, str(retyped))
            frontend = FrontEndManager().load_by_framework("onnx")
            input_model = frontend.load(str(retyped))
            partial = frontend.convert_partially(input_model)
            # Framework nodes refer into the input model (freeing it first crashes): read them now.
            ops = {
                str(op.get_attributes().get("ONNX_META_type", ""))
                for op in partial.get_ops()
                if op.get_type_name() == "ONNXFrameworkNode"
            }
            del partial, input_model, frontend
    except Exception:  # only a diagnosis: the read error is reported anyway
        return set()
    return {op for op in ops if op}


@contextmanager
def _readable_path(artifact: ModelArtifact) -> Iterator[Path]:
    """The artifact's path, or a symlink to it named with the extension OpenVINO's reader needs."""
    suffix = _EXTENSIONS.get(artifact.format, "")
    if not suffix or artifact.path.suffix.lower() == suffix:
        yield artifact.path
        return
    with tempfile.TemporaryDirectory(prefix="edge-agent-ov-") as tmp:
        link = Path(tmp) / f"model{suffix}"
        os.symlink(artifact.path.resolve(), link)
        yield link


def _ir_weights(artifact: ModelArtifact, weights: str | None) -> Path:
    path = Path(weights) if weights else artifact.path.with_suffix(".bin")
    if not path.is_file():
        how = "the `weights` option" if weights else "its sibling"
        raise FileNotFoundError(f"IR weights not found: {how} {path} does not exist")
    return path


def _read_model(artifact: ModelArtifact, weights: str | None = None) -> ov.Model:
    """Read an artifact into an OpenVINO Model; raises what OpenVINO (or the file system) raises."""
    if not artifact.path.is_file():
        raise FileNotFoundError(f"no such file: {artifact.path}")
    with _readable_path(artifact) as path:
        try:
            if artifact.format == "openvino-ir":
                return _core().read_model(str(path), str(_ir_weights(artifact, weights)))
            return _core().read_model(str(path))
        except Exception as exc:
            if path == artifact.path:
                raise
            # Name the artifact's own file in messages, not the temporary link.
            raise RuntimeError(str(exc).replace(str(path), str(artifact.path))) from exc


def _port_name(port: Any, index: int, kind: str) -> str:
    """The model's own name for an input or output port (the ONNX/TFLite tensor name).

    Ports can carry several tensor names (OpenVINO merges the names of tensors it folds away: the
    PP-OCR cls output is also "softmax_0.tmp_0" once compiled, and an ONNX Identity output also
    carries its input's name), so take names from the model as read, before compiling, and prefer
    the one its Parameter/Result node is named after (the ONNX reader names a Result "<output
    name>/sink_port_0").
    """
    names = set(port.get_names())
    node_name = port.get_node().get_friendly_name()
    for candidate in (node_name, node_name.removesuffix("/sink_port_0")):
        if candidate in names:
            return str(candidate)
    if names:
        return str(sorted(names)[0])
    return f"{kind}_{index}"


def _onnx_input_names(artifact: ModelArtifact, model: ov.Model) -> list[str] | None:
    """The ONNX graph's input names in order, where OpenVINO's reader lost one: an input passed
    straight through to an output (test_sequence_model1's Y) is renamed after that output. None
    (the ports' own names) when no input port shares a name with an output, or the counts differ."""
    outputs = {name for port in model.outputs for name in port.get_names()}
    if not any(set(port.get_names()) & outputs for port in model.inputs):
        return None
    try:
        import onnx

        graph = onnx.load(str(artifact.path), load_external_data=False).graph
    except Exception:  # the ports' names are the fallback
        return None
    initializers = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in initializers]
    return names if len(names) == len(model.inputs) else None


def _dtype(element_type: Any) -> str:
    name = element_type.get_type_name()
    return OV_ELEMENT_TYPES.get(name, name)


def _shape(port: Any) -> tuple[int | None, ...]:
    """Static dims as ints, dynamic ones (including ranges like 32..) as None; () when the rank is open."""
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        return ()
    return tuple(dim.get_length() if dim.is_static else None for dim in shape)


def _precision_name(value: Any) -> str:
    name = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
    return _PRECISIONS.get(name, name)


class OpenVinoSession(Session):
    """A compiled model and one InferRequest, reused for every run (one caller at a time)."""

    def __init__(
        self,
        model: ov.Model,
        compiled: ov.CompiledModel,
        backend: str,
        device: str,
        input_names: Sequence[str] | None = None,
    ) -> None:
        self.backend = backend
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        # Names and types from the model as read: compiling can add names to a port (see _port_name).
        # `input_names`: the file's own, by position, where OpenVINO renamed an input (_onnx_input_names).
        self._inputs = [
            TensorSpec(
                input_names[i] if input_names else _port_name(p, i, "input"),
                _shape(p),
                _dtype(p.get_element_type()),
            )
            for i, p in enumerate(model.inputs)
        ]
        self._outputs = [
            TensorSpec(_port_name(p, i, "output"), _shape(p), _dtype(p.get_element_type()))
            for i, p in enumerate(model.outputs)
        ]
        self._input_index = {spec.name: i for i, spec in enumerate(self._inputs)}
        self.execution_devices, self.precision = _execution(compiled, device)

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(feeds) - set(self._input_index))
        missing = sorted(set(self._input_index) - set(feeds))
        if unknown or missing:
            raise BackendError(
                f"{self.backend}: run failed: inputs {sorted(feeds)} do not match the model's "
                f"{[spec.name for spec in self._inputs]}"
            )
        try:
            # share_inputs: no copy of the inputs into the request (they are not touched meanwhile);
            # the outputs come back as copies (share_outputs=False), which the next run cannot overwrite.
            results = self._request.infer(
                {self._input_index[name]: np.ascontiguousarray(value) for name, value in feeds.items()},
                share_inputs=True,
            )
            self.compute_ms = self._request.latency
            return {spec.name: results[i] for i, spec in enumerate(self._outputs)}
        except Exception as exc:
            raise BackendError(f"{self.backend}: run failed: {_ov_message(exc)}") from exc

    def close(self) -> None:
        del self._request
        del self._compiled


def _execution(compiled: ov.CompiledModel, device: str) -> tuple[tuple[str, ...], str]:
    """The devices the compiled model runs on, and the precision it computes in."""
    try:
        devices = tuple(str(d) for d in compiled.get_property("EXECUTION_DEVICES"))
    except Exception:
        devices = (device,)
    family = device.split(".")[0]
    if family not in _VIRTUAL_DEVICES:
        try:
            return devices, _precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        except Exception:
            return devices, _DEFAULT_PRECISION.get(family, "fp32")
    # AUTO has no precision of its own; its DEVICE_PROPERTIES hold the chosen device's. While AUTO
    # still runs on the CPU ("(CPU)") as a GPU compiles, the last device listed is the final one.
    try:
        per_device = compiled.get_property("DEVICE_PROPERTIES")
    except Exception:
        per_device = {}
    for name in reversed([d.strip("()") for d in devices]):
        props = per_device.get(name) or {}
        if "INFERENCE_PRECISION_HINT" in props:
            return devices, _precision_name(props["INFERENCE_PRECISION_HINT"])
    last = devices[-1].strip("()").split(".")[0] if devices else "CPU"
    return devices, _DEFAULT_PRECISION.get(last, "fp32")


class OpenVinoBackend(Backend):
    """OpenVINO on one device ("CPU", "GPU", "GPU.1", "NPU", "AUTO", ...)."""

    runtime = RUNTIME
    formats = FORMATS
    native_formats = frozenset({"onnx", "openvino-ir"})  # .tflite belongs to LiteRT first
    options_model = OpenVinoOptions

    def __init__(self, device: str = "CPU") -> None:
        self.device = device
        self.name = f"{RUNTIME}/{device}"

    # --- probe -----------------------------------------------------------------------------------

    def probe(self) -> ProbeResult:
        versions = {"openvino": ov.__version__}
        try:
            seen = list(_core().available_devices)
        except Exception as exc:
            return ProbeResult(
                self.name, False, f"OpenVINO cannot list devices: {_ov_message(exc)}", versions
            )
        if self.device == "AUTO":
            hardware = [d for d in seen if d.split(".")[0] not in _VIRTUAL_DEVICES]
            if not hardware:
                return ProbeResult(
                    self.name, False, "AUTO has no device to pick: OpenVINO sees none", versions
                )
            names = ", ".join(f"{d}: {self._full_name(d)}" for d in hardware)
            return ProbeResult(self.name, True, f"AUTO picks among {names}", versions, tuple(hardware))
        if self.device not in seen:
            return ProbeResult(self.name, False, self._missing_reason(seen), versions)
        return ProbeResult(self.name, True, self._full_name(self.device), versions, (self.device,))

    @staticmethod
    def _full_name(device: str) -> str:
        try:
            return str(_core().get_property(device, "FULL_DEVICE_NAME"))
        except Exception:
            return device

    def _missing_reason(self, seen: list[str]) -> str:
        family = self.device.split(".")[0]
        sees = f"OpenVINO sees: {', '.join(seen) or 'no device'}"
        if family not in _MISSING_DEVICE:
            return f"no OpenVINO {self.device} device ({sees})"
        runtime, packages, dev_node = _MISSING_DEVICE[family]
        if (sysroot() / dev_node.lstrip("/")).exists():  # the kernel driver is there, the runtime not
            why = f"{dev_node} is there but OpenVINO cannot use it: install {runtime} ({packages})"
        else:
            why = f"{runtime} ({packages}) is not installed or {dev_node} is missing"
        return f"no OpenVINO {family} device: {why} ({sees})"

    # --- supports --------------------------------------------------------------------------------

    def supports(self, artifact: ModelArtifact) -> Support:
        if artifact.format not in self.formats:
            return Support(
                False, f"{self.name} reads {', '.join(sorted(self.formats))}, not {artifact.format}"
            )
        try:
            model = _read_model(artifact)
        except Exception as exc:
            message = str(exc)
            ops = _ops_named_in(message)
            if not ops and artifact.format == "onnx" and artifact.path.is_file():
                ops = _onnx_unconverted_ops(artifact.path)
            reason = f"{self.name} cannot read {artifact.label}: {_ov_message(exc)}"
            if ops:
                reason += f"; unsupported operators: {', '.join(sorted(ops))}"
            return Support(False, reason, tuple(sorted(ops)))
        return self._query(model, artifact)

    def _query(self, model: ov.Model, artifact: ModelArtifact) -> Support:
        if self.device.split(".")[0] in _VIRTUAL_DEVICES:
            try:
                seen = _core().available_devices
            except Exception as exc:
                return Support(False, f"{self.name}: OpenVINO cannot list devices: {_ov_message(exc)}")
            devices = [d for d in seen if d.split(".")[0] not in _VIRTUAL_DEVICES] or ["CPU"]
        else:
            devices = [self.device]
        results: list[tuple[str, list[str], str]] = []  # (device, unsupported op types, error)
        for device in devices:
            try:
                supported = _core().query_model(model, device)
            except Exception as exc:
                results.append((device, [], _ov_message(exc)))
                continue
            missing = sorted(
                {op.get_type_name() for op in model.get_ops() if op.get_friendly_name() not in supported}
            )
            if not missing:
                return Support(True)
            results.append((device, missing, ""))
        # No device runs it all: report the one that comes closest (errors count as worst).
        device, missing, error = min(results, key=lambda r: (bool(r[2]), len(r[1])))
        where = f"{self.name}" if device == self.device else f"{self.name} (on {device})"
        if error:
            return Support(False, f"{where} cannot check {artifact.label}: {error}")
        return Support(
            False,
            f"{where} cannot run {artifact.label}: unsupported operators: {', '.join(missing)}",
            tuple(missing),
        )

    # --- load ------------------------------------------------------------------------------------

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        opts = parse_options(OpenVinoOptions, options, self.name)
        if artifact.format not in self.formats:
            raise BackendError(
                f"{self.name} cannot load {artifact.label}: it reads "
                f"{', '.join(sorted(self.formats))}, not {artifact.format}"
            )
        if opts.weights is not None and artifact.format != "openvino-ir":
            raise BackendError(f"{self.name}: option `weights` applies to openvino-ir artifacts only")
        config = self._config(opts)
        try:
            model = _read_model(artifact, opts.weights)
            compiled = _core().compile_model(model, self.device, config)
            if opts.cache_dir is not None:
                _cache_within_umask(Path(opts.cache_dir))
            names = _onnx_input_names(artifact, model) if artifact.format == "onnx" else None
            session = OpenVinoSession(model, compiled, self.name, self.device, names)
            session.precision = computes_in(artifact, session.precision)
            return session
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"{self.name} cannot load {artifact.label}: {_ov_message(exc)}") from exc

    def _config(self, opts: OpenVinoOptions) -> dict[str, Any]:
        family = self.device.split(".")[0]
        config: dict[str, Any] = {"PERFORMANCE_HINT": opts.hint.upper()}
        if opts.precision != "auto":
            config["INFERENCE_PRECISION_HINT"] = opts.precision
        if opts.num_streams is not None:
            config["NUM_STREAMS"] = opts.num_streams
        if opts.threads is not None:
            if family == "CPU":
                config["INFERENCE_NUM_THREADS"] = opts.threads
            elif family == "AUTO":  # only the CPU takes a thread count; AUTO may pick another device
                config["DEVICE_PROPERTIES"] = {"CPU": {"INFERENCE_NUM_THREADS": opts.threads}}
            else:
                raise BackendError(f"{self.name}: option `threads` applies to the CPU only")
        if opts.cache_dir is not None:
            Path(opts.cache_dir).mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = opts.cache_dir
        return config


def _cache_within_umask(cache_dir: Path) -> None:
    """OpenVINO gives the blobs it caches a mode of its own (0440), whatever the umask: take away what
    the umask forbids (the daemon's 077 keeps its state dir owner-only). Linux: the umask is read from
    /proc, so no other thread's files are created under a changed one."""
    try:
        status = Path("/proc/self/status").read_text()
        mask = next(int(line.split()[1], 8) for line in status.splitlines() if line.startswith("Umask:"))
        for path in cache_dir.iterdir():
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode) and mode & mask:
                os.chmod(path, stat.S_IMODE(mode) & ~mask)
    except (OSError, ValueError, StopIteration):
        pass  # not Linux, or the cache changed meanwhile: the next load tries again


def discover() -> list[Backend]:
    """One backend per device OpenVINO sees, plus AUTO, plus NPU and GPU when missing (to say why)."""
    try:
        seen = [d for d in _core().available_devices if d.split(".")[0] not in _VIRTUAL_DEVICES]
    except Exception:
        seen = []  # each backend's probe() reports the error
    devices = list(seen)
    for family in ("GPU", "NPU"):
        if not any(d.split(".")[0] == family for d in seen):
            devices.append(family)
    if "CPU" not in devices:
        devices.insert(0, "CPU")
    devices.append("AUTO")
    return [OpenVinoBackend(device) for device in devices]
