"""The systemd watchdog: pings stop when a pipeline or the MQTT connection stops making progress.

A real `edge-agent run` with NOTIFY_SOCKET/WATCHDOG_USEC pointing at a socket the test reads (as
systemd would), whose pipeline decodes with a real postprocessor plugin (docs/plugins.md) that
hangs inside the frame while a file exists; and a real MqttConnection whose message handler hangs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.mqtt.message import Message
from agent.mqtt.router import Router
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import GOOD, agent_config, pipeline_body, publish_fleet_versions
from tests.mosquitto import Mosquitto, Subscriber
from tests.mqtt_fixtures import DEVICE, ConnectionFactory, publish_one
from tests.plugin_fixtures import install_plugin
from tests.waits import wait_until

HANG_PLUGIN = """\
import os
import time


def make(options, outputs):
    trigger = options["hang_while"]

    def decode(values, geometry):
        deadline = time.monotonic() + 300  # bounded: a test that goes wrong still ends
        while os.path.exists(trigger) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"decoded": True}

    return decode
"""


class NotifySocket:
    """systemd's side of sd_notify: every datagram, with the time it came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.notes: list[tuple[float, str]] = []
        self._open = True
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while self._open:
            with contextlib.suppress(TimeoutError):
                self.notes.append((time.monotonic(), self.sock.recv(4096).decode()))

    def pings(self, since: float = 0.0) -> int:
        return sum(1 for at, note in list(self.notes) if at >= since and "WATCHDOG=1" in note)

    def close(self) -> None:
        self._open = False
        self._thread.join(5)
        self.sock.close()


@pytest.mark.slow
def test_pings_stop_while_a_pipeline_hangs_in_a_frame_and_resume_after(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    site = tmp_path / "site"
    install_plugin(site, "hang-plugin", "hang_plugin", HANG_PLUGIN, {"hang": "hang_plugin:make"})
    trigger = tmp_path / "hang-now"
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    body = pipeline_body(GOOD, video[0], 10.0)
    body["postprocess"] = {"type": "plugin", "name": "hang", "options": {"hang_while": str(trigger)}}
    body["stall_s"] = 2
    config = agent_config(tmp_path, "dog-box", mosquitto.port, registry, {"cam": body})
    results = Subscriber(mosquitto.host, mosquitto.port, "edge/dog-box/results/cam")
    notify = NotifySocket(tmp_path / "notify.sock")
    # WatchdogSec=1: the agent pings every 0.5 s.
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000", "PYTHONPATH": str(site)}
    agent = start_agent(config, env=env)
    try:
        results.wait_until(lambda ms: len(ms) >= 3, timeout=120)
        wait_until(lambda: notify.pings() >= 3, "watchdog pings while the pipeline runs")

        trigger.touch()  # the next frame hangs in the plugin
        wait_until(lambda: "watchdog pings stopped" in agent.log(), "the stall noticed", timeout=60)
        stopped_at = time.monotonic()
        wait_until(lambda: time.monotonic() - stopped_at > 3, "3 s of stall", interval=0.2)
        assert notify.pings(since=stopped_at + 0.5) == 0  # (one may have been on its way)
        wait_until(
            lambda: (read_status(tmp_path / "dog-box" / "state").get("stall") or "").startswith(
                "pipeline cam: stuck in one frame"
            ),
            "the stall in status.json",
            timeout=30,
        )
        status = read_status(tmp_path / "dog-box" / "state")

        trigger.unlink()  # the frame finishes
        resumed = len(results.messages)
        wait_until(lambda: "watchdog pings resumed" in agent.log(), "the pings resumed", timeout=60)
        wait_until(lambda: notify.pings(since=time.monotonic() - 1) >= 1, "a ping after the stall")
        results.wait_until(lambda ms: len(ms) >= resumed + 3, timeout=60)
        log = agent.stop()
    finally:
        notify.close()
        results.close()
    assert "pipeline cam: stuck in one frame for" in log and "(stall_s: 2)" in log
    assert status["pipelines"]["cam"]["state"] == "running"  # hung, not failed: only the watchdog sees it


def test_a_hung_message_handler_is_a_stall_of_the_connection(
    mosquitto: Mosquitto, connection_factory: ConnectionFactory
) -> None:
    conn, _ = connection_factory(mosquitto, "5")
    router = Router(conn)
    release = threading.Event()
    entered = threading.Event()

    def hangs(message: Message) -> None:
        entered.set()
        release.wait(60)

    router.route(f"edge/{DEVICE}/cmd/hang", hangs)
    assert conn.stall(limit_s=0.5) is None  # not started: nothing to judge
    conn.start()
    wait_until(lambda: set(conn.stats()["subscriptions"].values()) == {"active"}, "SUBACK", state=conn.stats)
    assert conn.stall(limit_s=5) is None  # (5 s: a busy box may hold the publisher's beat past 0.5 s)
    publish_one(mosquitto, f"edge/{DEVICE}/cmd/hang", b"{}")
    assert entered.wait(30)
    # The handler stays stuck; a busy box may also make the publisher's beat late for a moment (and
    # that is said first), so wait for the handler's stall itself.
    wait_until(
        lambda: (conn.stall(limit_s=0.5) or "").startswith("MQTT: a message handler is stuck for"),
        "the handler's stall seen",
        state=lambda: conn.stall(limit_s=0.5),
    )
    assert conn.stall(limit_s=300) is None  # within a generous limit it is not a stall yet
    release.set()
    wait_until(lambda: conn.stall(limit_s=0.5) is None, "progress again")
    conn.stop(publish_offline=False)
    assert conn.stall(limit_s=0.5) is None  # stopped: its threads ending is not a stall
