"""`edge-agent models inspect MODEL`: what is inside a model file or an installed version, read
without running it (agent/tools/model_info.py), on real models: the PP-OCR cls and rec ONNX models,
mediapipe's BlazeFace .tflite, an OpenVINO IR converted from the cls model, and a store version
published with test data. Every number asserted is first computed here, independently (onnx protos,
the TFLite flatbuffer schema, the IR's XML), not by the code under test."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from ai_edge_litert import schema_py_generated as schema
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from agent.cli import app
from agent.config import TrustedKey
from agent.registry import FileRegistry, PublishOptions
from agent.registry.signing import TrustPolicy, generate_key, load_private_key
from agent.store import ModelStore
from agent.tools.model_info import inspect_model
from tests.store_fixtures import CLS_NAME, CLS_VERSION, rapidocr_models_dir
from tests.tflite_models import edgetpu_model

CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"  # the cls model's one output: [batch, 2] probabilities
MEDIAPIPE = Path(importlib.util.find_spec("mediapipe").submodule_search_locations[0]) / "modules"  # type: ignore[union-attr,index]
FACE_DETECTOR = MEDIAPIPE / "face_detection/face_detection_short_range.tflite"
METADATA = {"labels": ["0", "180"], "source": "PaddleOCR v2.0 direction classifier"}


def _inspect(*args: str) -> tuple[int, str, str]:
    """Run `edge-agent models inspect ARGS` in process: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(app, ["models", "inspect", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def _inspect_json(*args: str) -> dict[str, Any]:
    code, out, err = _inspect(*args, "--json")
    assert code == 0, out + err
    data: dict[str, Any] = json.loads(out)
    return data


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- what onnx itself says about a model (the oracle for the ONNX tests) -------------------------------


def _onnx_dims(value: onnx.ValueInfoProto) -> list[int | str]:
    """-1 and an empty dim are unknown ("?"); a dim_param is shown by its name."""
    dims: list[int | str] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        elif dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(dim.dim_value)
        else:
            dims.append("?")
    return dims


def _onnx_facts(path: Path) -> dict[str, Any]:
    model = onnx.load(str(path))
    ops = Counter((node.op_type, node.domain) for node in model.graph.node)
    constants = sum(
        numpy_helper.to_array(attr.t).size
        for node in model.graph.node
        if node.op_type == "Constant"
        for attr in node.attribute
        if attr.name == "value"
    )
    initializers = sum(numpy_helper.to_array(t).size for t in model.graph.initializer)
    return {"model": model, "ops": ops, "constants": constants, "initializers": initializers}


def _ops_by_key(operators: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    counts = [op["count"] for op in operators]
    assert counts == sorted(counts, reverse=True), "operators must come most frequent first"
    return {(op["op_type"], op["domain"]): op["count"] for op in operators}


# --- ONNX files ------------------------------------------------------------------------------------------


def test_an_onnx_file_shows_its_header_interface_operators_and_weights(cls_model_path: Path) -> None:
    facts = _onnx_facts(cls_model_path)
    model = facts["model"]
    info = _inspect_json(str(cls_model_path))
    assert info["model"] == str(cls_model_path) and info["version"] is None and info["test_sets"] == []
    [m] = info["models"]
    assert (m["file"], m["format"]) == (cls_model_path.name, "onnx")
    assert (m["size"], m["sha256"]) == (cls_model_path.stat().st_size, _sha(cls_model_path))
    assert len(m["sha256"]) == 64  # full in --json
    assert (
        (m["ir_version"], m["producer_name"])
        == (model.ir_version, model.producer_name)
        == (7, "PaddlePaddle")
    )
    assert m["opsets"] == {o.domain: o.version for o in model.opset_import} == {"": 11}
    # x is [-1, 3, "?", "?"] in the file: Paddle's -1 and the dim named "?" both read as unknown.
    assert m["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["?", 3, "?", "?"]}]
    assert [_onnx_dims(v) for v in model.graph.input] == [["?", 3, "?", "?"]]
    assert m["outputs"] == [{"name": CLS_OUTPUT, "dtype": "float32", "shape": ["?", 2]}]
    assert _ops_by_key(m["operators"]) == dict(facts["ops"])
    assert m["operators"][0] == {"op_type": "Constant", "domain": "", "count": facts["ops"][("Constant", "")]}
    assert m["nodes"] == len(model.graph.node) == sum(facts["ops"].values())
    # Paddle stores the weights in Constant nodes, not initializers: both count as parameters.
    assert m["initializers"] == len(model.graph.initializer) == 0
    assert m["parameters"] == m["parameters_in_constants"] == facts["constants"] > 100_000
    assert m["metadata_props"] == {} and m["external_data"] == []


def test_the_onnx_table_shows_the_same_facts(cls_model_path: Path) -> None:
    code, out, _err = _inspect(str(cls_model_path))
    assert code == 0, out
    facts = _onnx_facts(cls_model_path)
    assert f"sha256 {_sha(cls_model_path)[:16]}" in out
    assert "ir_version 7, producer PaddlePaddle, opsets ai.onnx 11" in out
    assert f"{facts['constants']:,} parameters" in out
    assert "[?, 3, ?, ?]" in out and "float32" in out
    for (op, _domain), count in facts["ops"].items():
        assert any(op in line and f" {count} " in line for line in out.splitlines()), (op, count)


def test_a_real_models_metadata_props_are_whole_in_json_and_cut_in_the_table() -> None:
    rec = rapidocr_models_dir() / "ch_PP-OCRv4_rec_infer.onnx"
    model = onnx.load(str(rec), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    assert list(props) == ["character"] and len(props["character"]) > 10_000  # the recogniser's alphabet
    [m] = _inspect_json(str(rec))["models"]
    assert m["metadata_props"] == props
    # Symbolic dimensions are shown by name.
    assert m["inputs"] == [{"name": "x", "dtype": "float32", "shape": _onnx_dims(model.graph.input[0])}]
    assert m["inputs"][0]["shape"][0] == "p2o.DynamicDimension.0"
    code, out, _err = _inspect(str(rec))
    assert code == 0
    assert "metadata_props" in out and "character" in out and "…" in out
    assert props["character"] not in out and len(out) < 30_000


def _small_model(path: Path) -> Path:
    """y = relu(x @ W + b), W and b initializers (W also a graph input, as IR 3 exporters wrote),
    an If whose branches hold Constant nodes, and metadata_props set with set_model_props."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    b = numpy_helper.from_array(np.ones(3, dtype=np.float32), "b")
    then_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.zeros(10, np.float32)))],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [10])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value_floats=[1.0, 2.0, 3.0])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
            helper.make_node("If", ["flag"], ["branch"], then_branch=then_graph, else_branch=else_graph),
        ],
        "small",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("branch", TensorProto.FLOAT, [None]),
        ],
        initializer=[w, b],
    )
    model = helper.make_model(
        graph,
        producer_name="edge-agent-tests",
        producer_version="1.0",
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
    )
    helper.set_model_props(model, {"author": "tests", "classes": ",".join(f"class{i}" for i in range(80))})
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_metadata_props_initializers_and_subgraphs(tmp_path: Path) -> None:
    path = _small_model(tmp_path / "small.onnx")
    model = onnx.load(str(path))
    [m] = _inspect_json(str(path))["models"]
    assert m["metadata_props"] == {p.key: p.value for p in model.metadata_props}
    assert len(m["metadata_props"]["classes"]) > 500
    assert (m["producer_name"], m["producer_version"]) == ("edge-agent-tests", "1.0")
    assert m["opsets"] == {"": 17, "ai.onnx.ml": 3}
    # W is an initializer: not an input a caller feeds.
    assert m["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": ["batch", 4]},
        {"name": "flag", "dtype": "bool", "shape": []},
    ]
    assert m["outputs"] == [
        {"name": "y", "dtype": "float32", "shape": ["batch", 3]},
        {"name": "branch", "dtype": "float32", "shape": ["?"]},  # a dim of unknown size
    ]
    # Operators and weights inside the If's branches count too.
    assert _ops_by_key(m["operators"]) == {
        ("Constant", ""): 2,
        ("MatMul", ""): 1,
        ("Add", ""): 1,
        ("Relu", ""): 1,
        ("If", ""): 1,
    }
    assert m["operators"][0]["op_type"] == "Constant" and m["nodes"] == 6
    assert m["initializers"] == 2
    assert m["parameters_in_constants"] == 10 + 3
    assert m["parameters"] == 4 * 3 + 3 + 10 + 3
    code, out, _err = _inspect(str(path))
    assert code == 0
    assert "author" in out and "tests" in out and "classes" in out and "class0,class1" in out
    assert m["metadata_props"]["classes"] not in out and "…" in out
    assert "[batch, 4]" in out


# --- TFLite -------------------------------------------------------------------------------------------


def _tflite_ops(path: Path) -> Counter[str]:
    """Operator counts read from the flatbuffer with LiteRT's schema module (no interpreter)."""
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    counts: Counter[str] = Counter()
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            counts[code.customCode.decode() if code.customCode else names[builtin]] += 1
    return counts


def test_a_tflite_file_shows_inputs_outputs_and_operators() -> None:
    info = _inspect_json(str(FACE_DETECTOR))
    [m] = info["models"]
    assert (m["file"], m["format"], m["size"], m["sha256"]) == (
        FACE_DETECTOR.name,
        "tflite",
        FACE_DETECTOR.stat().st_size,
        _sha(FACE_DETECTOR),
    )
    assert m["inputs"] == [
        {"name": "input", "dtype": "float32", "shape": [1, 128, 128, 3], "quantization": None}
    ]
    assert m["outputs"] == [
        {"name": "regressors", "dtype": "float32", "shape": [1, 896, 16], "quantization": None},
        {"name": "classificators", "dtype": "float32", "shape": [1, 896, 1], "quantization": None},
    ]
    expected = _tflite_ops(FACE_DETECTOR)
    assert _ops_by_key(m["operators"]) == {(op, ""): n for op, n in expected.items()}
    assert m["operators"][0] == {"op_type": "DEQUANTIZE", "domain": "", "count": expected["DEQUANTIZE"]}
    assert m["operators_note"] is None
    code, out, _err = _inspect(str(FACE_DETECTOR))
    assert code == 0 and "[1, 128, 128, 3]" in out and "DEPTHWISE_CONV_2D" in out


def test_a_quantised_tflite_input_shows_its_scale_and_zero_point(tmp_path: Path) -> None:
    path = edgetpu_model(tmp_path)  # uint8 in (scale 1/255) and out (1/256), one edgetpu-custom-op
    [m] = _inspect_json(str(path))["models"]
    [image] = m["inputs"]
    assert (image["name"], image["dtype"], image["shape"]) == ("image", "uint8", [1, 4])
    assert image["quantization"]["zero_points"] == [0]
    assert image["quantization"]["scales"] == pytest.approx([1 / 255])
    [scores] = m["outputs"]
    assert scores["quantization"]["scales"] == pytest.approx([1 / 256])
    assert m["operators"] == [{"op_type": "edgetpu-custom-op", "domain": "", "count": 1}]
    assert _tflite_ops(path) == Counter({"edgetpu-custom-op": 1})
    code, out, _err = _inspect(str(path))
    assert code == 0 and "zero point [0]" in out


# --- OpenVINO IR -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_ir(tmp_path_factory: pytest.TempPathFactory, cls_model_path: Path) -> Path:
    import openvino as ov

    xml = tmp_path_factory.mktemp("ir") / "cls.xml"
    ov.save_model(ov.convert_model(str(cls_model_path)), str(xml))
    assert xml.with_suffix(".bin").is_file()
    return xml


def _ir_layers(xml: Path) -> tuple[Counter[tuple[str, str]], int]:
    """(type, opset) counts of the IR's <layer>s and the values its Const layers hold, from the XML."""
    layers = ET.parse(xml).getroot().find("layers")
    assert layers is not None
    counts: Counter[tuple[str, str]] = Counter()
    constants = 0
    for layer in layers:
        counts[(layer.attrib["type"], layer.attrib["version"])] += 1
        if layer.attrib["type"] == "Const":
            data = layer.find("data")
            assert data is not None
            shape = [int(d) for d in data.attrib["shape"].split(",") if d.strip()]
            constants += int(np.prod(shape, dtype=np.int64))
    return counts, constants


def test_an_openvino_ir_shows_inputs_outputs_and_operators(cls_ir: Path) -> None:
    [m] = _inspect_json(str(cls_ir))["models"]
    assert (m["file"], m["format"], m["sha256"]) == ("cls.xml", "openvino-ir", _sha(cls_ir))
    assert m["weights"] == "cls.bin"
    [x] = m["inputs"]
    assert (x["name"], x["dtype"], x["shape"]) == ("x", "float32", ["?", 3, "?", "?"])
    [y] = m["outputs"]
    assert CLS_OUTPUT in y["names"] and (y["dtype"], y["shape"]) == ("float32", ["?", 2])
    layers, constants = _ir_layers(cls_ir)
    # The XML spells some types its own way: "Const" for Constant, "ReLU" for Relu, "SoftMax"...
    expected = {("constant" if t == "Const" else t.lower(), v): n for (t, v), n in layers.items()}
    assert {(t.lower(), v): n for (t, v), n in _ops_by_key(m["operators"]).items()} == expected
    assert m["nodes"] == sum(layers.values()) and m["parameters"] == constants > 100_000
    code, out, _err = _inspect(str(cls_ir))
    assert code == 0 and "Convolution" in out and "opset1" in out and "weights cls.bin" in out


def test_an_ir_without_its_weights_is_a_clear_error(tmp_path: Path, cls_ir: Path) -> None:
    xml = tmp_path / "lonely.xml"
    xml.write_bytes(cls_ir.read_bytes())
    code, out, err = _inspect(str(xml))
    assert code == 1 and out == ""
    assert err.splitlines()[0] == (
        "error: lonely.xml: the OpenVINO IR weights (.bin) are missing "
        f"({tmp_path / 'lonely.bin'} does not exist)"
    )


# --- a store version ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_testdata(tmp_path_factory: pytest.TempPathFactory, cls_model_path: Path) -> Path:
    """An input for the cls model and the output onnxruntime computes on it."""
    x = np.random.default_rng(7).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    session = ort.InferenceSession(str(cls_model_path), providers=["CPUExecutionProvider"])
    [probs] = session.run([CLS_OUTPUT], {"x": x})
    path = tmp_path_factory.mktemp("testdata") / "sign.npz"
    np.savez(path, x=x, **{f"expected:{CLS_OUTPUT}": np.asarray(probs)})
    return path


@pytest.fixture
def installed_cls(tmp_path: Path, cls_model_path: Path, cls_testdata: Path) -> Path:
    """pp-ocr-cls@2.0 (with test data and tolerances) published and pulled into tmp/state/store."""
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(
        cls_model_path,
        CLS_NAME,
        CLS_VERSION,
        PublishOptions(metadata=METADATA, testdata=[cls_testdata], rtol=1e-3, atol=1e-5),
    )
    ModelStore(tmp_path / "state" / "store").pull(registry, CLS_NAME, CLS_VERSION)
    return tmp_path / "state"


def test_a_store_version_shows_manifest_artifacts_test_sets_and_models(
    installed_cls: Path, cls_model_path: Path, cls_testdata: Path
) -> None:
    info = _inspect_json(f"{CLS_NAME}@{CLS_VERSION}", "--state-dir", str(installed_cls))
    assert info["model"] == f"{CLS_NAME}@{CLS_VERSION}"
    version = info["version"]
    assert (version["name"], version["version"], version["metadata"]) == (CLS_NAME, CLS_VERSION, METADATA)
    assert version["signed_by"] is None and version["created"].endswith("Z")
    assert info["artifacts"] == [
        {
            "file": cls_model_path.name,
            "format": "onnx",
            "size": cls_model_path.stat().st_size,
            "sha256": _sha(cls_model_path),
            "target": "any",
            "model_file": None,
            "rtol": None,
            "atol": None,
        },
        {
            "file": "sign.npz",
            "format": "test-data",
            "size": cls_testdata.stat().st_size,
            "sha256": _sha(cls_testdata),
            "target": "any",
            "model_file": None,  # for any model file of the version it fits
            "rtol": 1e-3,
            "atol": 1e-5,
        },
    ]
    [m] = info["models"]
    assert (m["file"], m["sha256"], m["opsets"]) == (cls_model_path.name, _sha(cls_model_path), {"": 11})
    assert _ops_by_key(m["operators"]) == dict(_onnx_facts(cls_model_path)["ops"])
    assert info["test_sets"] == [
        {
            "file": "sign.npz",
            "model_file": None,
            "rtol": 1e-3,
            "atol": 1e-5,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 48, 192]}],
            "expected": [{"name": CLS_OUTPUT, "dtype": "float32", "shape": [1, 2]}],
            "error": None,
        }
    ]
    # Without a version: the newest installed one.
    assert _inspect_json(CLS_NAME, "--state-dir", str(installed_cls)) == info
    code, out, _err = _inspect(f"{CLS_NAME}@{CLS_VERSION}", "--state-dir", str(installed_cls))
    assert code == 0, out
    assert f"{CLS_NAME}@{CLS_VERSION} (created {version['created']}, signed by nobody)" in out
    assert "PaddleOCR v2.0 direction classifier" in out and "sign.npz" in out
    assert "test set sign.npz: for any model file it fits, rtol 0.001, atol 1e-05" in out
    assert "expected output" in out and "[1, 3, 48, 192]" in out


def test_a_signed_version_names_its_key(tmp_path: Path, cls_model_path: Path) -> None:
    kid, public = generate_key(tmp_path / "keys" / "release.key")
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(
        cls_model_path,
        CLS_NAME,
        "2.1",
        PublishOptions(sign_with=load_private_key(tmp_path / "keys" / "release.key")),
    )
    trust = TrustPolicy.from_config([TrustedKey(key=public, models=[CLS_NAME])])
    store = ModelStore(tmp_path / "store", trust=trust)
    store.pull(registry, CLS_NAME, "2.1")
    info = inspect_model(f"{CLS_NAME}@2.1", store)
    assert info["version"]["signed_by"] == kid
    assert info["test_sets"] == [] and [a["format"] for a in info["artifacts"]] == ["onnx"]


def test_an_ir_version_inspects_its_xml_with_its_bin(tmp_path: Path, cls_ir: Path) -> None:
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(cls_ir, "cls-ir", "1")
    ModelStore(tmp_path / "state" / "store").pull(registry, "cls-ir", "1")
    info = _inspect_json("cls-ir@1", "--state-dir", str(tmp_path / "state"))
    assert [(a["file"], a["format"]) for a in info["artifacts"]] == [
        ("cls.xml", "openvino-ir"),
        ("cls.bin", "openvino-ir"),
    ]
    xml, weights = info["models"]
    layers, constants = _ir_layers(cls_ir)
    assert xml["nodes"] == sum(layers.values()) and xml["parameters"] == constants
    assert xml["inputs"][0]["shape"] == ["?", 3, "?", "?"]
    assert weights == {
        "file": "cls.bin",
        "format": "openvino-ir",
        "size": cls_ir.with_suffix(".bin").stat().st_size,
        "sha256": _sha(cls_ir.with_suffix(".bin")),
        "weights_of": "cls.xml",
    }
    code, out, _err = _inspect("cls-ir@1", "--state-dir", str(tmp_path / "state"))
    assert code == 0 and "the weights of cls.xml" in out


# --- what is not a model ------------------------------------------------------------------------------


def test_a_text_file_named_onnx_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.onnx"
    bad.write_text("this is not a model\n")
    code, out, err = _inspect(str(bad))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        "error: x.onnx is not a valid ONNX model: Error parsing message with type 'onnx.ModelProto': "
        "Wire format was corrupt"
    ]
    code, out, _err = _inspect(str(bad), "--json")
    assert code == 1
    assert json.loads(out)["errors"] == [err.splitlines()[0].removeprefix("error: ")]


def test_an_empty_onnx_file_is_no_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # parses as an empty ModelProto
    code, _out, err = _inspect(str(empty))
    assert code == 1
    assert err.splitlines() == [
        "error: empty.onnx is not a valid ONNX model: no IR version or no graph in the file"
    ]


def test_a_text_file_named_tflite_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "y.tflite"
    bad.write_text("not a flatbuffer either\n")
    code, _out, err = _inspect(str(bad))
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("error: y.tflite is not a valid TFLite model: "), err
    assert "Traceback" not in err


def test_a_version_not_installed_is_a_clear_error(installed_cls: Path) -> None:
    code, out, err = _inspect(f"{CLS_NAME}@9.9", "--state-dir", str(installed_cls))
    assert code == 1 and out == ""
    store = installed_cls / "store"
    assert err.splitlines()[0] == (
        f"error: model {CLS_NAME}@9.9 is not installed in store {store} "
        f"(installed versions of {CLS_NAME}: {CLS_VERSION})"
    )
    code, _out, err = _inspect("no-such-model", "--state-dir", str(installed_cls))
    assert code == 1
    assert err.splitlines()[0] == (
        f"error: 'no-such-model' is neither a model file nor a model installed in {store}"
    )
