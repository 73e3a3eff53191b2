"""A model file as its format describes it, read and never run: ONNX parsed with
`onnx.load(..., load_external_data=False)` (weights kept outside the file are named, not read), TFLite
through a LiteRT Interpreter that is built but never allocated, OpenVINO IR through
`Core.read_model(xml, bin)`, never compiled. `format_details` is also the check that a file is what
its name says (agent/tools/inventory.py resolve_model); `edge-agent models inspect`
(agent/tools/model_info.py) shows it.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import ModelError
from providers import ModelArtifact
from providers.base import one_line
from providers.openvino_backend import OV_ELEMENT_TYPES

Shape = list[int | str] | None  # None: the rank is unknown

# Where a TFLite interpreter comes from, in order of preference (as the tflite backend looks).
_TFLITE_MODULES = ("ai_edge_litert.interpreter", "tflite_runtime.interpreter")


def format_details(artifact: ModelArtifact, weights: Path | None) -> dict[str, Any]:
    """The format's own view of a model file; ModelError when it is not a valid one."""
    if artifact.format == "onnx":
        return onnx_details(artifact.path, artifact.label)
    if artifact.format == "tflite":
        return tflite_details(artifact.path, artifact.label)
    if artifact.format == "openvino-ir":
        return openvino_details(artifact.path, weights, artifact.label)
    raise ModelError(f"{artifact.label}: cannot inspect {artifact.format} files")


def _op_counts(ops: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """(op_type, domain) pairs -> counts, most frequent first (then by domain and name)."""
    counts = Counter(ops)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0][1], item[0][0]))
    return [{"op_type": op, "domain": domain, "count": n} for (op, domain), n in ordered]


# --- ONNX -------------------------------------------------------------------------------------------


def onnx_details(path: Path, label: str) -> dict[str, Any]:
    """An ONNX file's header, graph interface, operators, weights and metadata, without its
    external data (a file it names is listed under `external_data`, not read)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError, ...
        raise ModelError(f"{label} is not a valid ONNX model: {one_line(exc)}") from None
    if model.ir_version < 1 or not model.HasField("graph"):
        raise ModelError(f"{label} is not a valid ONNX model: no IR version or no graph in the file")
    graph = model.graph
    graphs = list(_graphs(graph))  # the main graph and the bodies of If/Loop/Scan nodes
    initializers = [t for g in graphs for t in g.initializer]
    sparse = [t for g in graphs for t in g.sparse_initializer]
    constants = [node for g in graphs for node in g.node if node.op_type == "Constant" and node.domain == ""]
    in_initializers = sum(_elements(t.dims) for t in initializers) + sum(_elements(t.dims) for t in sparse)
    in_constants = sum(_constant_elements(node) for node in constants)
    external = sorted(
        {
            entry.value
            for tensor in initializers
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )
    weights = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    return {
        "ir_version": model.ir_version,
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "domain": model.domain,
        "model_version": model.model_version,
        "doc_string": model.doc_string,
        "graph_name": graph.name,
        "opsets": {o.domain: o.version for o in model.opset_import},
        "inputs": [_onnx_value(v) for v in graph.input if v.name not in weights],
        "outputs": [_onnx_value(v) for v in graph.output],
        "nodes": sum(len(g.node) for g in graphs),
        "operators": _op_counts((node.op_type, node.domain) for g in graphs for node in g.node),
        "initializers": len(initializers) + len(sparse),
        "parameters": in_initializers + in_constants,
        "parameters_in_constants": in_constants,
        "external_data": external,
        "metadata_props": {p.key: p.value for p in model.metadata_props},
    }


def _graphs(graph: Any) -> Iterator[Any]:
    """A graph and, depth first, every subgraph its nodes hold (If branches, Loop and Scan bodies)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def _elements(dims: Iterable[int]) -> int:
    return int(np.prod(list(dims), dtype=np.int64))


def _constant_elements(node: Any) -> int:
    """How many values a Constant node holds (its `value` tensor, or a list or scalar attribute)."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return _elements(attribute.t.dims)
        if attribute.name == "sparse_value":
            return _elements(attribute.sparse_tensor.dims)
        if attribute.name in ("value_floats", "value_ints", "value_strings"):
            return len(attribute.floats) + len(attribute.ints) + len(attribute.strings)
        if attribute.name in ("value_float", "value_int", "value_string"):
            return 1
    return 0


def _onnx_value(value: Any) -> dict[str, Any]:
    dtype, shape = _onnx_type(value.type)
    return {"name": value.name, "dtype": dtype, "shape": shape}


def _onnx_type(type_proto: Any) -> tuple[str, Shape]:
    """(element type, shape) of a TypeProto; sequences, maps and optionals as their type text."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(type_proto, kind)
        dtype = _onnx_dtype(tensor.elem_type)
        if kind == "sparse_tensor_type":
            dtype = f"sparse {dtype}"
        if not tensor.HasField("shape"):
            return dtype, None
        return dtype, [_onnx_dim(dim) for dim in tensor.shape.dim]
    if kind == "sequence_type":
        inner, shape = _onnx_type(type_proto.sequence_type.elem_type)
        return f"sequence<{inner}{_shape_suffix(shape)}>", None
    if kind == "optional_type":
        inner, shape = _onnx_type(type_proto.optional_type.elem_type)
        return f"optional<{inner}>", shape
    if kind == "map_type":
        key = _onnx_dtype(type_proto.map_type.key_type)
        inner, shape = _onnx_type(type_proto.map_type.value_type)
        return f"map<{key}, {inner}{_shape_suffix(shape)}>", None
    return "unknown", None


def _shape_suffix(shape: Shape) -> str:
    return "" if shape is None else " " + format_shape(shape)


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    if elem_type == onnx.TensorProto.UNDEFINED:
        return "undefined"
    if elem_type == onnx.TensorProto.STRING:
        return "str"
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name)
    except (KeyError, TypeError, ValueError):
        try:
            return str(onnx.TensorProto.DataType.Name(elem_type)).lower()
        except ValueError:
            return f"type {elem_type}"


def _onnx_dim(dim: Any) -> int | str:
    """A dimension: its size, its symbolic name, or "?" (exporters write -1 for unknown too)."""
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        return int(dim.dim_value)
    if dim.HasField("dim_param") and dim.dim_param:
        return str(dim.dim_param)
    return "?"


def format_shape(shape: Shape) -> str:
    """[1, 3, "height", "?"] -> "[1, 3, height, ?]"; None (unknown rank) -> "?"."""
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


# --- TFLite -----------------------------------------------------------------------------------------


def tflite_details(path: Path, label: str) -> dict[str, Any]:
    """A .tflite file's inputs and outputs (with quantisation) and operators, from a LiteRT
    Interpreter that is built, not allocated nor invoked."""
    module, package = _tflite_module()
    try:
        interpreter = module.Interpreter(model_path=str(path))
        inputs = [_tflite_tensor(t) for t in interpreter.get_input_details()]
        outputs = [_tflite_tensor(t) for t in interpreter.get_output_details()]
    except Exception as exc:  # ValueError for a file that is no TFLite model, RuntimeError, ...
        raise ModelError(f"{label} is not a valid TFLite model: {one_line(exc)}") from None
    operators: list[dict[str, Any]] = []
    note = None
    ops_details = getattr(interpreter, "_get_ops_details", None)
    if ops_details is None:
        note = f"operators not listed: {package} has no Interpreter._get_ops_details()"
    else:
        try:
            operators = _op_counts((str(op["op_name"]), "") for op in ops_details())
        except Exception as exc:
            note = f"operators not listed: {package} could not list them: {one_line(exc)}"
    try:
        signatures = sorted(interpreter.get_signature_list())
    except Exception:  # an old runtime without signatures
        signatures = []
    return {
        "runtime": package,
        "inputs": inputs,
        "outputs": outputs,
        "operators": operators,
        "operators_note": note,
        "signatures": signatures,
    }


def _tflite_module() -> tuple[Any, str]:
    failures = []
    for name in _TFLITE_MODULES:
        try:
            return importlib.import_module(name), name.partition(".")[0]
        except ImportError as exc:
            failures.append(f"{name}: {one_line(exc)}")
    raise ModelError(
        f"cannot read TFLite files: no TFLite interpreter ({'; '.join(failures)})",
        hint="pip install ai-edge-litert",
    )


def _tflite_tensor(details: dict[str, Any]) -> dict[str, Any]:
    # shape_signature keeps a dynamic dimension as -1 (shape says 1 for it); older runtimes lack it
    shape = details.get("shape_signature")
    if shape is None:
        shape = details["shape"]
    entry: dict[str, Any] = {
        "name": str(details["name"]),
        "dtype": np.dtype(details["dtype"]).name,
        "shape": [int(d) if d >= 0 else "?" for d in shape],
        "quantization": None,
    }
    params = details.get("quantization_parameters") or {}
    scales = np.asarray(params.get("scales", []), dtype=np.float64)
    if scales.size:
        entry["quantization"] = {
            "scales": [float(s) for s in scales],
            "zero_points": [int(z) for z in np.asarray(params.get("zero_points", []))],
            "quantized_dimension": int(params.get("quantized_dimension", 0)),
        }
    return entry


# --- OpenVINO IR ------------------------------------------------------------------------------------


def openvino_details(xml: Path, weights: Path | None, label: str) -> dict[str, Any]:
    """An OpenVINO IR's inputs, outputs, operators (type and opset) and weights count, read with
    Core.read_model(xml, bin): nothing is compiled."""
    if weights is None or not weights.is_file():
        where = f" ({weights} does not exist)" if weights is not None else ""
        raise ModelError(f"{label}: the OpenVINO IR weights (.bin) are missing{where}")
    try:
        import openvino as ov

        model = ov.Core().read_model(str(xml), str(weights))
        ops = list(model.get_ordered_ops())
        operators = _op_counts((op.get_type_name(), str(op.get_type_info().version_id)) for op in ops)
        parameters = sum(
            _elements(op.get_output_partial_shape(0).to_shape())
            for op in ops
            if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).is_static
        )
        inputs = [_ov_port(port, i, "input") for i, port in enumerate(model.inputs)]
        outputs = [_ov_port(port, i, "output") for i, port in enumerate(model.outputs)]
        name = model.get_friendly_name()
    except ImportError as exc:
        raise ModelError(f"cannot read {label}: openvino is not installed ({one_line(exc)})") from None
    except Exception as exc:
        raise ModelError(f"{label} is not a valid OpenVINO IR: {one_line(exc)}") from None
    return {
        "name": name,
        "weights": weights.name,
        "inputs": inputs,
        "outputs": outputs,
        "nodes": len(ops),
        "operators": operators,
        "parameters": parameters,
    }


def _ov_port(port: Any, index: int, kind: str) -> dict[str, Any]:
    names = sorted(port.get_names())
    shape = port.get_partial_shape()
    dims: Shape = None
    if not shape.rank.is_dynamic:
        dims = [dim.get_length() if dim.is_static else str(dim) for dim in shape]
    type_name = port.get_element_type().get_type_name()
    return {
        "name": port.get_any_name() if names else f"{kind}_{index}",
        "names": names,
        "dtype": OV_ELEMENT_TYPES.get(type_name, type_name),
        "shape": dims,
    }
