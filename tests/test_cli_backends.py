"""`edge-agent providers`, `models check`, `bench` and `explain` as a user runs them: the real console
script as a subprocess, real models (PP-OCR cls, a scikit-learn model exported with skl2onnx, a mediapipe
.tflite), the real backends of this box, hardware fixture trees through EDGE_AGENT_SYSROOT, and for
`explain` a real `edge-agent run` against a real mosquitto, a file registry and a real video."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.agent_process import EDGE_AGENT, StartAgent
from tests.cli_runs import cli, cli_json
from tests.daemon_fixtures import DEVICE, MODEL, VERSION, pipeline, results_of, write_config
from tests.media_fixtures import demo_video_module, mediapipe_model
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory

SYSROOTS = Path(__file__).resolve().parent / "fixtures" / "sysroots"
TFLITE_MODEL = mediapipe_model("face_detection/face_detection_short_range.tflite")
CPU_BACKENDS = ("onnxruntime/CPUExecutionProvider", "openvino/CPU", "openvino/AUTO")


def by_backend(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["backend"]: row for row in rows}


def table_row(output: str, first_cell: str) -> str:
    """The line of a rich table whose first cell is `first_cell`."""
    rows = [line for line in output.splitlines() if line.strip("│ ").startswith(first_cell + " ")]
    assert len(rows) == 1, output
    return rows[0]


@pytest.fixture(scope="module")
def sklearn_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real scikit-learn classifier (ONNX-ML operators LinearClassifier, ZipMap), trained on iris."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    classifier = LogisticRegression(max_iter=500).fit(features, labels)
    assert classifier.score(features, labels) > 0.9
    path = tmp_path_factory.mktemp("sklearn") / "iris_logreg.onnx"
    path.write_bytes(to_onnx(classifier, features[:1]).SerializeToString())
    return path


# --- providers ---------------------------------------------------------------------------------


def test_providers_reports_this_box_and_every_backend() -> None:
    report = cli_json("providers")
    cpu = report["hardware"]["cpu"]
    assert cpu["arch"] == "x86_64" and cpu["logical_cores"] >= 1 and cpu["model"]
    assert isinstance(report["hardware"]["accelerators"], list)
    rows = by_backend(report["backends"])
    for name in (*CPU_BACKENDS, "tflite/cpu"):
        assert rows[name]["available"], rows[name]
        assert rows[name]["versions"] and rows[name]["devices"], rows[name]
    assert rows["openvino/CPU"]["devices"] == ["CPU"]
    assert "onnxruntime" in rows["onnxruntime/CPUExecutionProvider"]["versions"]
    cuda = rows["onnxruntime/CUDAExecutionProvider"]
    assert not cuda["available"]
    assert "no CUDAExecutionProvider" in cuda["reason"] and "install onnxruntime-gpu" in cuda["reason"]
    assert not rows["tflite/edgetpu"]["available"] and "libedgetpu" in rows["tflite/edgetpu"]["reason"]

    text = cli("providers")
    assert f"CPU {cpu['model']} (x86_64, {cpu['logical_cores']} threads)" in text
    accelerators = report["hardware"]["accelerators"]
    for acc in accelerators:
        assert f"Accelerator {acc['kind']}: {acc['model']}" in text
    if not accelerators:
        assert "Accelerators none found" in text
    assert table_row(text, "openvino/CPU").split("│")[2].strip() == "yes"
    assert "install onnxruntime-gpu" in table_row(text, "onnxruntime/CUDAExecutionProvider")


@pytest.mark.parametrize(
    ("sysroot", "kind", "backends", "after"),
    [
        (
            "x86_64-nvidia-h100",
            "nvidia-gpu",
            ("onnxruntime/CUDAExecutionProvider", "onnxruntime/TensorrtExecutionProvider"),
            "this onnxruntime build has no ",
        ),
        ("x86_64-intel-npu", "intel-npu", ("openvino/NPU",), "no OpenVINO NPU device"),
        ("x86_64-coral-usb", "coral-usb", ("tflite/edgetpu",), "Edge TPU runtime libedgetpu not installed"),
    ],
    ids=["nvidia-h100", "intel-npu", "coral-usb"],
)
def test_providers_names_the_hardware_found_that_no_runtime_here_can_use(
    sysroot: str, kind: str, backends: tuple[str, ...], after: str
) -> None:
    env = {"EDGE_AGENT_SYSROOT": str(SYSROOTS / sysroot)}
    report = cli_json("providers", env=env)
    assert report["hardware"]["cpu"]["arch"] == "x86_64"
    found = [acc for acc in report["hardware"]["accelerators"] if acc["kind"] == kind]
    assert len(found) == 1, report["hardware"]["accelerators"]
    model = found[0]["model"]
    if kind == "nvidia-gpu":
        assert model == "NVIDIA H100 80GB HBM3"
    rows = by_backend(report["backends"])
    for name in backends:
        assert not rows[name]["available"]
        assert rows[name]["reason"].startswith(f"{model} found, but {after}"), rows[name]
    # CPU backends are unaffected by what the fixture box has.
    assert all(rows[name]["available"] for name in CPU_BACKENDS)

    if kind == "nvidia-gpu":
        assert rows["onnxruntime/CUDAExecutionProvider"]["reason"].startswith(
            "NVIDIA H100 80GB HBM3 found, but this onnxruntime build has no CUDAExecutionProvider: "
            "install onnxruntime-gpu"
        )
        text = cli("providers", env=env)
        assert "Accelerator nvidia-gpu: NVIDIA H100 80GB HBM3 - install onnxruntime-gpu" in text
        assert "NVIDIA H100 80GB HBM3 found, but" in table_row(text, "onnxruntime/CUDAExecutionProvider")


# --- models check ------------------------------------------------------------------------------


def test_models_check_the_cls_model(cls_model_path: Path) -> None:
    report = cli_json("models", "check", str(cls_model_path))
    assert report["model"] == str(cls_model_path)
    rows = by_backend(report["backends"])
    for name in CPU_BACKENDS:
        assert rows[name]["supported"] and rows[name]["reason"] == "", rows[name]
        assert rows[name]["artifact"] == cls_model_path.name and rows[name]["format"] == "onnx"
    assert not rows["tflite/cpu"]["supported"]
    assert rows["tflite/cpu"]["reason"] == "cannot read onnx files"
    assert not rows["tflite/edgetpu"]["supported"]
    cuda = rows["onnxruntime/CUDAExecutionProvider"]
    assert not cuda["supported"] and cuda["reason"].startswith("backend not available: ")

    text = cli("models", "check", str(cls_model_path))
    assert table_row(text, "openvino/AUTO").split("│")[3].strip() == "yes"
    assert "cannot read onnx files" in table_row(text, "tflite/cpu")


def test_models_check_names_the_onnx_ml_operators_openvino_lacks(sklearn_model: Path) -> None:
    rows = by_backend(cli_json("models", "check", str(sklearn_model))["backends"])
    ort_cpu = rows["onnxruntime/CPUExecutionProvider"]
    assert ort_cpu["supported"] and ort_cpu["unsupported_ops"] == []
    for name in ("openvino/CPU", "openvino/AUTO"):
        row = rows[name]
        assert not row["supported"]
        assert row["unsupported_ops"] == ["LinearClassifier", "ZipMap"], row
        assert "unsupported operators: LinearClassifier, ZipMap" in row["reason"]
    assert rows["tflite/cpu"]["reason"] == "cannot read onnx files"


def test_models_check_a_tflite_model() -> None:
    assert TFLITE_MODEL.is_file(), f"{TFLITE_MODEL} is part of the mediapipe wheel"
    rows = by_backend(cli_json("models", "check", str(TFLITE_MODEL))["backends"])
    assert rows["tflite/cpu"]["supported"] and rows["tflite/cpu"]["format"] == "tflite"
    assert not rows["onnxruntime/CPUExecutionProvider"]["supported"]
    assert rows["onnxruntime/CPUExecutionProvider"]["reason"] == "cannot read tflite files"


def test_models_check_on_something_that_is_no_model(tmp_path: Path) -> None:
    state = tmp_path / "state"
    out = cli("models", "check", "no-such-model", "--state-dir", str(state), expect=1)
    assert f"error: 'no-such-model' is neither a model file nor a model installed in {state / 'store'}" in out
    assert "hint: give a path, or pull it first" in out
    # A missing path is named as such (not as a missing config file).
    missing = tmp_path / "nowhere" / "model.onnx"
    out = cli("models", "check", str(missing), "-c", str(tmp_path / "absent.yaml"), expect=1)
    assert f"error: {missing}: no such model file" in out

    # A file that only looks like a model: one clear error (not a table of every backend failing).
    fake = tmp_path / "x.onnx"
    fake.write_text("this is not an ONNX model\n")
    out = cli("models", "check", str(fake), expect=1)
    assert "error: x.onnx is not a valid ONNX model: " in out


# --- bench -------------------------------------------------------------------------------------


def check_timings(row: dict[str, Any], runs: int) -> None:
    assert row["ok"] and row["error"] == "", row
    assert row["runs"] == runs
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"], row
    assert row["throughput_per_s"] > 0 and row["peak_rss_mb"] > 0 and row["load_s"] >= 0
    assert row["precision"] in ("fp32", "fp16", "bf16", "int8"), row


@pytest.mark.slow
def test_bench_times_every_backend_that_can_run_the_model(cls_model_path: Path) -> None:
    report = cli_json("bench", str(cls_model_path), "--runs", "5", "--warmup", "1")
    assert (report["model"], report["runs"], report["warmup"]) == (str(cls_model_path), 5, 1)
    rows = by_backend(report["results"])
    assert set(rows) == set(CPU_BACKENDS), rows  # tflite cannot read onnx; the rest are unavailable
    for row in rows.values():
        check_timings(row, 5)
        assert row["artifact"] == cls_model_path.name
    # Marked: where this box serves the model now (nothing proven yet: the full-precision reference).
    assert [name for name, row in rows.items() if row["selected"]] == ["onnxruntime/CPUExecutionProvider"]
    assert report["choice"]["backend"] == "onnxruntime/CPUExecutionProvider"
    assert report["choice"]["proven"] is False and report["choice"]["artifact"] == cls_model_path.name
    # OpenVINO keeps its own timer (what benchmark_app reports): inside the wall time of each run.
    for name in ("openvino/CPU", "openvino/AUTO"):
        assert 0 < rows[name]["compute_p50_ms"] <= rows[name]["p50_ms"], rows[name]
    assert "compute_p50_ms" not in rows["onnxruntime/CPUExecutionProvider"]  # it keeps none
    assert report["inputs"] == "random inputs (x 1x3x224x224)"  # open dims: batch 1, others 224
    # Then all of them again side by side, in interleaved rounds: a median and a spread each.
    assert report["rounds"] == 5 and 0 < report["cpu"]["busy_percent"] <= 100, report
    assert 0 <= report["cpu"]["others_percent"] <= report["cpu"]["busy_percent"], report
    for row in rows.values():
        assert row["side_by_side_ms"] > 0 and row["spread_ms"] >= 0, row

    only = cli_json("bench", str(cls_model_path), "--backend", "openvino/CPU", "--runs", "3", "--warmup", "1")
    assert [row["backend"] for row in only["results"]] == ["openvino/CPU"]
    check_timings(only["results"][0], 3)
    assert only["rounds"] == 0 and only["cpu"] is None  # one backend: nothing to time it beside
    assert "side_by_side_ms" not in only["results"][0]

    out = cli("bench", str(cls_model_path), "--backend", "nope", expect=1)
    assert "error: unknown backend 'nope'" in out and "hint: edge-agent providers lists them" in out
    failed = subprocess.run(
        [EDGE_AGENT, "bench", str(cls_model_path), "--backend", "nope", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert failed.returncode == 1
    assert json.loads(failed.stdout) == {
        "ok": False,
        "errors": ["unknown backend 'nope'"],
        "hint": "edge-agent providers lists them",
    }


# --- explain (after a real run) ----------------------------------------------------------------


@pytest.mark.slow
def test_explain_shows_why_the_running_pipeline_got_its_backend(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    cls_model_path: Path,
    start_agent: StartAgent,
) -> None:
    registry = tmp_path / "registry"
    cli("registry", "publish", str(cls_model_path), "--name", MODEL, "--version", VERSION,
        "--registry", f"file://{registry}")  # fmt: skip
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    # Looping: results keep coming however long the backend choice takes on a busy machine.
    signs = pipeline("signs", str(video), loop=True)
    config = write_config(tmp_path, mosquitto.port, registry, [signs], benchmark=True)
    # Proven before it serves (not beside it), so the first results already run on the choice.
    settings = yaml.safe_load(config.read_text())
    settings["backends"]["prove_in_background"] = False
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    results_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/#")
    log = start_agent(config).run_until(lambda: len(results_sub.messages) >= 2, "two results")
    assert "pipeline signs started" in log, log[-3000:]
    results = results_of(results_sub.wait_for(2))
    ran_on = {r["backend"] for r in results}
    assert len(ran_on) == 1, ran_on
    backend = ran_on.pop()

    records = cli_json("explain", "signs", "-c", str(config))
    assert len(records) == 1
    record = records[0]
    assert (record["pipeline"], record["model"]) == ("signs", f"{MODEL}@{VERSION}")
    decision = record["decision"]
    assert decision["backend"] == backend
    assert decision["checked"] is True and decision["reference"] == "onnxruntime/CPUExecutionProvider"
    verdicts = {c["backend"]: c["verdict"] for c in decision["candidates"]}
    assert verdicts[backend] == "chosen"
    chosen = next(c for c in decision["candidates"] if c["verdict"] == "chosen")
    assert chosen["median_ms"] > 0
    # The model name (with or without its version) finds the same record.
    assert cli_json("explain", MODEL, "-c", str(config)) == records
    assert cli_json("explain", f"{MODEL}@{VERSION}", "-c", str(config)) == records

    text = cli("explain", "signs", "-c", str(config))
    assert f"signs ({MODEL}@{VERSION}): runs on {backend} on {chosen['artifact']}" in text
    assert "outputs checked against onnxruntime/CPUExecutionProvider" in text
    for name, verdict in verdicts.items():
        assert verdict in table_row(text, name), (name, verdict)

    out = cli("explain", "nope", "-c", str(config), expect=1)
    unknown = f"error: no pipeline 'nope' in {config} and no model 'nope' in the store (its pipelines: signs)"
    assert unknown in out
    assert "hint: give a pipeline name from the config, a model NAME@VERSION, or a model file" in out

    listed = cli_json("models", "list", "-c", str(config))
    assert [(m["name"], m["version"]) for m in listed] == [(MODEL, VERSION)]
    assert listed[0]["artifacts"][0]["file"] == cls_model_path.name
    text = cli("models", "list", "-c", str(config))
    assert MODEL in text and VERSION in text and cls_model_path.name in text

    # bench of the installed model marks the backend the pipeline runs on.
    report = cli_json("bench", MODEL, "-c", str(config), "--backend", backend, "--runs", "3", "--warmup", "1")
    assert report["model"] == f"{MODEL}@{VERSION}"
    assert [(r["backend"], r["selected"]) for r in report["results"]] == [(backend, True)]
    # Timed on the size its pipeline feeds it (48x192), not a guess for the open dimensions.
    assert report["inputs"] == "inputs shaped as pipeline signs feeds them (x 1x3x48x192)"
    named = cli_json(
        "bench", MODEL, "-c", str(config), "--pipeline", "signs", "--backend", backend, "--runs", "2"
    )
    assert named["inputs"] == report["inputs"]
    out = cli("bench", MODEL, "-c", str(config), "--pipeline", "nope", expect=1)
    assert f"no pipeline named 'nope' in {config} (its pipelines: signs)" in out
    text = cli("bench", MODEL, "-c", str(config), "--runs", "3", "--warmup", "1")
    assert "selected" in table_row(text, backend)
    for name in CPU_BACKENDS:
        cells = [cell.strip() for cell in table_row(text, name).split("│")]
        assert cells[3] in ("fp32", "fp16", "bf16") and float(cells[4]) > 0, cells
