"""The ONNX backend test models that ship in the onnx wheel, each published with its own
test_data_set_0 (model-zoo layout), as an outside tester would try the agent.

Every one that some backend of this box runs correctly, as it is or with its opset upgraded, must be
published and validate, and the candidate the agent activates must give the expected outputs at
the manifest's tolerance; every other one must be refused with each backend's reason. What "runs
correctly" means is decided here independently of the agent (an oracle that runs onnxruntime and
OpenVINO directly), so the test checks the agent's judgement rather than repeating it.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import numpy_helper, version_converter

from agent.errors import RegistryError
from agent.registry import FileRegistry, PublishOptions
from agent.store import ModelStore
from agent.testdata import MODEL_ZOO_ATOL, MODEL_ZOO_RTOL
from agent.validate import validate
from providers import run_trial
from providers.select import SelectionPolicy

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("simple", "pytorch-converted", "pytorch-operator")
QUICK = SelectionPolicy(warmup=1, runs=1, min_time_s=0.0, budget_s=5.0, max_trials=99, rounds=0)  # right


def _model_dirs() -> list[Path]:
    found = sorted(d for suite in SUITES for d in (DATA / suite).iterdir() if (d / "model.onnx").is_file())
    assert len(found) >= 100, (
        f"expected the onnx wheel's backend test models under {DATA}, found {len(found)}"
    )
    return found


def _tensors(set_dir: Path, kind: str) -> list[np.ndarray]:
    files = sorted(set_dir.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def _agrees(outputs: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    """The onnx backend test runner's judgement: every value within rtol 1e-3, atol 1e-7."""
    if len(outputs) != len(expected):
        return False
    for out, ref in zip(outputs, expected, strict=True):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return False
        if ref.dtype.kind in "fc":
            if not np.allclose(out, ref, rtol=MODEL_ZOO_RTOL, atol=MODEL_ZOO_ATOL, equal_nan=True):
                return False
        elif not np.array_equal(out.astype(ref.dtype) if ref.dtype.kind != "O" else out, ref):
            return False
    return True


def _oracle(model_dir: Path) -> bool:
    """Does onnxruntime (CPU, as is or with the opset upgraded to 13) or OpenVINO (CPU, its default
    precision, which is what the agent runs) give the expected outputs?"""
    model = onnx.load(str(model_dir / "model.onnx"))
    set_dir = model_dir / "test_data_set_0"
    inputs, expected = _tensors(set_dir, "input"), _tensors(set_dir, "output")
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    feeds = dict(zip(names, inputs, strict=False))
    candidates = [model.SerializeToString()]
    with contextlib.suppress(Exception):  # the converter has gaps
        candidates.append(version_converter.convert_version(model, 13).SerializeToString())
    for candidate in candidates:
        try:
            session = ort.InferenceSession(candidate, providers=["CPUExecutionProvider"])
            if _agrees(session.run(None, feeds), expected):
                return True
        except Exception:
            continue
    try:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(model_dir / "model.onnx")), "CPU")
        result = compiled([feeds[n] for n in names])
        return _agrees([result[o] for o in compiled.outputs], expected)
    except Exception:
        return False


@dataclass
class Outcome:
    name: str
    correct_somewhere: bool
    published: bool
    message: str = ""


@pytest.mark.slow
def test_every_backend_test_model_is_published_if_and_only_if_some_backend_runs_it_right(
    tmp_path: Path,
) -> None:
    registry = FileRegistry(tmp_path / "registry")
    outcomes = []
    for model_dir in _model_dirs():
        name = f"{model_dir.parent.name}.{model_dir.name}".replace("_", "-")[:64].lower()
        try:
            registry.publish(model_dir / "model.onnx", name, "1", PublishOptions(testdata=[model_dir]))
            outcomes.append(Outcome(name, _oracle(model_dir), True))
        except RegistryError as exc:
            outcomes.append(Outcome(name, _oracle(model_dir), False, exc.message))
    wrong = [
        (o.name, o.correct_somewhere, o.message[:300]) for o in outcomes if o.published != o.correct_somewhere
    ]
    assert not wrong, wrong
    published = [o for o in outcomes if o.published]
    refused = [o for o in outcomes if not o.published]
    print(f"\n{len(published)} published, {len(refused)} refused of {len(outcomes)}")  # shown with -s
    assert len(published) >= 100  # on any CPU, onnxruntime alone runs 100 of them right as they are
    for outcome in refused:
        assert outcome.message.startswith(f"refusing to publish {outcome.name}@1: "), outcome.message
        # The reason per backend: each candidate named with what it did wrong.
        assert "onnxruntime/CPUExecutionProvider on model.onnx" in outcome.message, outcome.message

    # Published versions validate, and what the agent activates gives the expected outputs.
    store = ModelStore(tmp_path / "store")
    for outcome in published:
        installed = store.pull(registry, outcome.name, "1")
        [testdata] = installed.testdata_artifacts()
        assert (testdata.rtol, testdata.atol) == (MODEL_ZOO_RTOL, MODEL_ZOO_ATOL)
        result = validate(
            installed.ref,
            installed.model_artifacts(),
            installed.testdata_artifacts(),
            QUICK,
            tmp_path / "derived",
            trial=lambda request, _timeout: run_trial(request),
        )
        assert result.usable and result.activated, (outcome.name, result.decision)
        activated = next(c for c in result.candidates if f"{c.backend} on {c.artifact}" == result.activated)
        assert activated.correct is True, (outcome.name, activated)
        assert all(e.within for e in activated.errors), (outcome.name, activated.errors)


def test_a_corrupted_expected_output_is_refused_with_the_numbers(tmp_path: Path) -> None:
    source = DATA / "pytorch-converted" / "test_Linear"
    if not (source / "model.onnx").is_file():
        source = next(d for d in _model_dirs() if d.parent.name == "pytorch-converted")
    model_dir = tmp_path / source.name
    shutil.copytree(source, model_dir)
    output = model_dir / "test_data_set_0" / "output_0.pb"
    tensor = onnx.load_tensor(str(output))
    values = numpy_helper.to_array(tensor).copy()
    values.flat[0] += 0.5
    output.write_bytes(numpy_helper.from_array(values, tensor.name).SerializeToString())
    registry = FileRegistry(tmp_path / "registry")
    with pytest.raises(RegistryError) as caught:
        registry.publish(model_dir / "model.onnx", "corrupted", "1", PublishOptions(testdata=[model_dir]))
    message = caught.value.message
    assert message.startswith(
        "refusing to publish corrupted@1: no backend of this box gives the expected outputs"
    )
    share = f"{1 / values.size:.1%}"
    assert f"{share} of values off by more than atol 1e-07 + rtol 0.001, up to 0.5" in message, message
    assert not (registry.root / "corrupted").exists()


@pytest.mark.slow
def test_cli_validate_reports_every_candidate_and_publish_takes_the_model_zoo_layout(tmp_path: Path) -> None:
    """An old-opset model onnxruntime refuses as it is: its upgraded twin is correct; OpenVINO computes
    5.9e199 where 2 is expected. `models validate` shows each; `registry publish` takes the folder."""
    import json

    from tests.cli_runs import edge_agent

    model_dir = DATA / "pytorch-operator" / "test_operator_add_broadcast"
    result = edge_agent(
        "models", "validate", str(model_dir / "model.onnx"), "--test-data", str(model_dir), "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["usable"] is True and report["test_sets"] == ["test data test_data_set_0.npz"]
    by_candidate = {(c["backend"], c["artifact"]): c for c in report["candidates"]}
    upgraded = by_candidate[("onnxruntime/CPUExecutionProvider", "model.onnx (upgraded from opset 6 to 13)")]
    assert upgraded["loads"] and upgraded["runs"] and upgraded["correct"] is True
    assert all(e["within"] and e["max_abs"] <= 1e-6 for e in upgraded["errors"])
    ov_cpu = by_candidate[("openvino/CPU", "model.onnx")]
    assert ov_cpu["correct"] is False and "differs from the reference" in ov_cpu["reason"]
    assert ov_cpu["errors"][0]["max_abs"] > 1e100
    assert ["onnxruntime/CPUExecutionProvider", "model.onnx", "unsupported operators: Add"] in report[
        "unusable"
    ]
    assert (
        report["activated"] == "onnxruntime/CPUExecutionProvider on model.onnx (upgraded from opset 6 to 13)"
    )

    registry = f"file://{tmp_path / 'registry'}"
    published = edge_agent(
        "registry", "publish", str(model_dir / "model.onnx"), "--name", "add-broadcast", "--version", "1",
        "--registry", registry, "--test-data", str(model_dir), "--json",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    [testdata] = [a for a in json.loads(published.stdout)["artifacts"] if a["format"] == "test-data"]
    assert (testdata["file"], testdata["rtol"], testdata["atol"]) == ("test_data_set_0.npz", 1e-3, 1e-7)

    # A model no backend here runs right: exit 1, and the table says why for each.
    refused_dir = DATA / "simple" / "test_gradient_of_add"
    refused = edge_agent(
        "models", "validate", str(refused_dir / "model.onnx"), "--test-data", str(refused_dir)
    )
    assert refused.returncode == 1
    assert "activates: nothing" in refused.stdout
    assert "onnxruntime/CPUExecutionProvider on model.onnx" in refused.stdout


def test_models_check_says_an_old_opset_is_the_reason_and_the_upgrade_fixes_it() -> None:
    import json

    from tests.cli_runs import edge_agent

    model = DATA / "pytorch-operator" / "test_operator_add_broadcast" / "model.onnx"
    result = edge_agent("models", "check", str(model), "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["backend"], r["artifact"]): r for r in json.loads(result.stdout)["backends"]}
    original = rows[("onnxruntime/CPUExecutionProvider", "model.onnx")]
    assert original["supported"] is False and original["upgrade_fixes"] is True
    assert original["reason"] == (
        "unsupported operators: Add "
        "(an old opset: selection uses a copy upgraded from opset 6 to 13, which fixes it)"
    )
    twin = rows[("onnxruntime/CPUExecutionProvider", "model.onnx (upgraded from opset 6 to 13)")]
    assert twin["supported"] is True and twin["derived_from"] == "model.onnx"
    # Backends this box lacks say so, without a word about opsets.
    trt = rows[("onnxruntime/TensorrtExecutionProvider", "model.onnx")]
    assert "opset" not in trt["reason"] and trt["upgrade_fixes"] is None
