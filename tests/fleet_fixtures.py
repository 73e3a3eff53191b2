"""What the fleet tests share: a registry with versions that succeed and fail in each way a fleet
update can, desired-state documents, and reading an agent's reported state off the broker."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from agent.cli import app
from agent.fleet import protocol
from tests.mosquitto import Mosquitto, Subscriber

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))
from fleet_agents import (  # noqa: E402  (scripts/ is not a package)
    BAD_TESTDATA,
    GOOD,
    LABELS,
    MISSING,
    MODEL,
    NAN_LIVE,
    NEWER,
    AgentFleet,
    agent_config,
    pipeline_body,
)
from fleet_agents import publish_fleet_versions as _publish_fleet_versions  # noqa: E402

__all__ = ["BAD_TESTDATA", "GOOD", "LABELS", "MISSING", "MODEL", "NAN_LIVE", "NEWER", "AgentFleet",
           "agent_config", "pipeline_body"]  # fmt: skip


def publish_fleet_versions(root: Path, cls_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fleet test registry (scripts/fleet_agents.py). `monkeypatch` is not needed any more."""
    return _publish_fleet_versions(root, cls_model_path)


def document(
    target: str, generation: int, pipelines: dict[str, Any], window_s: float = 3.0, **extra: Any
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "target": target,
        "generation": generation,
        "pipelines": pipelines,
        # Latency is not what these tests judge, and a shared 2-core box can make a swap's median
        # several times the old one's (CI saw 9x while other tests ran): a wide ratio.
        "health": {"window_s": window_s, "min_frames": 2, "max_latency_ratio": 50},
        **extra,
    }


def publish(broker: Mosquitto, topic: str, payload: bytes | dict[str, Any], retain: bool = True) -> None:
    """Publish as the controller does (QoS 1, retained), waiting for the broker's PUBACK."""
    data = protocol.encode(payload) if isinstance(payload, dict) else payload
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-controller-{time.monotonic_ns()}",
                         protocol=mqtt.MQTTv5)  # fmt: skip
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        client.publish(topic, data, qos=1, retain=retain).wait_for_publish(timeout=10)
    finally:
        client.disconnect()
        client.loop_stop()


def fleet(broker: Mosquitto, *args: str) -> tuple[int, dict[str, Any]]:
    """Run `edge-agent fleet ARGS --json` in-process: (exit code, the printed JSON object)."""
    result = CliRunner().invoke(app, ["fleet", *args, "--json", "--broker", f"{broker.host}:{broker.port}"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON (exit {result.exit_code}): {result.output}\n{result.exception}"
        ) from None


class Reported:
    """An agent's retained reported state, as the controller sees it."""

    def __init__(self, broker: Mosquitto, device: str, prefix: str = "edge") -> None:
        self.subscriber = Subscriber(broker.host, broker.port, f"{prefix}/{device}/reported")

    def latest(self) -> dict[str, Any]:
        messages = self.subscriber.messages
        return json.loads(messages[-1].payload) if messages else {}

    def wait(self, predicate: Any, what: str, timeout: float = 120.0, since: float = 0.0) -> dict[str, Any]:
        """Wait until the latest reported state satisfies `predicate`; `since` (time.time()): only a
        report made after it counts (a retained one from an earlier run does not)."""

        def holds(messages: list[Any]) -> bool:
            if not messages:
                return False
            state = json.loads(messages[-1].payload)
            made = datetime.fromisoformat(state["updated_at"].replace("Z", "+00:00")).timestamp()
            return made >= since and bool(predicate(state))

        try:
            self.subscriber.wait_until(holds, timeout)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {what}; reported: {self.latest()}") from None
        return self.latest()

    def close(self) -> None:
        self.subscriber.close()


def pipeline_in(reported: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(reported.get("pipelines", {}).get(name) or {})


def refusals(reported: dict[str, Any]) -> list[dict[str, Any]]:
    return list(reported.get("refused", []))


def start_watched_cam(
    root: Path,
    device: str,
    broker: Mosquitto,
    port: int,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start_agent: Any,
    video: Path,
    fps: float = 10.0,
    **extra: Any,
) -> tuple[Any, Subscriber]:
    """`edge-agent run` with the `cam` pipeline at `fps` on `video`, connecting to `port` (the broker,
    or a proxy in front of it), and a watcher on `broker` recording its results (persistent session,
    so it misses nothing while the broker is bounced); returns (the agent, the watcher) once results
    flow. `extra`: more top-level config (e.g. `mqtt=`)."""
    registry = publish_fleet_versions(root / "registry", cls_model_path, monkeypatch)
    config = agent_config(root, device, port, registry, {"cam": pipeline_body(GOOD, video, fps)}, **extra)
    watcher = Subscriber(broker.host, broker.port, f"edge/{device}/results/cam", persistent=True,
                         client_id="watcher")  # fmt: skip
    agent = start_agent(config)
    deadline = time.monotonic() + 120
    while len(watcher.messages) < 10:
        if time.monotonic() > deadline or agent.proc.poll() is not None:
            raise AssertionError(f"no results from {device} within 120 s; agent log:\n{agent.log()[-3000:]}")
        time.sleep(0.05)
    return agent, watcher
