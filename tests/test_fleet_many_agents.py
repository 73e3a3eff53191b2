"""Twenty real agents (`edge-agent run`, separate processes, their own state dirs) on one mosquitto,
driven by the operator's CLI (`edge-agent fleet deploy/status`) as a CI job would:

- a group deployment of a new model version reaches running on all of them;
- a version whose test data fails validation is refused on all and reported failed;
- a version that passes validation but fails the health window on live frames rolls back on all;
- an agent offline during a deployment converges after it reconnects;
- a canary wave with a failing version stops the rollout and returns the canaries to the previous
  version, while the rest never leave it.

Each agent runs one camera pipeline on a real video at a low frame rate (this is a 2-core box)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.fleet.protocol import in_canary
from tests.agent_process import EDGE_AGENT
from tests.fleet_fixtures import (
    BAD_TESTDATA,
    GOOD,
    MODEL,
    NAN_LIVE,
    NEWER,
    AgentFleet,
    agent_config,
    pipeline_body,
    publish_fleet_versions,
)
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

AGENTS = 20
FPS = 2.0
EDGE_AGENT_TIMEOUT_S = 600
# Each poll of `fleet status` is a process of its own (about 0.4 s of CPU): back to back, the polls
# took a core from the agents they waited for.
POLL_S = 1.0


@pytest.fixture
def fleet(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    video: tuple[Path, list[dict[str, Any]]],
) -> Iterator[tuple[AgentFleet, Path]]:
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    body = pipeline_body(GOOD, video[0], FPS)
    configs = {
        f"cam-{i:02d}": agent_config(
            tmp_path / "agents", f"cam-{i:02d}", mosquitto.port, registry, {"cam": body}
        )
        for i in range(1, AGENTS + 1)
    }
    agents = AgentFleet(configs)
    try:
        yield agents, video[0]
    finally:
        agents.kill_all()


def fleet_cli(mosquitto: Mosquitto, *args: str, timeout: float = EDGE_AGENT_TIMEOUT_S) -> tuple[int, Any]:
    """`edge-agent fleet ... --json` as a CI job runs it: (exit status, its JSON)."""
    result = subprocess.run(
        [EDGE_AGENT, "fleet", *args, "--broker", f"127.0.0.1:{mosquitto.port}", "--json"],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(
            f"fleet {args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        ) from None


def spec(tmp_path: Path, version: str, video_path: Path) -> Path:
    path = tmp_path / f"spec-{version}.yaml"
    content = {
        "pipelines": {"cam": pipeline_body(version, video_path, FPS)},
        # Twenty agents share two cores with the test: latency is not what this test judges.
        "health": {"window_s": 4, "min_frames": 2, "max_latency_ratio": 50},
    }
    path.write_text(yaml.safe_dump(content))
    return path


def devices_status(mosquitto: Mosquitto) -> dict[str, dict[str, Any]]:
    code, report = fleet_cli(mosquitto, "status", "--group", "lobby")
    assert code in (0, 4, 6, 7), report
    return {d["device"]: d for d in report["devices"]}


def cam(device: dict[str, Any]) -> dict[str, Any]:
    return dict(device.get("pipelines", {}).get("cam") or {})


@pytest.mark.slow
def test_twenty_agents_deploy_refuse_roll_back_reconnect_and_stop_a_failing_canary_wave(
    tmp_path: Path, mosquitto: Mosquitto, fleet: tuple[AgentFleet, Path]
) -> None:
    agents, video_path = fleet
    agents.start_all()
    names = sorted(agents.configs)

    def deploy(version: str, *options: str) -> tuple[int, Any]:
        path = str(spec(tmp_path, version, video_path))
        return fleet_cli(
            mosquitto, "deploy", path, "--group", "lobby", *options, "--wait", "--timeout", "300"
        )

    def all_running(version: str) -> bool:
        status = devices_status(mosquitto)
        return len(status) == AGENTS and all(
            cam(d).get("phase") == "running" and cam(d).get("model") == f"{MODEL}@{version}"
            for d in status.values()
        )

    wait_until(lambda: all_running(GOOD), f"{AGENTS} agents running {GOOD}", timeout=300, interval=POLL_S)
    memory = agents.memory()
    print(f"{len(memory)} agents: {sum(m['pss'] for m in memory.values()) / 2**20:.0f} MiB in all (PSS), "
          f"each {max(m['rss'] for m in memory.values()) / 2**20:.0f} MiB resident at most")  # fmt: skip

    # 1. A new version to the whole group: running everywhere.
    started = time.monotonic()
    code, result = deploy(NEWER)
    print(f"group deployment of {NEWER} to {AGENTS} agents converged in {time.monotonic() - started:.1f} s")
    assert code == 0, result
    assert all_running(NEWER)

    # 2. A version whose test data fails validation: refused on all, reported failed, NEWER serves on.
    code, result = deploy(BAD_TESTDATA)
    assert code == 4, result
    status = devices_status(mosquitto)
    for device in status.values():
        assert cam(device)["phase"] == "failed" and "expected outputs" in cam(device)["reason"], device
        assert cam(device)["model"] == f"{MODEL}@{NEWER}", device

    # 3. A version that fails its health window on live frames: rolled back on all.
    code, result = deploy(NAN_LIVE)
    assert code == 4, result
    status = devices_status(mosquitto)
    for device in status.values():
        assert cam(device)["phase"] == "rolled-back" and "health window" in cam(device)["reason"], device
        assert cam(device)["model"] == f"{MODEL}@{NEWER}", device

    # 4. An agent offline during a deployment converges once it is back.
    offline = names[-1]
    assert agents.stop(offline) == 0
    code, result = deploy(GOOD)
    assert code == 7, result  # every online device converged; one is offline
    agents.start(offline)
    wait_until(
        lambda: all_running(GOOD),
        "the offline agent converged after reconnecting",
        timeout=300,
        interval=POLL_S,
    )

    # 5. A canary wave with a failing version: the rollout stops, the canaries go back to GOOD.
    generation = devices_status(mosquitto)[names[0]]["layers"]["group:lobby"]["applied_generation"]
    code, result = deploy(NAN_LIVE, "--canary", "25", "--max-failed", "0")
    assert code == 5, result  # stopped and rolled back
    seed = f"lobby-{generation + 1}"
    canaries = {n for n in names if in_canary(n, seed, 25)}
    assert canaries and len(canaries) < AGENTS, canaries
    wait_until(
        lambda: all_running(GOOD), "every agent back on (or still on) GOOD", timeout=300, interval=POLL_S
    )
    for name in names:
        log = agents.log(name)
        tried = f"now on {MODEL}@{NAN_LIVE}" in log.split(f"generation {generation + 1} accepted")[-1]
        assert tried == (name in canaries), (name, name in canaries)
    assert sorted(agents.alive()) == names
