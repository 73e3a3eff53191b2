"""`edge-agent status`: the control socket (agent/control.py) on its own, then asked of a real
`edge-agent run` on a looping video with a real mosquitto, and after it stopped."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.control import ControlServer, NotRunning, ask
from agent.pipeline_stats import live_rates
from agent.status import Latency, Percentiles, Rates
from tests.agent_process import EDGE_AGENT, StartAgent
from tests.fleet_fixtures import GOOD, MODEL, agent_config, pipeline_body, publish_fleet_versions
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

DEVICE = "status-box"


def edge_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=60, check=False)


# --- the socket ----------------------------------------------------------------------------------


def test_the_socket_answers_status_and_refuses_anything_else(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    asked = []

    def status() -> dict[str, Any]:
        asked.append(1)
        return {"device": "box", "n": len(asked)}

    server = ControlServer(path, {"status": status})
    assert server.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert ask(path, "status") == {"ok": True, "status": {"device": "box", "n": 1}}
        with pytest.raises(NotRunning, match="unknown command 'reboot'; known: status"):
            ask(path, "reboot")
        for garbage in (b"status\n", b"\xff\xfe\n", b'["status"]\n', b"x" * 5000 + b"\n", b""):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(str(path))
                client.sendall(garbage)
                client.shutdown(socket.SHUT_WR)
                reply = json.loads(client.recv(65536))
            assert reply["ok"] is False and reply["error"], (garbage[:20], reply)
        assert ask(path, "status")["status"]["n"] == 2  # still serving after every bad request
    finally:
        server.stop()
    assert not path.exists()
    with pytest.raises(NotRunning, match="no edge-agent is running here"):
        ask(path, "status")


def test_a_dead_daemons_socket_is_replaced_and_reported_as_not_running(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: a daemon that was killed
    with pytest.raises(NotRunning, match="no edge-agent is running here"):
        ask(path, "status")
    server = ControlServer(path, {"status": lambda: {"fresh": True}})
    assert server.start()
    try:
        assert ask(path, "status")["status"] == {"fresh": True}
    finally:
        server.stop()


def test_a_state_dir_too_deep_for_a_socket_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.control")
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    server = ControlServer(deep / "agent.sock", {"status": dict})
    assert server.start() is False
    assert "longer than a unix socket path may be" in caplog.text
    server.stop()


def test_live_rates_from_the_last_inferences() -> None:
    now = 1000.0
    # 3 s of a 10 fps pipeline, inference 5-14 ms, capture to result 20-49 ms.
    recent = [(now - 3 + i * 0.1, 5 + i % 10, 20 + i) for i in range(30)]
    rates = live_rates(recent, now + 0.1)
    assert rates.fps is not None and 9.0 <= rates.fps <= 10.5
    assert rates.latency.inference == Percentiles(9.5, 14.0)
    assert rates.latency.capture_to_result is not None and rates.latency.capture_to_result.p50 == 34.5
    # Frames before the window: the rate is over the window only.
    older = [(now - 60 + i * 0.1, 5.0, 20.0) for i in range(100)] + recent
    assert 2.9 <= (live_rates(older, now + 0.1).fps or 0) <= 3.1
    assert live_rates(older, now + 30).fps == 0.0  # stalled: nothing lately
    assert live_rates([], now) == Rates(None, Latency(None, None))


# --- a running daemon ----------------------------------------------------------------------------


@pytest.mark.slow
def test_status_of_a_running_daemon_and_of_none(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, registry, {"cam": pipeline_body(GOOD, video[0], 10.0)}
    )
    results = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/cam")
    agent = start_agent(config)
    results.wait_until(lambda ms: len(ms) >= 15, timeout=120)

    def answered() -> dict[str, Any] | None:
        done = edge_agent("status", "-c", str(config), "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    wait_until(lambda: (s := answered()) and (s["pipelines"]["cam"]["fps"] or 0) > 0, "a live rate in status")
    status = answered()
    assert status is not None
    cam = status["pipelines"]["cam"]
    assert cam["state"] == "running" and cam["model"] == f"{MODEL}@{GOOD}" and cam["backend"]
    assert cam["backend_why"].startswith("chose ")
    assert 0 < cam["fps"] <= 12  # the pipeline's cap is 10 fps
    latency = cam["latency_ms"]
    assert 0 < latency["inference"]["p50"] <= latency["inference"]["p95"]
    assert latency["inference"]["p50"] <= latency["capture_to_result"]["p50"]
    assert status["mqtt"]["connected"] is True and status["outbox"]["dropped"] == 0
    assert status["uptime_s"] > 0 and status["pid"] == agent.proc.pid
    assert status["config"]["running"] == "file" and status["fleet"] == {"enabled": True, "documents": {}}

    table = edge_agent("status", "-c", str(config))
    assert table.returncode == 0, table.stderr
    assert f"on {DEVICE} (pid {agent.proc.pid})" in table.stdout
    row = next(line for line in table.stdout.splitlines() if "cam" in line and "running" in line)
    assert f"{MODEL}@{GOOD}" in row and cam["backend"] in row
    watched = edge_agent("status", "-c", str(config), "--watch", "--count", "2", "--interval", "0.2")
    assert watched.returncode == 0 and "cam" in watched.stdout, watched.stderr

    agent.stop()
    results.close()
    gone = edge_agent("status", "-c", str(config))
    assert gone.returncode == 1 and "no edge-agent is running here" in gone.stderr, gone
    assert "Traceback" not in gone.stderr
    socket_file = tmp_path / DEVICE / "state" / "agent.sock"
    assert not socket_file.exists()  # removed on a clean stop
    assert os.access(tmp_path / DEVICE / "state", os.W_OK)
