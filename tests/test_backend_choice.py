"""Choosing a pipeline's backend: hardware from fixture trees (EDGE_AGENT_SYSROOT), the policy from the
config, a real frame from the pipeline's own video, the decision cached under the state dir.

The fixture trees imitate boxes this machine is not (a Jetson, an H100, Coral, NCS2, NPU, Hailo,
Rockchip): the hardware is found there, and its runtime is missing here, so selection must say so
first, with what to install, and then fall back to a CPU backend of this machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest

from agent.backend_choice import DecisionStore, choose_and_load, grab_sample, hardware_notes, policy_for
from agent.config import (
    AgentConfig,
    BackendChoiceConfig,
    ClassificationPostprocess,
    DeviceConfig,
    ModelRef,
    PipelineConfig,
    RegistryConfig,
    SelectionConfig,
    VideoSourceConfig,
)
from agent.hardware import SYSROOT_ENV, detect_hardware
from agent.processing import Preprocessor
from agent.processing.feed import build_feeder
from providers import ModelArtifact, SelectionPolicy, decide, get_backend, screen
from providers.catalog import ProbedBackend
from providers.select import NoBackendError
from tests.agent_process import StartAgent
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, demo_video_module
from tests.selection_fixtures import explained_others

SYSROOTS = Path(__file__).resolve().parent / "fixtures" / "sysroots"
ORT_CPU = "onnxruntime/CPUExecutionProvider"
CPU_BACKENDS = {"openvino/CPU", ORT_CPU, "openvino/AUTO"}
TRT_HINT = "install onnxruntime-gpu with TensorRT (on Jetson: the JetPack onnxruntime-gpu wheel)"
EDGETPU_MISSING = "Edge TPU runtime libedgetpu not installed (apt-get install libedgetpu1-std)"


def _openvino_sees() -> str:
    return ", ".join(ov.Core().available_devices)


# tree -> {backend: the exact reason its candidate is rejected with on this machine}
EXPECTED: dict[str, dict[str, str]] = {
    "x86_64-nvidia-h100": {
        "onnxruntime/TensorrtExecutionProvider": "NVIDIA H100 80GB HBM3 found, but this onnxruntime build "
        f"has no TensorrtExecutionProvider: {TRT_HINT}",
        "onnxruntime/CUDAExecutionProvider": "NVIDIA H100 80GB HBM3 found, but this onnxruntime build has "
        "no CUDAExecutionProvider: install onnxruntime-gpu matching the CUDA version",
    },
    "jetson-agx-orin": {
        "onnxruntime/TensorrtExecutionProvider": "NVIDIA Jetson AGX Orin Developer Kit found, but this "
        f"onnxruntime build has no TensorrtExecutionProvider: {TRT_HINT}",
        "onnxruntime/CUDAExecutionProvider": "NVIDIA Jetson AGX Orin Developer Kit found, but this "
        "onnxruntime build has no CUDAExecutionProvider: install onnxruntime-gpu matching the CUDA version",
    },
    "x86_64-intel-npu": {
        "openvino/NPU": "Intel AI Boost NPU (Meteor Lake) found, but no OpenVINO NPU device: /dev/accel is "
        "there but OpenVINO cannot use it: install the NPU user-space driver (intel-level-zero-npu / "
        "linux-npu-driver) (OpenVINO sees: {sees})",
        "openvino/GPU": "Intel Arc Graphics (Meteor Lake) found, but no OpenVINO GPU device: ",
    },
    "x86_64-coral-usb": {
        "tflite/edgetpu": f"Google Coral USB Accelerator (Edge TPU) found, but {EDGETPU_MISSING}",
    },
    "x86_64-coral-pcie": {
        "tflite/edgetpu": f"Google Coral Edge TPU (PCIe/M.2) found, but {EDGETPU_MISSING}",
        "openvino/GPU": "Intel UHD Graphics (Alder Lake-N) found, but no OpenVINO GPU device: ",
    },
    "x86_64-ncs2": {
        "openvino/MYRIAD": "Intel Neural Compute Stick 2 (Movidius Myriad X) found, but edge-agent has no "
        "openvino/MYRIAD backend",
        "openvino/GPU": "Intel Iris Plus Graphics 655 (Coffee Lake) found, but no OpenVINO GPU device: ",
    },
    "rpi5-hailo": {
        "hailort": "Hailo-8/Hailo-8L AI accelerator found, but edge-agent has no hailort backend",
    },
    "rock5b-rk3588": {
        "rknn": "Rockchip RK3588 NPU found, but edge-agent has no rknn backend",
    },
}


def _artifact(path: Path) -> ModelArtifact:
    return ModelArtifact(path, "onnx", hashlib.sha256(path.read_bytes()).hexdigest())


# --- 8. fixture trees --------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_hardware_of_the_box_is_named_first_with_what_is_missing_then_a_cpu_fallback(
    tree: str, cls_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / tree))
    notes = hardware_notes(detect_hardware())  # reads the tree named by EDGE_AGENT_SYSROOT
    expected = EXPECTED[tree]
    assert set(notes) == set(expected)
    artifact = _artifact(cls_model_path)

    kept, rejected = screen([artifact], SelectionPolicy(), hardware=notes)

    assert {b.name for b, _ in kept} == CPU_BACKENDS
    first = rejected[: len(expected)]
    assert {r.backend for r in first} == set(expected)  # the box's own hardware comes first
    for report in first:
        assert report.reason.startswith(f"{notes[report.backend]}, but "), report.reason
        wanted = expected[report.backend].format(sees=_openvino_sees())
        if wanted.endswith(": "):  # the Intel iGPUs: the rest is the OpenVINO probe's own reason
            assert report.reason.startswith(wanted) and "intel-opencl-icd" in report.reason
            assert "/dev/dri is there but OpenVINO cannot use it" in report.reason  # read in the tree
        else:
            assert report.reason == wanted
    assert not any(
        r.reason.endswith(" found") or " found, but " in r.reason for r in rejected[len(expected) :]
    )

    decision = decide([artifact], SelectionPolicy(benchmark=False), None, hardware=notes)
    assert decision.backend in CPU_BACKENDS and decision.note == "benchmark off"
    text = decision.explain()
    placed = explained_others(decision)
    fallbacks = [placed[(name, artifact.label)] for name in CPU_BACKENDS - {decision.backend}]
    assert all(verdict == "untried" for _, verdict in fallbacks), text
    for backend in expected:
        n, verdict = placed[(backend, artifact.label)]
        assert verdict.startswith(f"rejected: {notes[backend]}, but "), text
        assert n < min(n for n, _ in fallbacks), text


def test_openvino_probe_reads_device_nodes_under_the_sysroot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NPU/GPU advice depends on whether the kernel made the device node, in the tree read."""
    npu = get_backend("openvino/NPU")
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / "x86_64-intel-npu"))
    assert "/dev/accel is there but OpenVINO cannot use it" in npu.probe().reason
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / "x86_64-cpu-only"))  # no dev/accel in this tree
    reason = npu.probe().reason
    assert "linux-npu-driver) is not installed or /dev/accel is missing" in reason, reason


def test_a_box_with_nothing_but_cpus_has_no_hardware_lines(cls_model_path: Path) -> None:
    notes = hardware_notes(detect_hardware(SYSROOTS / "x86_64-cpu-only"))
    assert notes == {}
    decision = decide([_artifact(cls_model_path)], SelectionPolicy(benchmark=False), None, hardware=notes)
    assert " found, but " not in decision.explain()


# --- 9. choose_and_load with a real config and a real video ------------------------------------------


@pytest.fixture(scope="module")
def sign_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "signs.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=10, seconds_per_sign=0.5)
    assert truth[0]["orientation"] == "upright"
    return path


def _config(state_dir: Path, uri: str, *, deny: tuple[str, ...] = (), **selection: object) -> AgentConfig:
    pipeline = PipelineConfig(
        name="signs",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        backend=BackendChoiceConfig(deny=list(deny)),
        source=VideoSourceConfig(type="video", uri=uri),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(type="classification", labels=CLS_LABELS),
    )
    backends = SelectionConfig(**{"runs": 3, "warmup": 1, "budget_s": 1.0, "max_trials": 2, **selection})
    return AgentConfig(
        device=DeviceConfig(id="box-1"),
        state_dir=state_dir,
        registry=RegistryConfig(
            url=f"file://{state_dir.parent / 'registry'}"
        ),  # choose_and_load never reads it
        backends=backends,
        pipelines=[pipeline],
    )


@pytest.mark.slow
def test_choose_and_load_benchmarks_once_then_reuses_the_cached_decision(
    tmp_path: Path, cls_model_path: Path, sign_video: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.backend_choice")
    artifacts = [_artifact(cls_model_path)]
    # A sample frame is needed to benchmark: wait for it as long as a busy machine may need.
    config = _config(tmp_path / "state", str(sign_video), sample_timeout_s=60.0)
    pipeline = config.pipelines[0]

    session, chosen = choose_and_load(config, pipeline, artifacts, "pp-ocr-cls@2.0")
    decision = chosen.decision
    try:
        assert session.backend == decision.backend
        frame = demo_video_module().render_sign("EDGE CAMERA 42", False, np.random.default_rng(1))
        preprocess = Preprocessor(CLS_PREPROCESS, session.inputs)
        [probs] = session.run({preprocess.input.name: preprocess(frame)}).values()
        assert int(probs.argmax()) == 0  # upright
    finally:
        session.close()
    assert decision.checked is True and decision.reference == ORT_CPU
    tried = [c for c in decision.candidates if c.median_ms is not None]
    assert len(tried) == 2 and all(c.max_abs_diff is not None and c.precision for c in tried)
    decisions = tmp_path / "state" / "decisions"
    [cached] = decisions.glob("*.json")
    record = json.loads((decisions / "pipelines" / "signs.json").read_text())
    assert (record["pipeline"], record["model"], record["key"]) == ("signs", "pp-ocr-cls@2.0", cached.stem)
    assert record["decision"]["backend"] == decision.backend and record["decision"]["checked"] is True
    assert DecisionStore(tmp_path / "state").get(cached.stem) == decision
    assert "using the cached backend decision" not in caplog.text
    benchmarked = "pipeline signs: choosing a backend for pp-ocr-cls@2.0 (benchmarking the top candidates"
    assert benchmarked in caplog.text

    caplog.clear()
    session, chosen = choose_and_load(config, pipeline, artifacts, "pp-ocr-cls@2.0")
    again = chosen.decision
    session.close()
    assert again == decision
    assert f"pipeline signs: using the cached backend decision {cached.stem}" in caplog.text
    # Nothing was benchmarked again (what made the first call slow; told by the log, not by timing).
    assert "choosing a backend" not in caplog.text

    # Another policy is another decision: the chosen backend denied, the next one wins.
    changed = _config(tmp_path / "state", str(sign_video), deny=(decision.backend,), sample_timeout_s=60.0)
    caplog.clear()
    session, chosen = choose_and_load(changed, changed.pipelines[0], artifacts, "pp-ocr-cls@2.0")
    other = chosen.decision
    session.close()
    assert "using the cached backend decision" not in caplog.text
    assert other.backend != decision.backend and other.checked is True
    assert f"denied by policy ({decision.backend})" in other.explain()
    assert len(list(decisions.glob("*.json"))) == 2


def test_a_first_start_serves_on_the_reference_at_once_without_screening_the_other_runtimes(
    tmp_path: Path, yolo_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """prove_later (backends.prove_in_background): the CPU reference serves at once. The other
    candidates' operator checks, which load every runtime (in a child process, seconds on a first
    start), wait for the proof on a frame, which screens them anyway. (YOLOv8n: opset 17, so the
    reference is not asked either; a file of an older opset is, for an upgrade: agent/transform.py.)"""
    caplog.set_level(logging.INFO, logger="agent.backend_choice")
    artifact = _artifact(yolo_path)
    screened: list[str] = []
    supports = ProbedBackend.supports

    def counted(self: ProbedBackend, model: ModelArtifact) -> Any:
        screened.append(self.name)
        return supports(self, model)

    monkeypatch.setattr(ProbedBackend, "supports", counted)
    config = _config(tmp_path / "state", str(tmp_path / "unused.mp4"))
    pipeline = config.pipelines[0]
    session, chosen = choose_and_load(config, pipeline, [artifact], "yolo@8", prove_later=True)
    decision = chosen.decision
    session.close()
    assert session.backend == decision.backend == ORT_CPU and decision.checked is False
    assert [(c.backend, c.verdict) for c in decision.candidates] == [(ORT_CPU, "chosen")]
    assert "serving on the full-precision reference until a sample proves a candidate" in decision.explain()
    assert screened == []
    assert not list((tmp_path / "state" / "decisions").glob("*.json"))  # unchecked: made again next time

    # Where the policy rules the reference out, the candidates are screened and ranked as before.
    denied = _config(tmp_path / "state", str(tmp_path / "unused.mp4"), deny=(ORT_CPU,))
    session, chosen = choose_and_load(denied, denied.pipelines[0], [artifact], "yolo@8", prove_later=True)
    by_rank = chosen.decision
    session.close()
    assert by_rank.backend != ORT_CPU and screened and by_rank.checked is False
    assert f"denied by policy ({ORT_CPU})" in by_rank.explain()

    # A file the reference cannot load: every candidate is screened, and the error says why each refuses.
    junk = tmp_path / "notes.onnx"
    junk.write_text("this is a shopping list, not a model\n")
    screened.clear()
    with pytest.raises(NoBackendError) as refused:
        choose_and_load(config, config.pipelines[0], [_artifact(junk)], "notes@1", prove_later=True)
    assert "screening every candidate" in caplog.text and set(screened) >= CPU_BACKENDS
    assert "notes.onnx" in str(refused.value)


def test_a_source_that_cannot_be_opened_gives_an_unchecked_decision_that_is_not_cached(
    tmp_path: Path, cls_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.backend_choice")
    config = _config(tmp_path / "state", str(tmp_path / "missing.mp4"), sample_timeout_s=1.0)
    started = time.perf_counter()
    session, chosen = choose_and_load(config, config.pipelines[0], [_artifact(cls_model_path)], "cls@2")
    decision = chosen.decision
    elapsed = time.perf_counter() - started
    session.close()
    assert decision.checked is False and decision.reference is None
    assert decision.note == (
        "outputs not checked: no sample input; serving on the full-precision reference until a sample "
        "proves a candidate (the others are screened then)"
    )
    # Not the top-ranked guess (OpenVINO here, bf16 on some CPUs): the full-precision reference.
    assert decision.backend == "onnxruntime/CPUExecutionProvider"
    assert "outputs not checked" in decision.explain()
    assert all(c.median_ms is None for c in decision.candidates)  # nothing was benchmarked
    assert "no frame from its source within 1 s" in caplog.text
    assert not list((tmp_path / "state").glob("decisions/*.json"))  # not cached for the next start ...
    recorded = DecisionStore(tmp_path / "state").for_pipeline("signs")
    assert recorded is not None and recorded["decision"]["checked"] is False  # ... but recorded for explain
    assert elapsed < 30, elapsed


def test_grab_sample_reads_the_first_frame_of_the_video(sign_video: Path, cls_model_path: Path) -> None:
    session = get_backend(ORT_CPU).load(_artifact(cls_model_path))
    pipeline = _config(sign_video.parent, str(sign_video)).pipelines[0]
    try:
        sample = grab_sample(pipeline, build_feeder(pipeline, session.inputs, session.outputs), 10.0)
        assert sample is not None and sample["x"].shape == (1, 3, 48, 192)
        [probs] = session.run(sample).values()
    finally:
        session.close()
    assert int(probs.argmax()) == 0  # "EDGE CAMERA 42", upright


def test_choose_and_load_on_a_jetson_tree_explains_the_missing_runtime_and_caches_unbenchmarked(
    tmp_path: Path, cls_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SYSROOT_ENV, str(SYSROOTS / "jetson-agx-orin"))
    config = _config(tmp_path / "state", str(tmp_path / "unused.mp4"), benchmark=False)
    session, chosen = choose_and_load(config, config.pipelines[0], [_artifact(cls_model_path)], "cls@2")
    decision = chosen.decision
    session.close()
    assert decision.backend in CPU_BACKENDS and decision.note == "benchmark off"
    text = decision.explain()
    assert "(others: onnxruntime/TensorrtExecutionProvider on " in text
    assert (
        ": rejected: NVIDIA Jetson AGX Orin Developer Kit found, but this onnxruntime build has no " in text
    )
    assert DecisionStore(tmp_path / "state").for_pipeline("signs") is not None  # benchmark off: cached


# --- 10. policy_for ----------------------------------------------------------------------------------


def test_policy_for_merges_agent_and_pipeline(tmp_path: Path) -> None:
    config = AgentConfig(
        device=DeviceConfig(id="box-1"),
        state_dir=tmp_path / "state",
        backends=SelectionConfig(
            prefer=["openvino/*"],
            deny=["tflite/*"],
            fixed="openvino/CPU",
            runs=7,
            rtol=0.05,
            options={"openvino/AUTO": {"cache_dir": "/srv/ov-cache", "hint": "throughput"}},
        ),
    )
    pipeline = PipelineConfig(
        name="p",
        model=ModelRef(name="m", version="1"),
        backend=BackendChoiceConfig(
            prefer=[ORT_CPU], deny=["openvino/AUTO"], fixed="onnxruntime/CPUExecutionProvider"
        ),
        source=VideoSourceConfig(type="video", uri="0"),
        postprocess=ClassificationPostprocess(type="classification"),
    )

    merged = policy_for(config, pipeline)
    assert merged.prefer == (ORT_CPU, "openvino/*")  # the pipeline's before the agent's
    assert merged.deny == ("tflite/*", "openvino/AUTO")
    assert merged.fixed == ORT_CPU
    assert (merged.runs, merged.rtol, merged.benchmark) == (7, 0.05, True)

    agent_only = policy_for(config)
    assert (agent_only.prefer, agent_only.deny, agent_only.fixed) == (
        ("openvino/*",),
        ("tflite/*",),
        "openvino/CPU",
    )
    plain = pipeline.model_copy(update={"backend": BackendChoiceConfig()})
    assert policy_for(config, plain).fixed == "openvino/CPU"  # no pipeline fixed: the agent's

    default_cache = str(tmp_path / "state" / "cache" / "openvino")
    assert merged.options_for("openvino/CPU") == {"cache_dir": default_cache}
    assert merged.options_for("openvino/AUTO") == {"cache_dir": "/srv/ov-cache", "hint": "throughput"}
    trt = merged.options_for("onnxruntime/TensorrtExecutionProvider")
    assert trt == {"engine_cache_dir": str(tmp_path / "state" / "cache" / "tensorrt")}
    assert merged.options_for(ORT_CPU) == {}
    assert "openvino/*" not in merged.options


@pytest.mark.slow
def test_an_unchecked_decision_is_proven_on_the_first_frame_and_cached(
    tmp_path: Path, cls_model_path: Path, sign_video: Path
) -> None:
    """Built without a sample (the source gave nothing in time), the pipeline serves on the full-
    precision reference; the first frame it processes proves the candidates in the background, the
    proven one is loaded for the worker to swap in, and the checked decision is cached."""
    from agent.backend_choice import DecisionSwitcher, make_prover
    from agent.processing.feed import build_feeder
    from tests.waits import wait_until

    artifacts = [_artifact(cls_model_path)]
    config = _config(tmp_path / "state", str(tmp_path / "missing.mp4"), sample_timeout_s=1.0)
    pipeline = config.pipelines[0]
    session, chosen = choose_and_load(config, pipeline, artifacts, "pp-ocr-cls@2.0")
    decision = chosen.decision
    candidates = chosen.artifacts
    assert decision.checked is False and decision.backend == "onnxruntime/CPUExecutionProvider"
    feeder = build_feeder(pipeline, session.inputs, session.outputs)
    import cv2

    capture = cv2.VideoCapture(str(sign_video))
    ok, frame = capture.read()
    capture.release()
    assert ok
    feeds, _geometry = feeder.feeds(frame, False)
    session.close()

    switcher = DecisionSwitcher(
        decision,
        candidates,
        chosen.policy,
        prove=make_prover(config, pipeline, chosen),
    )
    assert switcher.wants_sample
    switcher.offer_sample(feeds, current="a backend the proof will not pick")
    assert not switcher.wants_sample  # one proof at a time
    upgrade = None

    def loaded() -> bool:
        nonlocal upgrade
        upgrade = upgrade or switcher.take_upgrade()
        return upgrade is not None

    wait_until(loaded, "the proven candidate loaded for the worker")
    assert upgrade is not None
    try:
        assert switcher.decision.checked is True
        assert upgrade.backend == switcher.decision.backend
        assert switcher.decision.inputs == "a frame from the pipeline's source"
    finally:
        upgrade.close()
    # Cached: the next start uses the proven decision without waiting for a frame.
    again, chosen = choose_and_load(config, pipeline, artifacts, "pp-ocr-cls@2.0")
    cached = chosen.decision
    again.close()
    assert cached.checked is True and cached.backend == switcher.decision.backend


@pytest.mark.slow
def test_the_daemon_proves_its_choice_once_the_camera_delivers(
    tmp_path: Path, cls_model_path: Path, sign_video: Path, start_agent: StartAgent
) -> None:
    """The camera is not there when the pipeline is built (no sample: served on the reference); once
    it delivers, a frame proves the candidates and the checked decision is cached for the next start."""
    import json
    import shutil

    from agent.registry import FileRegistry
    from tests.agent_process import pipeline_state

    registry = FileRegistry(tmp_path / "registry")
    registry.publish(cls_model_path, "pp-ocr-cls", "2.0")
    camera = tmp_path / "camera.mp4"  # appears later
    state_dir = tmp_path / "state"
    config = {
        "device": {"id": "late-camera"},
        "state_dir": str(state_dir),
        "mqtt": {"host": "127.0.0.1", "port": 1, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": registry.url},
        # Waiting for a sample first (the camera is away: none comes), as before prove_in_background.
        "backends": {
            "sample_timeout_s": 1,
            "runs": 3,
            "warmup": 1,
            "budget_s": 1.0,
            "min_time_s": 0,
            "prove_in_background": False,
        },
        "pipelines": [
            {
                "name": "door",
                "model": {"name": "pp-ocr-cls", "version": "2.0"},
                "source": {
                    "type": "video",
                    "uri": str(camera),
                    "loop": True,
                    "reopen_min_s": 0.5,
                    "reopen_max_s": 1,
                },
                "preprocess": CLS_PREPROCESS.model_dump(),
                "postprocess": {"type": "classification", "softmax": False},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    agent = start_agent(path)

    def decisions() -> list[dict[str, object]]:
        return [json.loads(p.read_text()) for p in (state_dir / "decisions").glob("*.json")]

    from tests.waits import wait_until

    wait_until(
        lambda: pipeline_state(state_dir, "door") == "source-unavailable",
        "the pipeline built, its camera away",
    )
    assert decisions() == []  # unchecked: not cached
    shutil.copy(sign_video, camera)
    log = agent.run_until(lambda: bool(decisions()), "a decision proven on a frame and cached")
    assert "serving on the full-precision CPU reference" in log
    assert "proving the candidates for pp-ocr-cls@2.0 on a frame from the pipeline's source" in log
    assert "proved on a frame: chose" in log
    [stored] = decisions()
    assert (
        stored["decision"]["checked"] is True
        and stored["decision"]["inputs"] == "a frame from the pipeline's source"
    )
