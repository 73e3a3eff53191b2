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
    ModelArtifact,
    Session,
    get_backend,
)
from providers import registry as backend_registry
from providers.onnxruntime_backend import OnnxRuntimeBackend
from providers.registry import UnavailableBackend, backend_names
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
    assert probe.devices == ("CPUExecutionProvider",)


def test_probe_of_missing_execution_provider_gives_reason() -> None:
    probe = OnnxRuntimeBackend("NoSuchExecutionProvider").probe()
    assert probe.available is False
    assert (
        probe.reason
        == "this onnxruntime build has no NoSuchExecutionProvider: use an onnxruntime build with it"
    )


def test_probe_of_a_gpu_execution_provider_says_what_to_install() -> None:
    probe = OnnxRuntimeBackend("CUDAExecutionProvider").probe()
    assert probe.available is False  # this machine's onnxruntime is a CPU build
    assert probe.reason == (
        "this onnxruntime build has no CUDAExecutionProvider: "
        "install onnxruntime-gpu matching the CUDA version"
    )


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
    assert message.startswith("onnxruntime/CPUExecutionProvider: bad options: threads: Extra inputs")
    assert "intra_op_threads" in message and "inter_op_threads" in message


def test_worker_threads_do_not_spin_unless_asked(cls_model_path: Path) -> None:
    """At a camera's pace spinning threads burn the CPU between frames: off by default."""

    def spinning(options: dict[str, object]) -> tuple[str, str]:
        session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path), options)
        try:
            settings = session._session.get_session_options()  # type: ignore[attr-defined]
            return (
                settings.get_session_config_entry("session.intra_op.allow_spinning"),
                settings.get_session_config_entry("session.inter_op.allow_spinning"),
            )
        finally:
            session.close()

    assert spinning({}) == ("0", "0")
    assert spinning({"allow_spinning": True}) == ("1", "1")


# --- selection -----------------------------------------------------------------------------------


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


def test_runtime_with_missing_module_becomes_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_registry, "_RUNTIMES", {"ghost": "providers.no_such_runtime_backend"})
    [backend] = backend_registry.all_backends()
    assert isinstance(backend, UnavailableBackend) and backend.name == "ghost/*"
    probe = backend.probe()
    assert probe.available is False
    assert "cannot import its runtime" in probe.reason and "no_such_runtime_backend" in probe.reason


def test_runtime_whose_module_raises_on_import_becomes_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A broken install often fails with OSError (a shared library missing), not ImportError.
    (tmp_path / "edge_broken_runtime_backend.py").write_text(
        "raise OSError('libbroken.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        backend_registry,
        "_RUNTIMES",
        {"onnxruntime": "providers.onnxruntime_backend", "broken": "edge_broken_runtime_backend"},
    )
    try:
        backends = backend_registry.all_backends()
    finally:
        sys.modules.pop("edge_broken_runtime_backend", None)
    broken = backends[-1]
    assert isinstance(broken, UnavailableBackend) and broken.name == "broken/*"
    assert "libbroken.so" in broken.probe().reason
    assert CPU in [b.name for b in backends[:-1]]


def test_zipmap_outputs_become_arrays(tmp_path: Path) -> None:
    """scikit-learn classifiers export a ZipMap (a list of {label: probability}); sessions give arrays."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    model = LogisticRegression(max_iter=500).fit(features, labels)
    path = tmp_path / "iris.onnx"
    path.write_bytes(to_onnx(model, features[:1]).SerializeToString())
    session = OnnxRuntimeBackend().load(ModelArtifact(path, "onnx", "0" * 64))
    out = session.run({"X": features[:5]})
    assert out["output_probability"].shape == (5, 3) and out["output_probability"].dtype == np.float32
    np.testing.assert_allclose(out["output_probability"], model.predict_proba(features[:5]), atol=1e-5)
    assert out["output_label"].tolist() == model.predict(features[:5]).tolist()
