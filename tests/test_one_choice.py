"""One answer to "where does this model run": `models validate`, `explain`, `infer` and `bench` name
the same backend and artifact, from the one function (agent/backend_choice/ `current_choice`).

Real models from the onnx wheel's backend tests, each with its test_data_set_0, published into a
file registry and pulled into a real store, through the `edge-agent` CLI as a user runs it; the
sweep's own code (scripts/sweep_backend_test_models.py) judges outputs at rtol 1e-3 / atol 1e-5.
The whole sweep over every model is a script (minutes): `docs/sweep-backend-test-models.md`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runs import edge_agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import sweep_backend_test_models as sweep

ORT_CPU = "onnxruntime/CPUExecutionProvider"
UPGRADED = "model.onnx (upgraded from opset 6 to 13)"
# One of each kind the outside tester found wrong or failing: a convolution OpenVINO's bf16 gets wrong,
# an opset-6 model only its upgraded twin runs right, a sequence model whose input OpenVINO renames.
REPRESENTATIVE = (
    "pytorch-converted/test_Conv2d",
    "pytorch-operator/test_operator_add_broadcast",
    "simple/test_sequence_model1",
)


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path, Path]:
    registry, config = tmp_path / "registry", tmp_path / "agent.yaml"
    config.write_text(
        f"device: {{id: sweep}}\nstate_dir: {tmp_path / 'state'}\nregistry: {{url: 'file://{registry}'}}\n"
    )
    return tmp_path, config, registry


def _model_dir(name: str) -> Path:
    suite, model = name.split("/")
    path = sweep.DATA / suite / model
    assert (path / "model.onnx").is_file(), f"the onnx wheel has no {name}"
    return path


@pytest.mark.slow
def test_validate_explain_and_infer_name_the_same_choice_and_infer_is_right(
    workspace: tuple[Path, Path, Path],
) -> None:
    work, config, registry = workspace
    outcomes = [sweep.sweep_one(_model_dir(name), work, config, registry) for name in REPRESENTATIVE]
    for outcome in outcomes:
        assert outcome.status == "correct", outcome
        assert outcome.validate == outcome.explain == outcome.infer, outcome
    by_model = {o.model: o for o in outcomes}
    # The opset-6 model runs as the agent activates it: its upgraded twin (OpenVINO is wrong on it).
    assert by_model["pytorch-operator/test_operator_add_broadcast"].infer == f"{ORT_CPU} on {UPGRADED}"


@pytest.mark.slow
def test_a_plain_infer_without_any_proof_runs_the_full_precision_reference(
    workspace: tuple[Path, Path, Path],
) -> None:
    """test_Conv2d published without test data: nothing proves a candidate, so infer runs the
    full-precision CPU reference (as a first start serves), never an unchecked reduced precision."""
    work, config, registry = workspace
    model_dir = _model_dir("pytorch-converted/test_Conv2d")
    published = edge_agent(
        "registry", "publish", str(model_dir / "model.onnx"), "--name", "conv", "--version", "1",
        "--registry", f"file://{registry}",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert edge_agent("models", "pull", "conv@1", "-c", str(config)).returncode == 0
    inputs, outputs = sweep.onnx_io_names(model_dir / "model.onnx")
    npz = work / "inputs.npz"
    npz.write_bytes(sweep.model_zoo_testdata(model_dir / "test_data_set_0", inputs, outputs))

    explained = edge_agent("explain", "conv@1", "-c", str(config), "--json")
    assert explained.returncode == 0, explained.stderr
    [record] = json.loads(explained.stdout)
    assert record["prospective"] is True and record["decision"]["backend"] == ORT_CPU
    ranked = [c["backend"] for c in record["decision"]["candidates"] if c["verdict"] == "untried"]
    assert "openvino/CPU" in ranked  # what a sample would prove next
    shown = edge_agent("explain", "conv@1", "-c", str(config))
    assert f"conv@1: would serve first on {ORT_CPU} on model.onnx" in shown.stdout.replace("\n", "")

    inferred = edge_agent("infer", "conv@1", str(npz), "-c", str(config), "--json", "--raw")
    assert inferred.returncode == 0, inferred.stderr
    result = json.loads(inferred.stdout)
    assert (result["backend"], result["artifact"], result["proven"]) == (ORT_CPU, "model.onnx", False)
    assert result["precision"] == "fp32" and result["backend_choice"].startswith("not proven yet: the full")
    got = [sweep.from_raw(entry) for entry in result["raw_outputs"].values()]
    assert sweep.within(got, sweep.expected_outputs(model_dir / "test_data_set_0")) == ""

    # A model file by path: the same answer.
    by_path = edge_agent("explain", str(model_dir / "model.onnx"), "--json")
    assert by_path.returncode == 0, by_path.stderr
    assert json.loads(by_path.stdout)[0]["decision"]["backend"] == ORT_CPU


@pytest.mark.slow
def test_a_forced_backend_runs_the_twin_and_says_when_validation_rejected_it(
    workspace: tuple[Path, Path, Path],
) -> None:
    work, config, registry = workspace
    model_dir = _model_dir("pytorch-operator/test_operator_add_broadcast")
    published = edge_agent(
        "registry", "publish", str(model_dir / "model.onnx"), "--name", "add", "--version", "1",
        "--registry", f"file://{registry}", "--test-data", str(model_dir / "test_data_set_0"),
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert edge_agent("models", "pull", "add@1", "-c", str(config)).returncode == 0
    validated = edge_agent("models", "validate", "add@1", "-c", str(config))
    assert validated.returncode == 0, validated.stderr
    assert "(kept as the agent's decision for this model on this box)" in validated.stdout
    inputs, outputs = sweep.onnx_io_names(model_dir / "model.onnx")
    npz = work / "inputs.npz"
    npz.write_bytes(sweep.model_zoo_testdata(model_dir / "test_data_set_0", inputs, outputs))

    # onnxruntime refuses the file as it is (opset 6): forced onto it, it runs the upgraded twin.
    forced = edge_agent("infer", "add@1", str(npz), "-c", str(config), "--backend", ORT_CPU, "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["artifact"] == UPGRADED
    # OpenVINO computes 5.9e199 where 2 is expected: it runs as asked, and says validation rejected it.
    wrong = edge_agent("infer", "add@1", str(npz), "-c", str(config), "--backend", "openvino/CPU", "--json")
    assert wrong.returncode == 0, wrong.stderr
    result = json.loads(wrong.stdout)
    assert result["backend"] == "openvino/CPU" and "differs from the" in result["rejected"], result
    text = edge_agent("infer", "add@1", str(npz), "-c", str(config), "--backend", "openvino/CPU")
    assert "proving the candidates on this box rejected it: model.onnx: " in text.stdout.replace("\n", "")


def test_inputs_that_do_not_match_the_graph_get_an_error_naming_its_inputs(
    workspace: tuple[Path, Path, Path],
) -> None:
    work, _config, _registry = workspace
    model = _model_dir("simple/test_sequence_model1") / "model.onnx"
    npz = work / "named-wrong.npz"
    np.savez(npz, A=np.zeros((2, 3, 4), np.float32), B=np.zeros((1, 3, 4), np.float32))
    done = edge_agent("infer", str(model), str(npz), "--json")
    assert done.returncode == 1
    [error] = json.loads(done.stdout)["errors"]
    assert "missing input 'X', 'Y', 'Z'" in error and "(the model's inputs: X, Y, Z)" in error, error


@pytest.mark.slow
def test_a_first_choice_that_cannot_run_the_input_is_proven_on_it(workspace: tuple[Path, Path, Path]) -> None:
    """onnxruntime loads test_PReLU_1d_multiparam (upgraded) but fails to run it (a broadcast it does
    not implement): a plain infer proves the candidates on the input and runs the one that is right,
    instead of failing with the runtime's traceback."""
    work, _config, _registry = workspace
    model_dir = _model_dir("pytorch-converted/test_PReLU_1d_multiparam")
    inputs, outputs = sweep.onnx_io_names(model_dir / "model.onnx")
    npz = work / "prelu.npz"
    npz.write_bytes(sweep.model_zoo_testdata(model_dir / "test_data_set_0", inputs, outputs))
    done = edge_agent("infer", str(model_dir / "model.onnx"), str(npz), "--json", "--raw")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["backend"] != ORT_CPU and result["proven"] is True, result
    assert result["backend_choice"].startswith("benchmarked on this input: "), result
    got = [sweep.from_raw(entry) for entry in result["raw_outputs"].values()]
    assert sweep.within(got, sweep.expected_outputs(model_dir / "test_data_set_0")) == ""


def test_a_frame_the_model_fails_on_is_still_offered_to_the_proof(cls_model_path: Path) -> None:
    """A pipeline's first choice that fails on its frames never gets a frame through to the proof
    that would replace it, unless a failed run offers its inputs too (agent/pipeline.py Stage.infer)."""
    from agent.config import ClassificationPostprocess, ModelRef, PipelineConfig, VideoSourceConfig
    from agent.stage import LoadedModel, Stage
    from providers import BackendError
    from providers.onnxruntime_backend import OnnxRuntimeBackend
    from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, cls_artifact

    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    config = PipelineConfig(
        name="orientation",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri="unused.mp4"),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(type="classification", softmax=False, labels=CLS_LABELS),
    )
    stage = Stage(config, LoadedModel("pp-ocr-cls", "2.0", "ab" * 32, session))
    offered: list[object] = []
    good = stage.feeder.warm_up_feeds()
    stage.infer(good, offer=offered.append)
    # Five channels where its convolutions take three: the runtime refuses the run.
    wrong = {name: np.zeros((1, 5, 48, 192), np.float32) for name in good}
    with pytest.raises(BackendError, match="run failed"):
        stage.infer(wrong, offer=offered.append)
    assert offered == [good, wrong]
    stage.close()
