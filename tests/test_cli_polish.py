"""What a new user trips over first: `--version`, help without type noise, one clear error for a
file that is no model, `run --duration` failing when no pipeline ran, a looping file logged once,
no runtime chatter on stderr. Real `edge-agent` subprocesses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import __version__
from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.config_cases import assert_both_accept
from tests.waits import free_port


def edge_agent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_version_and_help() -> None:
    assert edge_agent("--version").stdout.strip() == f"edge-agent {__version__}"
    for command in ([], ["status"], ["models", "check"], ["run"]):
        shown = edge_agent(*command, "--help").stdout
        assert "--help" in shown and "<bool>" not in shown, shown
    assert "--install-completion" in edge_agent("--help").stdout


def test_a_file_that_is_no_model_is_one_clear_error(tmp_path: Path) -> None:
    for name, content in (("text.onnx", b"hello\n"), ("empty.onnx", b""), ("fake.tflite", b"\0" * 64),
                          ("page.xml", b"{}")):  # fmt: skip
        path = tmp_path / name
        path.write_bytes(content)
        done = edge_agent("models", "check", str(path))
        assert done.returncode == 1, (name, done.stdout[-500:])
        assert done.stdout == "" and done.stderr.startswith(f"error: {name}"), done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr  # no runtime's parse errors besides


def _config(tmp_path: Path, pipelines: list[dict[str, Any]]) -> Path:
    config = {
        "device": {"id": "polish-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": free_port()},  # nothing listens: results queue
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": pipelines,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_config_written_here_passes_the_validator_and_the_schema(tmp_path: Path) -> None:
    local = {
        "name": "cam",
        "model": {"path": str(tmp_path / "m.onnx")},
        "source": {"type": "video", "uri": str(tmp_path / "v.mp4"), "loop": True},
        "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
    }
    path = _config(tmp_path, [local])
    assert_both_accept(path.read_text(), str(path))


@pytest.mark.slow
def test_run_fails_when_no_pipeline_ran(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    pipeline = {
        "name": "cam",
        "model": {"path": str(broken)},
        "source": {"type": "video", "uri": str(tmp_path / "missing.mp4")},
        "postprocess": {"type": "classification"},
    }
    done = edge_agent("run", "-c", str(_config(tmp_path, [pipeline])), "--duration", "4")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "error: no pipeline ran: cam: " in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_looping_file_is_logged_opened_once_and_stderr_has_no_runtime_noise(
    tmp_path: Path,
    cls_model_path: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    pipeline = {
        "name": "cam",
        "model": {"path": str(cls_model_path)},
        "source": {"type": "video", "uri": str(video[0]), "loop": True, "fps": 1000},
        "preprocess": {"resize": {"width": 192, "height": 48}, "mean": [0.5] * 3, "std": [0.5] * 3},
        "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
        "backend": {"prefer": ["tflite/cpu", "onnxruntime/CPUExecutionProvider"]},
    }
    agent = start_agent(_config(tmp_path, [pipeline]))

    def decoded() -> int:
        cam = read_status(tmp_path / "state").get("pipelines", {}).get("cam", {})
        return int(cam.get("source", {}).get("frames_decoded") or 0)

    # Until the 60-frame file has gone round more than once (however long the start takes).
    log = agent.run_until(lambda: decoded() > 60, "the looping file's second round")
    assert log.count(f"source cam: opened {video[0]}") == 1, log[-3000:]
    assert "XNNPACK" not in log and "[ WARN:" not in log


def test_explain_says_where_a_pipeline_would_run_before_any_run(tmp_path: Path, cls_model_path: Path) -> None:
    pipeline = {
        "name": "door",
        "model": {"path": str(cls_model_path)},
        "source": {"type": "video", "uri": str(tmp_path / "later.mp4")},
        "postprocess": {"type": "classification"},
    }
    config = _config(tmp_path, [pipeline])
    done = edge_agent("explain", "door", "-c", str(config), "--json")
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)
    assert record["prospective"] is True and record["pipeline"] == "door"
    decision = record["decision"]
    verdicts = {c["backend"]: c["verdict"] for c in decision["candidates"]}
    assert verdicts[decision["backend"]] == "chosen" and decision["checked"] is False
    assert "onnxruntime/CPUExecutionProvider" in verdicts  # every backend of this box is listed
    shown = edge_agent("explain", "door", "-c", str(config))
    first = f"door ({cls_model_path}): would serve first on {decision['backend']}"
    assert first in shown.stdout.replace("\n", "")
    unknown = edge_agent("explain", "gate", "-c", str(config))
    assert unknown.returncode == 1 and "no pipeline 'gate' in" in unknown.stderr


def test_json_lines_logs(tmp_path: Path) -> None:
    config = _config(tmp_path, [])
    done = edge_agent("run", "-c", str(config), "--duration", "1", "--log-format", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(entry) for entry in lines)
    messages = [e["message"] for e in lines]
    assert any(m.startswith("edge-agent ") and "running as polish-box" in m for m in messages), messages
    assert all(e["time"].endswith("Z") for e in lines)
