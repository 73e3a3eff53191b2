"""TFLite models written for the tests with LiteRT's own schema (tests/test_tflite_backend.py,
test_models_inspect.py): one operator over given tensors, and what edgetpu_compiler emits minus its
compiled payload."""

from __future__ import annotations

from pathlib import Path

import flatbuffers
from ai_edge_litert import schema_py_generated as schema

from providers.tflite_backend import EDGETPU_OP


def tflite_tensor(
    name: str,
    shape: list[int],
    dtype: int = schema.TensorType.FLOAT32,
    signature: list[int] | None = None,
    quant: tuple[float, int] | None = None,
) -> schema.TensorT:
    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type, tensor.buffer = name, shape, dtype, 0
    tensor.shapeSignature = signature
    if quant is not None:
        tensor.quantization = schema.QuantizationParametersT()
        tensor.quantization.scale, tensor.quantization.zeroPoint = [quant[0]], [quant[1]]
    return tensor


def one_op_model(
    path: Path, op: int, inputs: list[schema.TensorT], output: schema.TensorT, custom: str = ""
) -> Path:
    """A model whose graph is one operator reading every input (ADD reads its single input twice)."""
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = op
    code.version = 1
    code.customCode = custom or None
    operator = schema.OperatorT()
    operator.opcodeIndex = 0
    operator.inputs = [0, 0] if op == schema.BuiltinOperator.ADD else list(range(len(inputs)))
    operator.outputs = [len(inputs)]
    subgraph = schema.SubGraphT()
    subgraph.tensors = [*inputs, output]
    subgraph.inputs, subgraph.outputs = list(range(len(inputs))), [len(inputs)]
    subgraph.operators = [operator]
    model = schema.ModelT()
    model.version, model.operatorCodes, model.subgraphs = 3, [code], [subgraph]
    model.buffers = [schema.BufferT()]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))
    return path


def edgetpu_model(tmp_path: Path) -> Path:
    """What edgetpu_compiler emits, minus its compiled payload: uint8 in and out, one edgetpu-custom-op."""
    return one_op_model(
        tmp_path / "detector_edgetpu.tflite",
        schema.BuiltinOperator.CUSTOM,
        [tflite_tensor("image", [1, 4], schema.TensorType.UINT8, quant=(1 / 255, 0))],
        tflite_tensor("scores", [1, 2], schema.TensorType.UINT8, quant=(1 / 256, 0)),
        custom=EDGETPU_OP,
    )
