"""`edge-agent run` as a user runs it, against a real mosquitto that wants a login: the broker
password comes from mqtt.password_file, an MQTT sensor source logs in with an inline password, and
neither secret shows anywhere a person or another program reads: the agent's log (at debug), its
status.json, what it publishes (status and reported state, retained; telemetry; results) and what
the CLI prints about the config. The state dir and everything the daemon puts in it is owner-only,
and a state dir left open by an older agent is tightened, with a warning that says so."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
import paho.mqtt.client as mqtt
import pytest
import yaml
from onnx import TensorProto, helper
from paho.mqtt.enums import CallbackAPIVersion

from tests.agent_process import EDGE_AGENT, StartAgent, pipeline_state, read_status
from tests.mosquitto import Mosquitto, Subscriber
from tests.pki import run_tool, tool
from tests.waits import wait_until

DEVICE = "sec-box"
AGENT_USER, AGENT_SECRET = "edge-box", "agent-Pw-7f3kQ9vX"  # throwaway test credentials
SENSOR_USER, SENSOR_SECRET = "sensors", "sensor-Pw-2mZx81Lc"
SECRETS = (AGENT_SECRET, SENSOR_SECRET)
WINDOW = 4
SENSOR_TOPIC = "plant/vib"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """mosquitto that refuses anonymous clients; the agent and the sensors each have a login."""
    passwd = tool("mosquitto_passwd", "mosquitto")
    users = tmp_path / "mosquitto-passwd"
    run_tool([passwd, "-b", "-c", str(users), AGENT_USER, AGENT_SECRET], tmp_path)
    run_tool([passwd, "-b", str(users), SENSOR_USER, SENSOR_SECRET], tmp_path)
    os.chmod(users, 0o600)
    made = Mosquitto(tmp_path / "mosquitto", allow_anonymous=False, extra_config=f"password_file {users}")
    made.start()
    try:
        yield made
    finally:
        made.close()


def _mean_model(path: Path) -> Path:
    """A real ONNX graph: the mean of a window of values ([1, WINDOW] -> [1, 1])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WINDOW])
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 1])
    node = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1)
    graph = helper.make_graph([node], "window-mean", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


def _config(tmp_path: Path, broker: Mosquitto, password_file: Path) -> Path:
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(tmp_path / "state"),
        "log_level": "debug",  # the most the log ever says
        "mqtt": {
            "host": broker.host,
            "port": broker.port,
            "username": AGENT_USER,
            "password_file": str(password_file),
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
        },
        "telemetry": {"interval_s": 1},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "pipelines": [
            {
                "name": "vib",
                "model": {"path": str(_mean_model(tmp_path / "mean.onnx"))},
                "source": {
                    "type": "mqtt",
                    "topic": SENSOR_TOPIC,
                    "host": broker.host,
                    "port": broker.port,
                    "username": SENSOR_USER,
                    "password": SENSOR_SECRET,
                    "window": WINDOW,
                    "reopen_min_s": 0.2,
                    "reopen_max_s": 1.0,
                },
                "preprocess": {"type": "series"},
                "postprocess": {"type": "raw"},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _open_modes(state_dir: Path) -> dict[str, str]:
    """Everything under `state_dir` (itself included: ".") that group or others may use: path -> mode.
    os.walk skips what vanishes meanwhile (temp files renamed into place)."""
    paths = [state_dir]
    for root, dirs, files in os.walk(state_dir):
        paths.extend(Path(root) / name for name in (*dirs, *files))
    found: dict[str, str] = {}
    for path in paths:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if mode & 0o077 and not stat.S_ISLNK(mode):
            found[str(path.relative_to(state_dir))] = f"{stat.S_IMODE(mode):04o}"
    return found


def _cli(*args: str) -> str:
    done = subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.slow
def test_passwords_stay_secret_and_the_state_dir_is_owner_only(
    tmp_path: Path, broker: Mosquitto, start_agent: StartAgent
) -> None:
    password_file = tmp_path / "mqtt.pw"
    password_file.write_text(AGENT_SECRET + "\n")  # as `echo ... > file` writes it
    os.chmod(password_file, 0o600)
    config = _config(tmp_path, broker, password_file)
    # A state dir an older agent (or a person) left open, with a file readable by all.
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o755)
    (state_dir / "notes.txt").write_text("left by hand\n")
    os.chmod(state_dir / "notes.txt", 0o644)

    everything = Subscriber(broker.host, broker.port, "#", username=AGENT_USER, password=AGENT_SECRET)
    sensors = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sensor-{time.monotonic_ns()}")
    sensors.username_pw_set(SENSOR_USER, SENSOR_SECRET)
    sensors.connect(broker.host, broker.port, keepalive=10)
    sensors.loop_start()
    agent = start_agent(config)
    try:

        def topics() -> set[str]:
            return {m.topic.split("/", 2)[-1] for m in everything.messages if m.topic.startswith("edge/")}

        def results() -> int:
            return sum(1 for m in everything.messages if "/results/" in m.topic)

        # The agent logged in with the password from the file, the source with its own password.
        wait_until(
            lambda: (
                pipeline_state(state_dir, "vib") == "running"
                and read_status(state_dir).get("pipelines", {}).get("vib", {}).get("source", {}).get("state")
                == "streaming"
            ),
            "the sensor pipeline running and subscribed",
            timeout=180,
            interval=0.2,
            state=lambda: agent.log()[-3000:],
        )
        deadline = time.monotonic() + 120
        while results() < 3 or not {"status", "reported", "telemetry"} <= topics():
            assert time.monotonic() < deadline, (topics(), results(), agent.log()[-3000:])
            assert agent.poll() is None, agent.log()[-3000:]
            sensors.publish(SENSOR_TOPIC, "1, 2, 3, 4", qos=1).wait_for_publish(timeout=30)
            time.sleep(0.2)
        wait_until(
            lambda: (
                {"outbox.sequences.json", "pipelines.json", "status.json"}
                <= {p.name for p in state_dir.iterdir()}
            ),
            "the daemon's state files",
            timeout=60,
        )
        running = _open_modes(state_dir)  # with the outbox's -wal and -shm open
        names_running = {str(p.relative_to(state_dir)) for p in state_dir.rglob("*")}
        log = agent.stop()
    finally:
        sensors.disconnect()
        sensors.loop_stop()
        everything.close()

    # --- the state dir: owner only, while running and after the stop ------------------------------
    assert {"outbox.sqlite", "outbox.sqlite-wal", "outbox.sqlite-shm", "agent.lock"} <= names_running
    assert any(n.startswith("store/") for n in names_running)
    assert running == {}, running
    assert _open_modes(state_dir) == {}
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "notes.txt").stat().st_mode) == 0o600
    fixed = [line for line in log.splitlines() if "removed group and other access" in line]
    assert len(fixed) == 1 and "WARNING" in fixed[0], fixed
    assert "the dir was 0755, now 0700" in fixed[0] and "notes.txt" in fixed[0]

    # --- no secret in the log, status.json, anything published, or the CLI's output ---------------
    published = [f"{m.topic} {m.payload.decode(errors='replace')}" for m in everything.messages]
    assert any("/results/" in p for p in published) and any(
        p.startswith(f"edge/{DEVICE}/reported ") for p in published
    )
    status = (state_dir / "status.json").read_text()
    assert json.loads(status)["mqtt"]["connects"] >= 1
    cli = [
        _cli("config", "validate", str(config)),
        _cli("config", "validate", "--json", str(config)),
        _cli("config", "schema"),
        _cli("source", "vib", "-c", str(config), "--seconds", "2", "--json"),
    ]
    assert "OK:" in cli[0] and json.loads(cli[1])["ok"] is True
    checked = json.loads(cli[3])  # the source check ran, and its login was not refused
    assert checked["kind"] == "mqtt" and checked["stats"]["error"] is None, checked
    # The daemon's own state files, but pipelines.json: the last good version of each pipeline, kept
    # to fall back to, so with its source's inline password (owner-only, like the desired state).
    state_files = {
        str(p.relative_to(state_dir)): p.read_bytes().decode(errors="replace")
        for p in state_dir.rglob("*")
        if p.is_file() and p.suffix in (".json", ".txt")
    }
    memory = state_files.pop("pipelines.json")
    assert SENSOR_SECRET in memory and AGENT_SECRET not in memory
    for secret in SECRETS:
        assert secret not in log
        assert secret not in status
        assert not [p for p in published if secret in p]
        assert not [text for text in cli if secret in text]
        assert not [name for name, text in state_files.items() if secret in text]
    assert "**********" not in log  # not even masked: the config is never logged


def test_a_password_file_that_cannot_be_read_stops_the_start_with_a_clear_error(
    tmp_path: Path, broker: Mosquitto
) -> None:
    missing = tmp_path / "no-such.pw"
    config = _config(tmp_path, broker, missing)
    done = subprocess.run([EDGE_AGENT, "run", "-c", str(config), "--duration", "5"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"error: mqtt.password_file: cannot read {missing}: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr
