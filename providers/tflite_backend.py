"""TFLite / LiteRT: "tflite/cpu" (builtin kernels, XNNPACK) and "tflite/edgetpu" (the Coral delegate).

The interpreter comes from `ai_edge_litert.interpreter` (LiteRT), else from the legacy
`tflite_runtime.interpreter`. Both are imported lazily, inside functions, so a missing or broken
package becomes a probe reason. Importing is not proof: tflite-runtime 2.14 imports under numpy 2 and
only fails when an Interpreter is built ("_ARRAY_API not found"). So a source counts only after it has
built, allocated and run a tiny model that this module writes in code (`tiny_model()`: y = x + x), and
the first source that passes is the one every load uses. The result is cached per process.

"tflite/edgetpu" needs the Edge TPU runtime (libedgetpu.so.1) and a Coral it can open; it only runs
models compiled by `edgetpu_compiler` (`*_edgetpu.tflite`), whose graph is one "edgetpu-custom-op".
"tflite/cpu" refuses those, since it has no kernel for that op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib
import importlib.metadata
import mmap
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from providers.base import (
    Backend,
    BackendError,
    ModelArtifact,
    ProbeResult,
    Session,
    Support,
    TensorSpec,
    one_line,
    parse_options,
)
from providers.native_stderr import captured_stderr
from providers.options import EdgeTpuOptions, TfliteOptions

# (interpreter module, distribution that ships it), in order of preference.
_SOURCES = (
    ("ai_edge_litert.interpreter", "ai-edge-litert"),
    ("tflite_runtime.interpreter", "tflite-runtime"),
)
EDGETPU_OP = "edgetpu-custom-op"
_EDGETPU_LIBRARY = "libedgetpu.so.1"
_EDGETPU_PATHS = ("/usr/lib/*/libedgetpu.so.1", "/usr/lib/libedgetpu.so.1", "/usr/local/lib/libedgetpu.so.1")
_EDGETPU_MISSING = "Edge TPU runtime libedgetpu not installed (apt-get install libedgetpu1-std)"
_DEVICES = ("cpu", "edgetpu")
# What the runtime prints to stderr on its first interpreter in a process, with no switch to turn it
# off: the probe's (_check_interpreter, which every load comes after) is captured, and the line dropped.
_RUNTIME_NOISE = re.compile(rb"INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.\s*$")

# How LiteRT names an operator it has no kernel for.
_UNSUPPORTED_OP_PATTERNS = (
    re.compile(r"unresolved custom op: (\S+?)\.?(?:\s|$)"),
    re.compile(r"Didn't find op for builtin opcode '([^']+)'"),
    re.compile(r"Node number \d+ \((Flex\w+)\) failed to prepare"),
)


# --- the probe model ---------------------------------------------------------------------------------
# A TFLite model is a FlatBuffer. The smallest valid one is a few hundred bytes, so it is written here
# rather than shipped as a file. Field numbers are those of tensorflow/lite/schema/schema.fbs (the tests
# decode the result with the schema module LiteRT ships). `_Table` fields: (field number, kind, value);
# kinds: "u8", "i32", "u32" (scalars), "str", "ints" (vector of int32), "table", "tables".

_Table = list[tuple[int, str, Any]]
_SCALARS = {"u8": "<B", "i32": "<i", "u32": "<I"}


def _flatbuffer(root: _Table, identifier: bytes) -> bytes:
    """Serialise front to back: each table's vtable, then the table, then what its fields point to."""
    buf = bytearray(4) + identifier

    def pad(alignment: int) -> None:
        buf.extend(bytes(-len(buf) % alignment))

    def link(slot: int, target: int) -> None:  # a uoffset is relative to where it is stored
        struct.pack_into("<I", buf, slot, target - slot)

    def table(fields: _Table) -> int:
        layout: list[tuple[int, str, Any, int]] = []
        size = 4  # the table starts with the soffset to its vtable
        for number, kind, value in fields:
            width = struct.calcsize(_SCALARS[kind]) if kind in _SCALARS else 4
            size += -size % width
            layout.append((number, kind, value, size))
            size += width
        slots = [0] * (max((f[0] for f in fields), default=-1) + 1)
        for number, _, _, at in layout:
            slots[number] = at
        pad(2)
        vtable = len(buf)
        buf.extend(struct.pack(f"<HH{len(slots)}H", 4 + 2 * len(slots), size, *slots))
        pad(4)
        start = len(buf)
        buf.extend(struct.pack("<i", start - vtable) + bytes(size - 4))
        for _, kind, value, at in layout:
            if kind in _SCALARS:
                struct.pack_into(_SCALARS[kind], buf, start + at, value)
        for _, kind, value, at in layout:
            if kind not in _SCALARS:
                link(start + at, child(kind, value))
        return start

    def child(kind: str, value: Any) -> int:
        if kind == "table":
            return table(value)
        pad(4)
        start = len(buf)
        if kind == "str":
            data = value.encode()
            buf.extend(struct.pack("<I", len(data)) + data + b"\0")
        elif kind == "ints":
            buf.extend(struct.pack(f"<I{len(value)}i", len(value), *value))
        elif kind == "tables":
            buf.extend(struct.pack("<I", len(value)) + bytes(4 * len(value)))
            for i, item in enumerate(value):
                link(start + 4 + 4 * i, table(item))
        else:
            raise ValueError(f"unknown flatbuffer field kind {kind!r}")
        return start

    link(0, table(root))
    pad(4)
    return bytes(buf)


@functools.lru_cache(maxsize=1)
def tiny_model() -> bytes:
    """A minimal valid TFLite model: y = x + x on float32[2], one ADD operator, no weights."""
    tensor = [(0, "ints", [2]), (1, "u8", 0), (2, "u32", 0)]  # shape [2], FLOAT32, buffer 0 (none)
    subgraph = [
        (0, "tables", [[*tensor, (3, "str", "x")], [*tensor, (3, "str", "y")]]),
        (1, "ints", [0]),
        (2, "ints", [1]),
        (3, "tables", [[(0, "u32", 0), (1, "ints", [0, 0]), (2, "ints", [1])]]),  # ADD(x, x) -> y
        (4, "str", "main"),
    ]
    model = [
        (0, "u32", 3),  # schema version
        (1, "tables", [[(0, "u8", 0), (2, "i32", 1), (3, "i32", 0)]]),  # operator code: ADD, version 1
        (2, "tables", [subgraph]),
        (3, "str", "edge-agent tflite probe"),
        (4, "tables", [[]]),  # buffer 0: the empty buffer every model starts with
    ]
    return _flatbuffer(model, b"TFL3")


# --- finding a working interpreter ---------------------------------------------------------------------


class _Runtime:
    """The interpreter module that passed the probe (or why none did), with its version."""

    def __init__(self, module: Any, package: str, version: str, reason: str) -> None:
        self.module = module
        self.package = package
        self.version = version
        self.reason = reason

    @property
    def versions(self) -> dict[str, str]:
        found = {self.package: self.version} if self.module is not None else {}
        return {**found, "numpy": np.__version__}


def _check_interpreter(module: Any) -> None:
    """Build, allocate and run the probe model; raise when any step fails or computes wrong."""
    interpreter = module.Interpreter(model_content=tiny_model(), num_threads=1)
    with captured_stderr(_RUNTIME_NOISE.match):
        interpreter.allocate_tensors()
    [inp] = interpreter.get_input_details()
    [out] = interpreter.get_output_details()
    interpreter.set_tensor(inp["index"], np.array([1.5, -2.0], dtype=np.float32))
    interpreter.invoke()
    y = interpreter.get_tensor(out["index"])
    if y.tolist() != [3.0, -4.0]:
        raise RuntimeError(f"the probe model computed {y.tolist()} for x + x with x = [1.5, -2.0]")


def _version(package: str, module_name: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        top = importlib.import_module(module_name.partition(".")[0])
        return str(getattr(top, "__version__", "unknown"))


@functools.lru_cache(maxsize=1)
def _runtime() -> _Runtime:
    failures = []
    for module_name, package in _SOURCES:
        try:
            module = importlib.import_module(module_name)
            _check_interpreter(module)
            return _Runtime(module, package, _version(package, module_name), "")
        except ModuleNotFoundError as exc:
            missing = exc.name and module_name.startswith(exc.name)
            failures.append(f"{package}: {'not installed' if missing else one_line(exc)}")
        except Exception as exc:  # numpy ABI errors, a broken wheel, a probe model that computes wrong
            failures.append(f"{package}: cannot build an Interpreter: {type(exc).__name__}: {one_line(exc)}")
    reason = f"no working TFLite interpreter ({'; '.join(failures)}); pip install ai-edge-litert"
    return _Runtime(None, "", "", reason)


# --- the Edge TPU --------------------------------------------------------------------------------------


def find_libedgetpu() -> str | None:
    """Where the Edge TPU runtime is: a name the dynamic loader resolves, or a path; None if absent."""
    found = ctypes.util.find_library("edgetpu")  # the soname, e.g. "libedgetpu.so.1", via ldconfig
    if found:
        return found
    files = edgetpu_library_files()
    return files[0] if files else None


def edgetpu_library_files() -> list[str]:
    """The Edge TPU runtime's files in the usual places, found without running ldconfig (which
    find_libedgetpu does, in a child process)."""
    return [hit for pattern in _EDGETPU_PATHS for hit in sorted(glob.glob(pattern))]


def _load_edgetpu_delegate(module: Any, library: str, device: str | None) -> Any:
    """The Edge TPU delegate, or an exception saying why not (library unusable, no device)."""
    try:
        plugin = ctypes.CDLL(library)
    except OSError as exc:
        raise RuntimeError(f"cannot load {library}: {one_line(exc)}") from exc
    if not hasattr(plugin, "tflite_plugin_create_delegate"):
        raise RuntimeError(f"{library} is not a TFLite delegate library (no tflite_plugin_create_delegate)")
    try:
        return module.load_delegate(library, {"device": device} if device else None)
    except Exception as exc:
        raise RuntimeError(
            f"libedgetpu is installed ({library}) but no Edge TPU{' ' + device if device else ''} "
            f"could be opened (is a Coral attached?): {one_line(exc)}"
        ) from exc


def custom_ops(path: Path) -> tuple[str, ...]:
    """The custom operator names a .tflite file declares (Model.operator_codes[].custom_code).

    Reads only those few fields of the flatbuffer, through a memory map, so it is cheap on big models.
    A file that is not a well-formed model declares none; building an Interpreter reports what is wrong.
    """
    if path.stat().st_size < 8:
        return ()
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            return _read_custom_ops(data)
        except (struct.error, ValueError, UnicodeDecodeError):
            return ()


def _read_custom_ops(data: mmap.mmap) -> tuple[str, ...]:
    def read(fmt: str, at: int) -> int:
        if at < 0 or at + struct.calcsize(fmt) > len(data):
            raise ValueError("offset outside the file")
        value: int = struct.unpack_from(fmt, data, at)[0]
        return value

    def field(table: int, number: int) -> int | None:  # where a table's field is stored, if present
        vtable = table - read("<i", table)
        if 4 + 2 * number >= read("<H", vtable):
            return None
        offset = read("<H", vtable + 4 + 2 * number)
        return table + offset if offset else None

    def target(at: int) -> int:  # follow a uoffset
        return at + read("<I", at)

    model = target(0)
    codes = field(model, 1)  # Model.operator_codes
    if codes is None:
        return ()
    vector = target(codes)
    names = []
    for i in range(min(read("<I", vector), 100_000)):
        name = field(target(vector + 4 + 4 * i), 1)  # OperatorCode.custom_code
        if name is not None:
            string = target(name)
            size = read("<I", string)
            if string + 4 + size > len(data):
                raise ValueError("string outside the file")
            names.append(bytes(data[string + 4 : string + 4 + size]).decode())
    return tuple(names)


def is_edgetpu_model(path: Path) -> bool:
    """Whether a .tflite file was compiled for the Edge TPU: it declares the custom op "edgetpu-custom-op"."""
    return EDGETPU_OP in custom_ops(path)


@functools.cache
def _probe(device: str) -> ProbeResult:
    name = f"tflite/{device}"
    runtime = _runtime()
    if runtime.module is None:
        return ProbeResult(name, False, runtime.reason, runtime.versions)
    if device == "cpu":
        return ProbeResult(name, True, "ok", runtime.versions, devices=("cpu",))
    library = find_libedgetpu()
    if library is None:
        return ProbeResult(name, False, _EDGETPU_MISSING, runtime.versions)
    try:
        delegate = _load_edgetpu_delegate(runtime.module, library, None)
    except Exception as exc:
        return ProbeResult(name, False, str(exc), runtime.versions)
    del delegate  # the probe only checks that a device opens; each load opens its own
    return ProbeResult(name, True, "ok", {**runtime.versions, "libedgetpu": library}, devices=("edgetpu",))


def clear_probe_cache() -> None:
    """Forget the cached probe results (a Coral plugged in later, tests)."""
    _probe.cache_clear()
    _runtime.cache_clear()


# --- the session ---------------------------------------------------------------------------------------


def _spec(detail: Mapping[str, Any]) -> TensorSpec:
    signature = detail.get("shape_signature")
    dims = signature if signature is not None and len(signature) else detail["shape"]
    shape = tuple(int(d) if d >= 0 else None for d in dims)
    scale, zero_point = detail.get("quantization") or (0.0, 0)
    quantization = (float(scale), int(zero_point)) if scale else None  # scale 0: not quantised
    return TensorSpec(str(detail["name"]), shape, np.dtype(detail["dtype"]).name, quantization)


def _precision(interpreter: Any, inputs: list[Mapping[str, Any]]) -> str:
    """What the kernels compute in, decided from tensor types.

    "int8": any int8/uint8 tensor carries quantisation parameters (full-integer, Edge TPU and
    dynamic-range quantised models). "fp16": a float16 tensor carries data computed from the model's
    inputs (an activation: reachable from an input through the operators, in execution order).
    Otherwise "fp32", including models that only store weights as float16 and DEQUANTIZE (or DENSIFY,
    then DEQUANTIZE) them, like MediaPipe's BlazeFace: the weights are constants, converted once, and
    LiteRT's CPU kernels and XNNPACK (without its opt-in fp16 flag) compute in float32.
    """
    tensors = interpreter.get_tensor_details()
    for tensor in tensors:
        scales = tensor.get("quantization_parameters", {}).get("scales", ())
        if np.dtype(tensor["dtype"]) in (np.int8, np.uint8) and len(scales):
            return "int8"
    half = {int(t["index"]) for t in tensors if np.dtype(t["dtype"]) == np.float16}
    reached = {int(d["index"]) for d in inputs}
    ops = getattr(interpreter, "_get_ops_details", None)  # absent from some old tflite-runtime builds
    for op in ops() if half and ops is not None else ():
        if op.get("op_name") == "DELEGATE":
            continue  # a delegate node stands for ops listed already, and takes all their weights
        if reached.intersection(int(i) for i in op.get("inputs", ())):
            reached.update(int(i) for i in op.get("outputs", ()))
    return "fp16" if half & reached else "fp32"


class TfliteSession(Session):
    """One Interpreter, reused for every run.

    One caller at a time: the interpreter's tensors are shared state between set_tensor, invoke and
    get_tensor. Outputs are copies, so they stay valid after the next run. Inputs whose model dimension is
    open (-1 in shape_signature) are resized to the fed shape; fixed dimensions must match.
    `quantization` maps each quantised input and output to (scale, zero_point): real = scale * (q - zp).
    """

    def __init__(self, interpreter: Any, backend: str, label: str, threads: int | None) -> None:
        self._interpreter: Any = interpreter
        self.backend = backend
        self.label = label
        self.threads = threads
        inputs = interpreter.get_input_details()
        outputs = interpreter.get_output_details()
        self._inputs = [_spec(d) for d in inputs]
        self._outputs = [_spec(d) for d in outputs]
        self._input_index = {str(d["name"]): int(d["index"]) for d in inputs}
        self._input_shape = {str(d["name"]): tuple(int(n) for n in d["shape"]) for d in inputs}
        self._output_index = [(str(d["name"]), int(d["index"])) for d in outputs]
        self.quantization: dict[str, tuple[float, int]] = {
            spec.name: spec.quantization for spec in [*self._inputs, *self._outputs] if spec.quantization
        }
        self.precision = _precision(interpreter, inputs)

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    def _fail(self, why: str) -> BackendError:
        return BackendError(f"{self.backend}: run on {self.label} failed: {why}")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._interpreter is None:
            raise self._fail("the session is closed")
        missing = [n for n in self._input_index if n not in feeds]
        unknown = [n for n in feeds if n not in self._input_index]
        if missing or unknown:
            raise self._fail(
                f"inputs missing {missing}, unknown {unknown} (the model's inputs: {list(self._input_index)})"
            )
        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        try:
            resized = False
            for spec in self._inputs:
                shape = arrays[spec.name].shape
                if shape == self._input_shape[spec.name]:
                    continue
                if len(shape) != len(spec.shape) or any(
                    d is not None and d != n for d, n in zip(spec.shape, shape, strict=True)
                ):
                    want = tuple(-1 if d is None else d for d in spec.shape)
                    raise self._fail(f"input {spec.name!r} has shape {shape}, the model takes {want}")
                self._interpreter.resize_tensor_input(self._input_index[spec.name], list(shape), strict=True)
                self._input_shape[spec.name] = shape
                resized = True
            if resized:
                self._interpreter.allocate_tensors()
            for name, array in arrays.items():
                self._interpreter.set_tensor(self._input_index[name], array)
            self._interpreter.invoke()
            # get_tensor returns a copy, not a view into the interpreter's arena.
            return {name: self._interpreter.get_tensor(index) for name, index in self._output_index}
        except BackendError:
            raise
        except Exception as exc:
            raise self._fail(one_line(exc)) from exc

    def close(self) -> None:
        self._interpreter = None  # the interpreter frees its arena (and releases its delegate) on GC


# --- the backends --------------------------------------------------------------------------------------


class TfliteBackend(Backend):
    """LiteRT on one device: "cpu" (builtin kernels) or "edgetpu" (the libedgetpu delegate)."""

    runtime = "tflite"
    formats = frozenset({"tflite"})
    options_model: type[TfliteOptions] = TfliteOptions

    def __init__(self, device: str = "cpu") -> None:
        if device not in _DEVICES:
            raise ValueError(f"unknown tflite device {device!r}; known: {', '.join(_DEVICES)}")
        self.device = device
        self.name = f"tflite/{device}"
        self.options_model = EdgeTpuOptions if device == "edgetpu" else TfliteOptions

    def probe(self) -> ProbeResult:
        try:
            return _probe(self.device)
        except Exception as exc:  # never raise: a surprise is a reason too
            return ProbeResult(self.name, False, f"probe failed: {type(exc).__name__}: {one_line(exc)}")

    def _refusal(self, artifact: ModelArtifact) -> Support | None:
        """Why this device cannot take the artifact before any interpreter is built; None when it may."""
        if artifact.format not in self.formats:
            return Support(False, f"{self.name} runs .tflite files, not {artifact.format}")
        try:
            compiled = is_edgetpu_model(artifact.path)
        except OSError as exc:
            return Support(False, f"{self.name} cannot read {artifact.label}: {one_line(exc)}")
        built_for_tpu = compiled or getattr(artifact, "target", "any") == "edgetpu"
        if self.device == "cpu" and built_for_tpu:
            why = f"{artifact.label} is compiled for the Edge TPU ({EDGETPU_OP}): only tflite/edgetpu runs it"
            return Support(False, why, (EDGETPU_OP,) if compiled else ())
        if self.device == "edgetpu" and not built_for_tpu:
            return Support(
                False,
                f"{artifact.label} is not compiled for the Edge TPU (no {EDGETPU_OP}; "
                "compile it with edgetpu_compiler, or run it on tflite/cpu)",
            )
        probe = self.probe()
        if not probe.available:
            return Support(False, f"{self.name} is not available: {probe.reason}")
        return None

    def supports(self, artifact: ModelArtifact) -> Support:
        """Format and device checks, then a real Interpreter build and allocate_tensors()."""
        refusal = self._refusal(artifact)
        if refusal is not None:
            return refusal
        try:
            self._open(artifact, self.options_model())
        except BackendError as exc:
            return Support(False, str(exc), _unsupported_ops(exc.__cause__))
        return Support(True)

    def load(self, artifact: ModelArtifact, options: Mapping[str, Any] | None = None) -> Session:
        parsed = parse_options(self.options_model, options, self.name)
        refusal = self._refusal(artifact)
        if refusal is not None:
            raise BackendError(f"{self.name} cannot load {artifact.label}: {refusal.reason}")
        interpreter = self._open(artifact, parsed)
        return TfliteSession(interpreter, self.name, artifact.label, parsed.threads)

    def _open(self, artifact: ModelArtifact, options: TfliteOptions) -> Any:
        """An allocated Interpreter for the artifact; BackendError (caused by the runtime's error) if not."""
        runtime = _runtime()
        try:
            delegates = []
            if self.device == "edgetpu":
                library = find_libedgetpu() or _EDGETPU_LIBRARY
                device = options.device if isinstance(options, EdgeTpuOptions) else None
                delegates.append(_load_edgetpu_delegate(runtime.module, library, device))
            interpreter = runtime.module.Interpreter(
                model_path=str(artifact.path),
                num_threads=options.threads,
                experimental_delegates=delegates or None,
            )
            interpreter.allocate_tensors()
        except Exception as exc:
            ops = _unsupported_ops(exc)
            why = one_line(exc)
            if ops:
                runtime_name = f"{runtime.package} {runtime.version}"
                why = f"unsupported operator {', '.join(ops)} (no kernel in {runtime_name})"
                # The runtime stops at the first op it cannot resolve; name the other custom ops too.
                others = [op for op in custom_ops(artifact.path) if op not in ops]
                if others:
                    why += f"; the model also uses custom ops {', '.join(others)}, not checked"
            raise BackendError(f"{self.name} cannot load {artifact.label}: {why}") from exc
        return interpreter


def discover() -> list[Backend]:
    """Both devices, available or not; probe() says which and why."""
    return [TfliteBackend(device) for device in _DEVICES]


def _unsupported_ops(exc: BaseException | None) -> tuple[str, ...]:
    """The operators a runtime error says have no kernel, in order of first mention."""
    text = str(exc) if exc is not None else ""
    found: list[str] = []
    for pattern in _UNSUPPORTED_OP_PATTERNS:
        for op in pattern.findall(text):
            if op not in found:
                found.append(op)
    return tuple(found)
