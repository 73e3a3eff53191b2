"""What a fresh `edge-agent` process imports for a command: a command pays at start for every module
it imports, so one that runs no model imports no runtime (docs/performance.md, "Start-up time").

Judged by the modules a real process holds when it exits (not by timings, which a shared box
makes noisy): the command runs as the console script runs it (`agent.cli:main`), in a subprocess
whose exit hook writes `sorted(sys.modules)` to a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "agent.example.yaml"

# Runs `edge-agent ARGS` in this interpreter and writes the modules it imported to $MODULES_OUT.
WRAPPER = """
import atexit, json, os, sys

def _dump():
    with open(os.environ["MODULES_OUT"], "w") as out:
        json.dump(sorted(sys.modules), out)

atexit.register(_dump)
sys.argv = ["edge-agent", *sys.argv[1:]]
from agent.cli import main
main()
"""

# The inference runtimes and what only running a model needs (decoding, tensors).
RUNTIMES = ("onnxruntime", "openvino", "cv2", "av", "ai_edge_litert", "tflite_runtime")
# What a command that neither runs a model nor reads a config has no use for either.
HEAVY = (*RUNTIMES, "numpy", "paho", "psutil", "pydantic", "pydantic_core", "providers", "agent.config")


def imported(*args: str, expect: int = 0, tmp_path: Path) -> set[str]:
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")}
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        capture_output=True, text=True, timeout=120, env={**env, "MODULES_OUT": str(out)}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == expect, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return set(json.loads(out.read_text()))


def found(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The packages of `packages` (and their submodules) that were imported."""
    return sorted(p for p in packages if any(m == p or m.startswith(p + ".") for m in modules))


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("version",),
        ("run", "--help"),
        ("config", "validate", "--help"),
        ("fleet", "deploy", "--help"),
        ("models", "--help"),
        ("infer", "--help"),
    ],
    ids=" ".join,
)
def test_help_and_version_import_no_runtime_nor_config_models(args: tuple[str, ...], tmp_path: Path) -> None:
    modules = imported(*args, tmp_path=tmp_path)
    assert found(modules, HEAVY) == []


def test_status_imports_no_runtime_nor_config_models(tmp_path: Path) -> None:
    """`status` reads the state dir out of the config and asks the daemon's socket: no config models,
    no runtime, no MQTT client (here no daemon runs: the answer is that none does, exit 1)."""
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"device": {"id": "box"}, "state_dir": str(tmp_path / "state")}))
    modules = imported("status", "-c", str(config), expect=1, tmp_path=tmp_path)
    assert found(modules, HEAVY) == []
    assert "agent.cli.status" in modules  # the command ran


def test_config_validate_imports_no_runtime(tmp_path: Path) -> None:
    """`config validate` builds the config models, and nothing that runs or decodes a model."""
    modules = imported("config", "validate", str(EXAMPLE), tmp_path=tmp_path)
    assert found(modules, (*RUNTIMES, "paho", "numpy", "psutil")) == []
    assert "agent.config" in modules  # it did validate


def test_openvino_backend_leaves_out_model_conversion_and_telemetry() -> None:
    """A daemon serving on OpenVINO imports the runtime without its model conversion API, which
    loads OpenVINO's usage telemetry (~0.1 s of a start); `ov.convert_model` still works."""
    script = """
import json, sys
import providers.openvino_backend as backend
import openvino as ov
before = sorted(m for m in sys.modules if m.startswith(("openvino.tools", "openvino_telemetry")))
devices = [b.name for b in backend.discover()]
convert = ov.convert_model.__name__
print(json.dumps({"before": before, "devices": devices, "convert": convert}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []
    assert "openvino/CPU" in seen["devices"]  # the runtime works without it
    assert seen["convert"] == "convert_model"


def test_starting_keeps_the_collector_off_then_freezes_what_it_made() -> None:
    """What a command makes while starting (modules, config models) is long-lived: the cyclic
    collector is off meanwhile and it is frozen after, so later passes skip it."""
    script = """
import gc, json
from agent.cli.common import starting
frozen = gc.get_freeze_count()
with starting():
    during = gc.isenabled()
    import agent.config
after = gc.isenabled()
print(json.dumps({"during": during, "after": after, "frozen": gc.get_freeze_count() - frozen}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["during"] is False
    assert seen["after"] is True
    assert seen["frozen"] > 10_000  # the config models and their modules


def test_config_models_build_their_validators_when_first_used() -> None:
    """Importing agent.config builds no validator; validating a config builds AgentConfig's (its
    sections inside it), not one per section model."""
    script = f"""
import json
from pathlib import Path
import agent.config as config
from agent.config_loader import load_config
models = [config.AgentConfig, config.PipelineConfig, config.MqttConfig, config.SelectionConfig]
at_import = [m.__pydantic_complete__ for m in models]
load_config(Path({str(EXAMPLE)!r}))
print(json.dumps({{"at_import": at_import, "after": [m.__pydantic_complete__ for m in models]}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEVICE_ID", "MQTT_HOST")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["at_import"] == [False, False, False, False]
    assert seen["after"] == [True, False, False, False]
