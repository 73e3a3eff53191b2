"""`edge-agent status` says why a pipeline is failing now (issue 34, item 4), asked of a real
`edge-agent run` with a real mosquitto: a pipeline whose video is missing, then reloaded into a
version the registry lacks (the change fails; the old version still serves, still without its
video), then reloaded with an invalid file (refused). The table leads with the failed change's reason,
not only the old one from before the reload, and a refused reload shows its problems."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.status import PipelineStatus
from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.fleet_fixtures import GOOD, MISSING, MODEL, agent_config, pipeline_body, publish_fleet_versions
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DEVICE = "why-box"


def edge_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=60, check=False)


def test_a_failed_change_is_said_before_the_serving_versions_own_error() -> None:
    status = PipelineStatus.from_json(
        {
            "state": "source-unavailable",
            "error": "video file /gone.mp4 does not exist",
            "model": f"{MODEL}@{GOOD}",
            "source": {"state": "retrying"},
            "phase": "failed",
            "reason": f"{MODEL}@{MISSING} is not in the registry",
            "desired_model": f"{MODEL}@{MISSING}",
        }
    )
    assert status.problems() == [
        f"{MODEL}@{MISSING} failed: {MODEL}@{MISSING} is not in the registry",
        f"{MODEL}@{GOOD}, still serving: video file /gone.mp4 does not exist",
    ]
    # Nothing serves: the change's reason is the pipeline's error, said once.
    alone = PipelineStatus.from_json({"state": "error", "error": "why", "phase": "failed", "reason": "why"})
    assert alone.problems() == ["why"]
    running = PipelineStatus.from_json({"state": "running", "model": "m@1", "source": {}, "phase": "running"})
    assert running.problems() == []


@pytest.mark.slow
def test_status_says_why_a_pipeline_fails_now_and_why_a_reload_was_refused(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start_agent: StartAgent,
) -> None:
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    gone = tmp_path / "gone.mp4"  # never written: the source retries, the pipeline runs on
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry, {"cam": pipeline_body(GOOD, gone)})
    state = tmp_path / DEVICE / "state"
    agent = start_agent(config)

    def cam() -> dict[str, Any]:
        return (read_status(state).get("pipelines") or {}).get("cam") or {}

    def table() -> str:
        """`edge-agent status` as one line: rich folds a row longer than its width."""
        done = edge_agent("status", "-c", str(config))
        assert done.returncode == 0 and "Traceback" not in done.stderr, done
        return " ".join(done.stdout.split())

    wait_until(lambda: "does not exist" in (cam().get("error") or ""), "the missing video in the status")
    assert f"cam: video file {gone} does not exist" in table()

    # 1. A change that fails: the old version serves on, its video still missing.
    data = yaml.safe_load(config.read_text())
    data["pipelines"][0]["model"]["version"] = MISSING
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    agent.send_signal(signal.SIGHUP)
    wait_until(
        lambda: cam().get("phase") == "failed", "the change to a missing version failed", timeout=60,
        state=lambda: json.dumps(cam())[-1500:],
    )  # fmt: skip
    reason = cam()["reason"]
    assert reason and "does not exist" not in reason
    shown = table()
    failed = f"cam: {MODEL}@{MISSING} failed: {' '.join(reason.split())}"
    serving = f"cam: {MODEL}@{GOOD}, still serving: video file {gone} does not exist"
    assert failed in shown and serving in shown, shown
    assert shown.index(failed) < shown.index(serving), shown  # the news first

    # 2. An invalid file: refused, and the table says why, not only that it was.
    config.write_text(config.read_text().replace("fps: 5.0", "fps: -1"))
    agent.send_signal(signal.SIGHUP)
    wait_until(
        lambda: (
            ((read_status(state).get("config") or {}).get("last_reload") or {}).get("result") == "refused"
        ),
        "the refused reload in status.json",
        timeout=60,
    )
    shown = table()
    assert "last reload refused at " in shown, shown
    assert f"{config}:" in shown and "pipelines[0].source.fps: " in shown, shown
    log = agent.stop(exit_codes=(1,))  # no frame ever ran: `run` exits 1 and says why
    assert "no pipeline ran: cam: video file" in log
