"""Backends and selection, with the real onnxruntime and the real PP-OCR direction classifier."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.processing import Preprocessor
from providers import (
    BackendError,
    Choice,
    ModelArtifact,
    NoBackendError,
    Session,
    get_backend,
    select_backend,
)
from providers import registry as backend_registry
from providers.onnxruntime_backend import OnnxRuntimeBackend
from providers.registry import UnavailableBackend, all_backends, backend_names
from tests.media_fixtures import CLS_PREPROCESS, cls_artifact, demo_video_module

CPU = "onnxruntime/CPUExecutionProvider"


@pytest.fixture(scope="module")
def cls_session(cls_model_path: Path) -> Session:
    return OnnxRuntimeBackend().load(cls_artifact(cls_model_path), {"intra_op_threads": 1})


def _tflite(tmp_path: Path) -> ModelArtifact:
    path = tmp_path / "model.tflite"
    path.write_bytes(b"TFL3" + bytes(60))
    return ModelArtifact(path, "tflite", "1" * 64)


# --- onnxruntime backend -------------------------------------------------------------------------


def test_probe_reports_available_with_versions() -> None:
    probe = OnnxRuntimeBackend().probe()
    assert probe.backend == CPU
    assert probe.available is True
    assert probe.versions["onnxruntime"] == ort.__version__
    assert "cpu" in probe.devices


def test_probe_of_missing_execution_provider_gives_reason() -> None:
    probe = OnnxRuntimeBackend("NoSuchExecutionProvider").probe()
    assert probe.available is False
    assert "NoSuchExecutionProvider" in probe.reason
    assert "CPUExecutionProvider" in probe.reason  # lists what the build does have


def test_supports_onnx_but_not_tflite(tmp_path: Path, cls_model_path: Path) -> None:
    backend = OnnxRuntimeBackend()
    assert backend.supports(cls_artifact(cls_model_path)).ok
    support = backend.supports(_tflite(tmp_path))
    assert support.ok is False
    assert "tflite" in support.reason


def test_load_gives_input_and_output_specs(cls_session: Session) -> None:
    assert cls_session.backend == CPU
    assert cls_session.precision == "fp32"
    [inp] = cls_session.inputs
    assert inp.name == "x"
    assert inp.dtype == "float32"
    assert len(inp.shape) == 4
    assert inp.fixed_dim(1) == 3
    assert inp.fixed_dim(0) is None and inp.fixed_dim(2) is None and inp.fixed_dim(3) is None
    [out] = cls_session.outputs
    assert out.dtype == "float32"
    assert len(out.shape) == 2 and out.fixed_dim(1) == 2


@pytest.mark.parametrize("upside_down", [False, True])
def test_run_classifies_real_rendered_text(cls_session: Session, upside_down: bool) -> None:
    video = demo_video_module()
    rng = np.random.default_rng(123)
    pre = Preprocessor(CLS_PREPROCESS, cls_session.inputs)
    out_name = cls_session.outputs[0].name
    for text, _ in video.SIGNS:
        crop = video.render_sign(text, upside_down, rng)
        outputs = cls_session.run({"x": pre(crop)})
        assert set(outputs) == {out_name}
        probs = outputs[out_name]
        assert probs.shape == (1, 2) and probs.dtype == np.float32
        assert probs.sum() == pytest.approx(1.0, abs=1e-4)
        assert int(np.argmax(probs)) == int(upside_down), (text, probs)
        assert probs.max() > 0.9, (text, probs)


def test_run_batch_and_warm_up(cls_session: Session) -> None:
    cls_session.warm_up({"x": (1, 3, 48, 192)})
    batch = np.zeros((3, 3, 48, 192), np.float32)
    out = cls_session.run({"x": batch})
    assert out[cls_session.outputs[0].name].shape == (3, 2)


def test_run_with_bad_feed_raises_backend_error(cls_session: Session) -> None:
    with pytest.raises(BackendError) as info:
        cls_session.run({"x": np.zeros((1, 3, 48, 192), np.float64)})
    message = str(info.value)
    assert message.startswith(f"{CPU}: run failed")
    assert "\n" not in message
    with pytest.raises(BackendError):
        cls_session.run({"not_x": np.zeros((1, 3, 48, 192), np.float32)})


def test_load_non_onnx_file_raises_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\nat all\n")
    with pytest.raises(BackendError) as info:
        OnnxRuntimeBackend().load(ModelArtifact(path, "onnx", "2" * 64))
    message = str(info.value)
    assert "\n" not in message
    assert CPU in message and "notes.onnx" in message
    assert len(message) < 500


def test_load_truncated_model_raises_one_line(tmp_path: Path, cls_model_path: Path) -> None:
    data = cls_model_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BackendError) as info:
        OnnxRuntimeBackend().load(ModelArtifact(path, "onnx", "3" * 64))
    message = str(info.value)
    assert "\n" not in message
    assert "cannot load truncated.onnx" in message


def test_load_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"cannot load gone\.onnx"):
        OnnxRuntimeBackend().load(ModelArtifact(tmp_path / "gone.onnx", "onnx", "4" * 64))


def test_load_unknown_option_raises(cls_model_path: Path) -> None:
    with pytest.raises(BackendError) as info:
        OnnxRuntimeBackend().load(cls_artifact(cls_model_path), {"threads": 2, "intra_op_threads": 1})
    message = str(info.value)
    assert "'threads'" in message
    assert "intra_op_threads" in message and "inter_op_threads" in message


# --- selection -----------------------------------------------------------------------------------


def test_select_backend_chooses_onnxruntime(cls_model_path: Path) -> None:
    artifact = cls_artifact(cls_model_path)
    session, choice = select_backend([artifact])
    assert isinstance(choice, Choice)
    assert choice.backend == CPU and session.backend == CPU
    assert choice.artifact == artifact
    explanation = choice.explain()
    assert explanation == f"chose {CPU} for {cls_model_path.name}"  # the only candidate
    assert [i.name for i in session.inputs] == ["x"]


def test_select_backend_passes_options_per_backend(cls_model_path: Path) -> None:
    with pytest.raises(NoBackendError) as info:
        select_backend([cls_artifact(cls_model_path)], options={CPU: {"bogus": 1}})
    assert "'bogus'" in str(info.value)
    _, choice = select_backend([cls_artifact(cls_model_path)], options={CPU: {"intra_op_threads": 1}})
    assert choice.backend == CPU


def test_select_backend_skips_a_broken_artifact_and_explains(tmp_path: Path, cls_model_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x00garbage")
    tflite = _tflite(tmp_path)
    artifacts = [tflite, ModelArtifact(broken, "onnx", "5" * 64), cls_artifact(cls_model_path)]
    _, choice = select_backend(artifacts)
    assert choice.artifact.path == cls_model_path
    assert [c.ok for c in choice.candidates] == [False, False, True]
    explanation = choice.explain()
    assert explanation.startswith(f"chose {CPU} for {cls_model_path.name} (not chosen: ")
    assert f"{CPU} on model.tflite: onnxruntime runs ONNX files, not tflite" in explanation
    assert f"{CPU} on broken.onnx: {CPU} cannot load broken.onnx" in explanation


def test_select_backend_with_only_tflite_raises_with_reasons(tmp_path: Path) -> None:
    unavailable = UnavailableBackend(
        "tflite/cpu", "cannot import its runtime: No module named 'ai_edge_litert'"
    )
    with pytest.raises(NoBackendError) as info:
        select_backend([_tflite(tmp_path)], backends=[OnnxRuntimeBackend(), unavailable])
    error = info.value
    assert isinstance(error, BackendError)
    assert [(c.backend, c.ok) for c in error.candidates] == [(CPU, False), ("tflite/cpu", False)]
    message = str(error)
    assert f"{CPU}: onnxruntime runs ONNX files, not tflite" in message
    assert "tflite/cpu: cannot import its runtime: No module named 'ai_edge_litert'" in message
    assert "\n" not in message


def test_select_backend_default_list_with_only_tflite(tmp_path: Path) -> None:
    with pytest.raises(NoBackendError) as info:
        select_backend([_tflite(tmp_path)])
    assert len(info.value.candidates) == len(backend_names())
    assert f"{CPU}: onnxruntime runs ONNX files, not tflite" in str(info.value)


def test_select_backend_with_no_backends() -> None:
    with pytest.raises(NoBackendError, match="no backends are registered"):
        select_backend([], backends=[])


# --- registry ------------------------------------------------------------------------------------


def test_get_backend_known_and_unknown() -> None:
    backend = get_backend(CPU)
    assert isinstance(backend, OnnxRuntimeBackend)
    assert backend.name == CPU
    with pytest.raises(KeyError) as info:
        get_backend("tensorrt/gpu")
    assert "tensorrt/gpu" in str(info.value) and CPU in str(info.value)
    assert CPU in backend_names()


def test_unavailable_backend_directly(tmp_path: Path) -> None:
    backend = UnavailableBackend("openvino/CPU", "cannot import its runtime: libopenvino.so missing")
    probe = backend.probe()
    assert probe.backend == "openvino/CPU"
    assert probe.available is False
    assert probe.reason == "cannot import its runtime: libopenvino.so missing"
    support = backend.supports(_tflite(tmp_path))
    assert support.ok is False and "libopenvino.so" in support.reason
    with pytest.raises(BackendError, match=r"openvino/CPU is not available: .*libopenvino\.so missing"):
        backend.load(_tflite(tmp_path))


def test_registry_entry_with_missing_module_becomes_unavailable(
    monkeypatch: pytest.MonkeyPatch, cls_model_path: Path
) -> None:
    monkeypatch.setitem(
        backend_registry._BACKENDS, "ghost/cpu", ("providers.no_such_runtime_backend", "GhostBackend", {})
    )
    backend = get_backend("ghost/cpu")
    assert isinstance(backend, UnavailableBackend)
    probe = backend.probe()
    assert probe.available is False
    assert "cannot import its runtime" in probe.reason and "no_such_runtime_backend" in probe.reason
    # The other backends still work, and selection explains why the ghost was passed over.
    names = [b.name for b in all_backends()]
    assert names == [CPU, "ghost/cpu"]
    _, choice = select_backend([cls_artifact(cls_model_path)])
    assert choice.backend == CPU
    # Onnxruntime comes first, so the ghost is never reached; put it first to see its reason.
    _, choice = select_backend([cls_artifact(cls_model_path)], backends=list(reversed(all_backends())))
    assert choice.backend == CPU
    assert "ghost/cpu on ch_ppocr_mobile_v2.0_cls_infer.onnx: cannot import its runtime" in choice.explain()
    assert "no_such_runtime_backend" in choice.explain()


def test_registry_entry_whose_module_raises_on_import_becomes_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A broken install often fails with OSError (a shared library missing), not ImportError.
    (tmp_path / "edge_broken_runtime_backend.py").write_text(
        "raise OSError('libbroken.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backend_registry._BACKENDS, "broken/cpu", ("edge_broken_runtime_backend", "X", {}))
    try:
        backend = get_backend("broken/cpu")
    finally:
        sys.modules.pop("edge_broken_runtime_backend", None)
    assert isinstance(backend, UnavailableBackend)
    assert "libbroken.so" in backend.probe().reason
    assert [b.name for b in all_backends()] == [CPU, "broken/cpu"]
