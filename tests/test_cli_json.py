"""The CLI's JSON stays what scripts know while its code moves: every command that has `--json` is
run (in process, through Typer's CliRunner) on real models, a file registry, a rendered video, a
real `edge-agent run` and a real mosquitto on loopback, and the SHAPE of what it printed is
compared with tests/fixtures/cli_json.json: every key path with the JSON type of its value (list
items merged, `[]` in the path), the values that are the same on every machine (enums, booleans,
names; paths under the test's own directory as `<tmp>/...`), and the exit code. Numbers, times,
digests, versions and whatever else depends on the machine are recorded by their type only.

A change to a command's JSON is a change to the fixture too: rerun with EDGE_AGENT_UPDATE_CLI_JSON=1
to write it, and read the diff before committing it."""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as paho
import pytest
import typer
import yaml
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from agent.cli import app
from agent.control import NotRunning, ask, socket_path
from agent.registry import FileRegistry
from tests.agent_process import StartAgent
from tests.config_cases import assert_both_accept
from tests.fleet_fixtures import GOOD, MODEL, pipeline_body
from tests.media_fixtures import astronaut_bgr, demo_video_module
from tests.media_fixtures import yolo_path as yolo_path  # a fixture
from tests.mosquitto import Mosquitto
from tests.waits import free_port, wait_until

SNAPSHOT = Path(__file__).parent / "fixtures" / "cli_json.json"
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
VERSION, DEVICE = GOOD, "json-box"
CPU_BACKEND = "onnxruntime/CPUExecutionProvider"
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
SITE_PACKAGES = sysconfig.get_paths()["purelib"]  # where the real test models come from

# Commands with --json that this test does not run, and why (the test below checks the list is whole).
NOT_COVERED: dict[str, str] = {
    # A salted hash of a password on stdin (the recorder passes none): tests/test_cli_web.py checks it.
    "web hash-password": "its JSON is checked by tests/test_cli_web.py",
}

# Paths (fnmatch patterns over "a.b[].c") whose values depend on the machine, the run or the clock:
# "type" keeps only their JSON type, "subtree" keeps the type and drops what is under it, "any" keeps
# only that the key is there (its type may differ between machines too).
Volatile = dict[str, str]
SIGNING: Volatile = {"signed_by": "type", "key_id": "type", "*.signed_by": "type", "*.key_id": "type"}
MANIFEST: Volatile = {"created": "type", **SIGNING}
BACKEND_ROWS: Volatile = {
    # Which backends this box has, and what each says, differ between machines.
    "*.available": "type",
    "*.reason": "any",
    "*.versions": "subtree",
    "*.devices": "subtree",
    "*.supported": "type",
    "*.precision": "any",
    "*.error": "any",
}
# What a box would choose depends on the backends it has: the choice's why names them all.
CHOICE: Volatile = {"*.why": "type", "*.backend_why": "type", "*.proof": "any"}
STATUS: Volatile = {
    **CHOICE,
    "agent_version": "type",
    "config.sha256": "type",  # of a file naming the test's own paths
    "*.last_error": "any",
    "*.last_outage_s": "any",
    "outbox.oldest_age_s": "any",
    "registry.state": "type",
    "registry.error": "any",
    "mqtt.subscriptions.*": "type",
    "sessions[].batching.*": "any",  # measuring, then decided: a matter of how many frames so far
}
FLEET: Volatile = {**STATUS, "*.agent_version": "type", "*.since": "type", "*.last_seen": "type"}


def shape(
    value: Any, volatile: Volatile, stable: Callable[[str], str], path: str = ""
) -> dict[str, set[str]]:
    """{key path: {what is there}} for a parsed JSON value."""
    found: dict[str, set[str]] = {}

    def add(where: str, what: str) -> None:
        found.setdefault(where or "$", set()).add(what)

    def walk(item: Any, where: str) -> None:
        mode = next((m for pattern, m in volatile.items() if fnmatch.fnmatchcase(where, pattern)), None)
        kind = json_type(item)
        if mode == "any":
            add(where, "present")
            return
        if isinstance(item, dict):
            add(where, "object")
            if mode != "subtree":
                for key, sub in item.items():
                    walk(sub, f"{where}.{key}" if where else str(key))
        elif isinstance(item, list):
            add(where, "array")
            if mode != "subtree":
                for sub in item:
                    walk(sub, f"{where}[]")
        elif mode is not None or kind == "number":
            add(where, kind)
        elif isinstance(item, str):
            add(
                where,
                "string (a time)" if ISO_TIME.match(item) else f"string {json.dumps(stable(item))}",
            )
        else:
            add(where, json.dumps(item))  # true, false, null

    walk(value, path)
    return found


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def stable(text: str, tmp: str) -> str:
    return text.replace(tmp, "<tmp>").replace(SITE_PACKAGES, "<site-packages>")


class Recorder:
    """Runs commands in process and keeps each one's exit code and the shape of its JSON."""

    def __init__(self, tmp: Path, **names: str) -> None:
        self.tmp = str(tmp)
        self.names = {value: f"<{name}>" for name, value in names.items()}  # e.g. broker="127.0.0.1:1883"
        self.runner = CliRunner()
        self.cases: dict[str, dict[str, Any]] = {}

    def stable(self, text: str) -> str:
        for value, name in self.names.items():
            text = text.replace(value, name)
        return stable(text, self.tmp)

    def json(self, case: str, *args: str, exit_code: int = 0, volatile: Volatile | None = None) -> Any:
        result = self.runner.invoke(app, [*args, "--json"], env=ENV, prog_name="edge-agent")
        output = result.stdout
        assert result.exit_code == exit_code, (
            case,
            result.exit_code,
            result.output[-3000:],
            result.exception,
        )
        try:
            data = json.loads(output)
        except ValueError:
            raise AssertionError(f"{case}: not JSON:\n{output[-3000:]}") from None
        found = shape(data, volatile or {}, self.stable)
        self.cases[case] = {
            "command": " ".join(self.stable(a) for a in args) + " --json",
            "exit_code": result.exit_code,
            "shape": {path: sorted(what) for path, what in sorted(found.items())},
        }
        return data


def json_commands() -> set[str]:
    """Every command of `edge-agent` that has a --json option, as the words typed after it."""
    found: set[str] = set()

    def walk(command: Any, path: list[str]) -> None:
        if any("--json" in getattr(p, "opts", []) for p in getattr(command, "params", [])):
            found.add(" ".join(path))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


# --- the world the commands run in ---------------------------------------------------------------


def write_config(path: Path, tmp: Path, port: int, registry: Path, video: Path, fps: float = 10.0) -> Path:
    config = {
        "device": {"id": DEVICE, "groups": ["lobby"]},
        "state_dir": str(tmp / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "telemetry": {"interval_s": 0},
        "pipelines": [{"name": "cam", **cam_pipeline(video, fps)}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cam_pipeline(video: Path, fps: float) -> dict[str, Any]:
    """The fleet tests' `cam` pipeline (scripts/fleet_agents.py), on the CPU backend every box has."""
    return {**pipeline_body(VERSION, video, fps), "backend": {"prefer": [CPU_BACKEND]}}


def test_the_config_written_here_passes_the_validator_and_the_schema(tmp_path: Path) -> None:
    path = write_config(tmp_path / "agent.yaml", tmp_path, 1883, tmp_path / "registry", tmp_path / "v.mp4")
    assert_both_accept(path.read_text(), str(path))


def status_with_fps(state_dir: Path) -> bool:
    try:
        cam = ask(socket_path(state_dir), "status", timeout=10)["status"]["pipelines"]["cam"]
    except (NotRunning, KeyError):
        return False
    return bool(cam.get("fps")) and (cam.get("latency_ms") or {}).get("capture_to_result") is not None


@pytest.fixture
def media(tmp_path: Path) -> tuple[Path, Path]:
    """A rendered video of signs (10 fps, about 2 s) and a .npz of inputs for the cls model."""
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.25)
    tests = tmp_path / "tests.npz"
    np.savez(tests, x=np.random.default_rng(3).random((1, 3, 48, 192), dtype=np.float32))
    return video, tests


def compare(cases: dict[str, dict[str, Any]]) -> None:
    """These cases against the fixture's (EDGE_AGENT_UPDATE_CLI_JSON=1: write them into it first)."""
    everything = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.is_file() else {"cases": {}}
    if os.environ.get("EDGE_AGENT_UPDATE_CLI_JSON") == "1":
        everything["cases"] = dict(sorted({**everything["cases"], **cases}.items()))
        SNAPSHOT.write_text(json.dumps(everything, indent=1) + "\n")
    recorded = {name: everything["cases"].get(name) for name in cases}
    before, now = (
        json.dumps(c, indent=1, sort_keys=True).splitlines(keepends=True) for c in (recorded, cases)
    )
    diff = "".join(difflib.unified_diff(before, now, "recorded", "now", n=3))
    assert not diff, f"the CLI's JSON changed (EDGE_AGENT_UPDATE_CLI_JSON=1 records it):\n{diff[:8000]}"


def test_every_json_command_is_covered() -> None:
    """Each command with --json is run below (or listed in NOT_COVERED with the reason)."""
    recorded = json.loads(SNAPSHOT.read_text())["cases"]
    run = {case["command"].split(" <")[0].split(" /")[0] for case in recorded.values()}
    covered = {name for name in json_commands() if any(r == name or r.startswith(name + " ") for r in run)}
    assert json_commands() - covered == set(NOT_COVERED), sorted(json_commands() - covered)


@pytest.mark.slow
def test_the_operators_commands_json_is_as_recorded(
    tmp_path: Path,
    cls_model_path: Path,
    yolo_path: Path,
    media: tuple[Path, Path],
    mosquitto: Mosquitto,
    start_agent: StartAgent,
) -> None:
    cli = Recorder(tmp_path)
    video, tests = media
    registry = tmp_path / "registry"
    url = f"file://{registry}"
    ref = f"{MODEL}@{VERSION}"

    # registry
    key, other = tmp_path / "keys" / "signer", tmp_path / "keys" / "second"
    key.parent.mkdir()
    cli.json("registry keygen", "registry", "keygen", str(key), volatile=SIGNING)
    cli.json("registry keygen (exists)", "registry", "keygen", str(key), exit_code=1)
    cli.json("registry keygen (second key)", "registry", "keygen", str(other), volatile=SIGNING)
    publish = (
        "registry",
        "publish",
        str(cls_model_path),
        "--name",
        MODEL,
        "--version",
        VERSION,
        "--registry",
        url,
    )
    cli.json("registry publish", *publish, "--sign", str(key), volatile=MANIFEST)
    cli.json("registry publish (exists)", *publish, exit_code=1)
    cli.json(
        "registry sign", "registry", "sign", ref, "--registry", url, "--key", str(other), volatile=SIGNING
    )

    # config
    config = write_config(tmp_path / "agent.yaml", tmp_path, mosquitto.port, registry, video)
    slower = write_config(tmp_path / "slower.yaml", tmp_path, mosquitto.port, registry, video, fps=5.0)
    cli.json("config validate", "config", "validate", str(config))
    broken = tmp_path / "broken.yaml"
    broken.write_text("device:\n  id: box\nmqtt:\n  port: 99999\n")
    cli.json("config validate (invalid)", "config", "validate", str(broken), exit_code=1)
    cli.json("config diff", "config", "diff", str(slower), "--against", str(config))
    cli.json("config diff (nothing ran yet)", "config", "diff", str(slower), exit_code=1)

    # models
    cli.json("models pull", "models", "pull", "-c", str(config))
    cli.json("models list", "models", "list", "-c", str(config), volatile=SIGNING)
    cli.json("models verify", "models", "verify", "-c", str(config), volatile=SIGNING)
    cli.json("models check", "models", "check", ref, "-c", str(config), volatile=BACKEND_ROWS)
    cli.json("models inspect", "models", "inspect", ref, "-c", str(config), volatile=MANIFEST)
    validate = {
        **BACKEND_ROWS,
        **CHOICE,
        "candidates[].backend": "type",
        "activated": "type",
        "decision": "type",
    }
    cli.json("models validate", "models", "validate", ref, "--test-data", str(tests), "-c", str(config),
             volatile=validate)  # fmt: skip
    cli.json("models gc", "models", "gc", "--keep", "1", "--dry-run", "-c", str(config))
    cli.json("models rm (in use)", "models", "rm", ref, "-c", str(config), exit_code=1)

    # backends
    cli.json("providers", "providers", volatile={"hardware": "subtree", **BACKEND_ROWS})
    cli.json("explain (pipeline)", "explain", "cam", "-c", str(config), volatile={**BACKEND_ROWS, **CHOICE})
    chosen = {"[].decision.backend": "type", "[].serving.backend": "type"}  # no pipeline prefers one
    cli.json("explain (model file)", "explain", str(cls_model_path), "-c", str(config),
             volatile={**BACKEND_ROWS, **CHOICE, **chosen})  # fmt: skip
    cli.json(
        "bench",
        "bench", str(cls_model_path), "--backend", CPU_BACKEND, "--runs", "3", "--warmup", "1",
        "-c", str(config),
        volatile={**BACKEND_ROWS, **CHOICE, "choice.backend": "type"},
    )  # fmt: skip
    photo = tmp_path / "astronaut.png"
    assert cv2.imwrite(str(photo), astronaut_bgr())
    cli.json(
        "infer (detector, image)",
        "infer", str(yolo_path), str(photo), "--backend", CPU_BACKEND, "-c", str(config),
        volatile={**BACKEND_ROWS, "output.detections[].label": "type"},
    )  # fmt: skip
    cli.json(
        "infer (pipeline, video frame)",
        "infer", ref, str(video), "--pipeline", "cam", "--frame", "3", "-c", str(config),
        volatile=BACKEND_ROWS,
    )  # fmt: skip

    # source: the whole file (the check ends with it), a pipeline's looping file, a missing file
    cli.json("source (file)", "source", str(video), "--seconds", "60", "-c", str(tmp_path / "none.yaml"))
    cli.json("source (pipeline)", "source", "cam", "--seconds", "2", "-c", str(config))
    cli.json("source (missing)", "source", str(tmp_path / "missing.mp4"), "--seconds", "1", exit_code=1)

    # doctor: a broker that refuses is a FAIL (exit 2) on every machine
    closed = write_config(tmp_path / "closed.yaml", tmp_path, free_port(), registry, video)
    doctor = {"checks[].status": "type", "checks[].detail": "type", "checks[].fix": "type"}
    cli.json("doctor", "doctor", "-c", str(closed), "--timeout", "3", exit_code=2, volatile=doctor)

    # status, without and with a daemon
    cli.json("status (none running)", "status", "-c", str(config), exit_code=1)
    agent = start_agent(config)
    wait_until(lambda: status_with_fps(tmp_path / "state"), "a live rate in status", timeout=120)
    cli.json("status", "status", "-c", str(config), volatile=STATUS)
    agent.stop()
    cli.json("models rm", "models", "rm", ref, "--state-dir", str(tmp_path / "state"))
    compare(cli.cases)


@pytest.mark.slow
def test_the_fleet_commands_json_is_as_recorded(
    tmp_path: Path,
    cls_model_path: Path,
    media: tuple[Path, Path],
    mosquitto: Mosquitto,
    start_agent: StartAgent,
) -> None:
    refused = ("--broker", f"127.0.0.1:{free_port()}")
    broker = ("--broker", f"{mosquitto.host}:{mosquitto.port}")
    cli = Recorder(tmp_path, broker=broker[1], closed_port=refused[1])
    video, _ = media
    registry = tmp_path / "registry"
    FileRegistry(registry).publish(cls_model_path, MODEL, VERSION)
    config = write_config(tmp_path / "agent.yaml", tmp_path, mosquitto.port, registry, video)
    cli.json("fleet status (no devices)", "fleet", "status", *broker, "--timeout", "1")
    cli.json("fleet status (no broker)", "fleet", "status", *refused, "--timeout", "1", exit_code=3)

    agent = start_agent(config)
    wait_until(lambda: status_with_fps(tmp_path / "state"), "the agent serving cam", timeout=120)
    cli.json("fleet cmd", "fleet", "cmd", DEVICE, "ping", *broker, "--timeout", "30", volatile=FLEET)
    cli.json("fleet cmd (unknown)", "fleet", "cmd", DEVICE, "reboot-now", *broker, "--timeout", "30",
             exit_code=4, volatile=FLEET)  # fmt: skip
    spec = tmp_path / "spec.yaml"
    cam = {"name": "cam", **cam_pipeline(video, 5.0)}
    spec.write_text(yaml.safe_dump({"pipelines": [cam], "health": {"window_s": 1, "min_frames": 2}}))
    cli.json("fleet deploy", "fleet", "deploy", str(spec), "--device", DEVICE, *broker, "--timeout", "120",
             volatile=FLEET)  # fmt: skip
    cli.json("fleet status", "fleet", "status", *broker, "--timeout", "5", volatile=FLEET)
    cli.json("fleet rollback", "fleet", "rollback", "--device", DEVICE, "--no-wait", *broker, volatile=FLEET)
    agent.stop()
    compare(cli.cases)


def test_the_watch_commands_json_is_as_recorded(tmp_path: Path, mosquitto: Mosquitto) -> None:
    """`watch --json` prints JSON Lines; with --count 1 one object: a result published (retained, so
    it is there when watch subscribes) on the device's results topic."""
    closed = f"127.0.0.1:{free_port()}"
    cli = Recorder(tmp_path, closed=closed)
    config, down = tmp_path / "agent.yaml", tmp_path / "down.yaml"
    for path, port in ((config, mosquitto.port), (down, int(closed.rsplit(":", 1)[1]))):
        mqtt_settings = {"host": "127.0.0.1", "port": port}
        path.write_text(
            yaml.safe_dump({"device": {"id": DEVICE}, "state_dir": str(tmp_path), "mqtt": mqtt_settings})
        )
    top = [{"index": 1, "label": "upside-down", "score": 0.98}]
    result = {"device": DEVICE, "pipeline": "cam", "seq": 1, "output": {"top": top}}
    publisher = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    publisher.connect(mosquitto.host, mosquitto.port)
    publisher.loop_start()
    try:
        message = publisher.publish(f"edge/{DEVICE}/results/cam", json.dumps(result), qos=1, retain=True)
        message.wait_for_publish(10)
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    cli.json("watch", "watch", "-c", str(config), "--count", "1", "--seconds", "30")
    cli.json("watch (no broker)", "watch", "-c", str(down), exit_code=1)
    compare(cli.cases)
