"""A real model made slower on purpose, for tests that judge speed: the trained model's graph with an
extra branch of matrix products on its input, multiplied by zero and added to its output, so the
outputs are the model's own and every run pays for the branch (nothing constant to fold away)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper


def slowed(model: Path, out: Path, size: int = 384, products: int = 4) -> Path:
    """`model` with `products` size x size matrix products added to each run (single input and
    output, float32)."""
    proto = onnx.load(str(model))
    graph = proto.graph
    source, output = graph.input[0].name, graph.output[0].name
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((size, size)) / size).astype(np.float32)  # values stay bounded
    graph.initializer.extend(
        [
            numpy_helper.from_array(weight, "slow_w"),
            numpy_helper.from_array(np.array([1, 1], np.int64), "slow_shape1"),
            numpy_helper.from_array(np.array([size, size], np.int64), "slow_shape"),
            numpy_helper.from_array(np.zeros((), np.float32), "slow_zero"),
        ]
    )
    nodes = [
        helper.make_node("ReduceMean", [source], ["slow_mean"], keepdims=0),
        helper.make_node("Reshape", ["slow_mean", "slow_shape1"], ["slow_m"]),
        helper.make_node("Expand", ["slow_m", "slow_shape"], ["slow_0"]),
    ]
    for i in range(products):
        nodes.append(helper.make_node("MatMul", [f"slow_{i}", "slow_w"], [f"slow_{i + 1}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"slow_{products}"], ["slow_sum"], keepdims=0),
        helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_nothing"]),
    ]
    # The model's output, renamed inside, plus the zero: same values, same name outside.
    inner = output + "_inner"
    for node in graph.node:
        node.output[:] = [inner if name == output else name for name in node.output]
    nodes.append(helper.make_node("Add", [inner, "slow_nothing"], [output]))
    graph.node.extend(nodes)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(out))
    return out
