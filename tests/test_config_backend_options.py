"""Each backend's options (`backends.options.<backend name>`) are typed with the rest of agent.yaml
(agent/config/backends.py): a misspelt option or a bad value is reported by `edge-agent config
validate` with its line, like any other key, instead of when the backend loads; what the YAML gives
still reaches the backend as it did (the keys given, nothing added)."""

from __future__ import annotations

import hashlib
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.backend_choice import policy_for
from agent.cli import app
from agent.config import AgentConfig
from agent.config_loader import config_json_schema, load_config
from providers import get_backend
from providers.base import ModelArtifact
from providers.onnxruntime_backend import OnnxRuntimeBackend
from providers.openvino_backend import OpenVinoBackend
from providers.options import options_model
from providers.tflite_backend import TfliteBackend
from tests.config_cases import assert_both_accept, problems_of, write

REPO = Path(__file__).resolve().parents[1]
ORT_CPU = "onnxruntime/CPUExecutionProvider"
OPTIONS_LINE = 5  # the line of the backend's name in `_config`; its options follow


def _config(tmp_path: Path, backend: str, options: str) -> Path:
    path = tmp_path / "agent.yaml"
    body = textwrap.indent(textwrap.dedent(options).strip(), " " * 6)
    path.write_text(f"device:\n  id: box-1\nbackends:\n  options:\n    {backend}:\n{body}\n")
    return path


def test_the_config_written_here_passes_the_validator_and_the_schema(tmp_path: Path) -> None:
    path = _config(tmp_path, "onnxruntime/CPUExecutionProvider", "intra_op_threads: 2")
    assert_both_accept(path.read_text(), str(path))


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    return result.exit_code, result.output


# (backend, a misspelt key, the key meant, the keys allowed there)
TYPOS = [
    (ORT_CPU, "intra_op_thread", "intra_op_threads", "allow_spinning, inter_op_threads, intra_op_threads"),
    ("onnxruntime/XnnpackExecutionProvider", "allow_spining", "allow_spinning", None),
    ("onnxruntime/CUDAExecutionProvider", "device_ids", "device_id", None),
    ("onnxruntime/ROCMExecutionProvider", "device_idd", "device_id", None),
    ("onnxruntime/TensorrtExecutionProvider", "engine_cache_dirs", "engine_cache_dir", None),
    ("onnxruntime/OpenVINOExecutionProvider", "device_typ", "device_type", None),
    (
        "openvino/CPU",
        "hnit",
        "hint",
        "cache_dir, hint, num_streams, precision, threads, weights",
    ),
    ("openvino/GPU.1", "num_stream", "num_streams", None),
    ("tflite/cpu", "thread", "threads", "threads"),
    ("tflite/edgetpu", "devices", "device", "device, threads"),
]


@pytest.mark.parametrize(("backend", "typo", "meant", "allowed"), TYPOS, ids=[t[0] for t in TYPOS])
def test_a_misspelt_option_is_reported_with_its_line(
    tmp_path: Path, backend: str, typo: str, meant: str, allowed: str | None
) -> None:
    path = _config(tmp_path, backend, f"{typo}: 1")
    code, output = _validate(path)
    assert code == 1
    expected = (
        f"{path}:{OPTIONS_LINE + 1}: backends.options.{backend}.{typo}: unknown key; did you mean '{meant}'?"
    )
    assert expected in output, output
    if allowed is not None:
        assert f"(allowed here: {allowed})" in output


def test_every_problem_in_the_options_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        device:
          id: box-1
        backends:
          options:
            openvino/CPU: {hint: fast, threads: 0}
            onnxrutime/CPUExecutionProvider: {intra_op_threads: 2}
            tflite/gpu: {threads: 1}
            tflite/cpu:
              threads: many
        """,
    )
    assert problems_of(path) == [
        f"{path}:5: backends.options.openvino/CPU.hint: Input should be 'latency' or 'throughput' "
        "(got 'fast')",
        f"{path}:5: backends.options.openvino/CPU.threads: Input should be greater than or equal to 1 "
        "(got 0)",
        f"{path}:6: backends.options.onnxrutime/CPUExecutionProvider: no backend is called "
        "'onnxrutime/CPUExecutionProvider'; options are per backend: onnxruntime/<execution provider>, "
        "openvino/<device>, tflite/cpu or tflite/edgetpu",
        f"{path}:7: backends.options.tflite/gpu: no backend is called 'tflite/gpu'; options are per "
        "backend: onnxruntime/<execution provider>, openvino/<device>, tflite/cpu or tflite/edgetpu",
        f'{path}:9: backends.options.tflite/cpu.threads: expected a whole number, got the text "many"',
    ]


def test_options_that_are_not_a_mapping_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device: {id: box-1}\nbackends:\n  options:\n    openvino/CPU: latency\n")
    assert problems_of(path) == [
        f"{path}:4: backends.options.openvino/CPU: Input should be a valid dictionary (got 'latency')"
    ]


def test_good_options_validate_and_are_kept_as_given(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        device:
          id: box-1
        state_dir: /var/lib/edge-agent
        backends:
          options:
            onnxruntime/CPUExecutionProvider: {intra_op_threads: 1, allow_spinning: false}
            onnxruntime/TensorrtExecutionProvider: {fp16: true, device_id: 1, timing_cache_dir: /srv/trt}
            onnxruntime/OpenVINOExecutionProvider: {device_type: GPU}
            openvino/CPU: {hint: throughput, precision: f32, num_streams: 2, threads: 2}
            openvino/AUTO: {cache_dir: /srv/ov}
            tflite/cpu: {threads: 2}
            tflite/edgetpu: {device: "usb:0"}
        """,
    )
    code, output = _validate(path)
    assert code == 0, output
    config = load_config(path, environ={})
    given = {
        ORT_CPU: {"intra_op_threads": 1, "allow_spinning": False},
        "onnxruntime/TensorrtExecutionProvider": {
            "fp16": True,
            "device_id": 1,
            "timing_cache_dir": "/srv/trt",
        },
        "onnxruntime/OpenVINOExecutionProvider": {"device_type": "GPU"},
        "openvino/CPU": {"hint": "throughput", "precision": "f32", "num_streams": 2, "threads": 2},
        "openvino/AUTO": {"cache_dir": "/srv/ov"},
        "tflite/cpu": {"threads": 2},
        "tflite/edgetpu": {"device": "usb:0"},
    }
    assert config.backends.options == given  # the keys given, no defaults filled in
    # ... and so handed to the backends (with the cache dirs the agent adds where none is given).
    policy = policy_for(config, backends=[])
    for backend, options in given.items():
        assert policy.options_for(backend) == options


def test_an_option_given_reaches_a_real_onnxruntime_session(tmp_path: Path, cls_model_path: Path) -> None:
    path = _config(tmp_path, ORT_CPU, "{intra_op_threads: 1, inter_op_threads: 1}")
    policy = policy_for(load_config(path, environ={}), backends=[])
    artifact = ModelArtifact(cls_model_path, "onnx", hashlib.sha256(cls_model_path.read_bytes()).hexdigest())
    session = get_backend(ORT_CPU).load(artifact, policy.options_for(ORT_CPU))
    try:
        used = session._session.get_session_options()  # type: ignore[attr-defined]
        assert (used.intra_op_num_threads, used.inter_op_num_threads) == (1, 1)
    finally:
        session.close()


@pytest.mark.parametrize("backend", sorted({t[0] for t in TYPOS}))
def test_the_config_checks_options_with_the_backends_own_model(backend: str) -> None:
    """One model per backend's options: what `config validate` checks is what the backend loads with."""
    runtime, _, device = backend.partition("/")
    backend_class = {"onnxruntime": OnnxRuntimeBackend, "openvino": OpenVinoBackend, "tflite": TfliteBackend}
    assert options_model(backend) is backend_class[runtime](device).options_model


def test_the_schema_gives_each_backend_name_its_options() -> None:
    options = config_json_schema()["$defs"]["SelectionConfig"]["properties"]["options"]
    names = re.compile(options["propertyNames"]["pattern"])
    for backend, *_ in TYPOS:
        assert names.search(backend), backend
        matching = [
            schema for pattern, schema in options["patternProperties"].items() if re.search(pattern, backend)
        ]
        assert len(matching) == 1, backend  # the patterns exclude each other
        model = options_model(backend)
        assert model is not None
        assert set(matching[0]["properties"]) == set(model.model_fields)
        assert matching[0]["additionalProperties"] is False
    for wrong in ("onnxrutime/CPUExecutionProvider", "tflite/gpu", "openvino", "openvino/"):
        assert not names.search(wrong), wrong


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_still_validate(tmp_path: Path, path: Path) -> None:
    # demo.yaml is a template: scripts/demo.sh fills in @PORT@ and @WORK@.
    text = path.read_text(encoding="utf-8").replace("@PORT@", "1883").replace("@WORK@", str(tmp_path))
    filled = tmp_path / path.name
    filled.write_text(text, encoding="utf-8")
    assert isinstance(load_config(filled, environ={}), AgentConfig)
    code, output = _validate(filled)
    assert code == 0, output
