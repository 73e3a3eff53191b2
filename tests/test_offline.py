"""The registry away: the box runs what its store has and says so (log, status.json, the MQTT
status), `models pull` says what it could not reach, and a version the store lacks is pulled once
the registry is back. A real HTTP registry on loopback that is down, then up on the same port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.registry import FileRegistry, PublishOptions
from agent.store import ModelStore
from tests.agent_process import StartAgent, pipeline_state, read_status
from tests.cli_runs import edge_agent
from tests.media_fixtures import demo_video_module
from tests.registry_server import RegistryServer
from tests.store_fixtures import CLS_NAME, CLS_VERSION, http_registry_config
from tests.waits import free_port, wait_until


def _preinstall(tmp_path: Path, file_registry: FileRegistry) -> None:
    """The store already has 2.0 (pulled on an earlier day); 2.1 is only in the registry."""
    ModelStore(tmp_path / "state" / "store").pull(file_registry, CLS_NAME, CLS_VERSION)


def test_models_pull_says_what_it_could_not_reach(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path
) -> None:
    _preinstall(tmp_path, file_registry)
    port = free_port()
    config = http_registry_config(tmp_path, port)
    result = edge_agent("models", "pull", "-c", str(config), "--json")
    assert result.returncode == 1
    rows = {r["version"]: r for r in json.loads(result.stdout)}
    assert rows[CLS_VERSION] == {
        "name": CLS_NAME, "version": CLS_VERSION, "ok": True, "source": "store", "error": None,
    }  # fmt: skip
    assert not rows["2.1"]["ok"] and rows["2.1"]["source"] == "registry"
    assert (
        f"cannot reach registry at http://127.0.0.1:{port}/pp-ocr-cls/2.1/manifest.json"
        in rows["2.1"]["error"]
    )

    text = edge_agent("models", "pull", "-c", str(config))
    assert text.returncode == 1
    assert f"ok: {CLS_NAME}@{CLS_VERSION} (already in the store)" in text.stdout
    assert f"FAILED: {CLS_NAME}@2.1: cannot reach registry at http://127.0.0.1:{port}" in text.stderr
    kept = f"({CLS_NAME}@{CLS_VERSION})"
    assert (
        f"the registry could not be reached: the box keeps running what its store has {kept}" in text.stderr
    )

    # Given by name: only that one.
    only = edge_agent("models", "pull", f"{CLS_NAME}@{CLS_VERSION}", "-c", str(config), "--json")
    assert only.returncode == 0 and [r["version"] for r in json.loads(only.stdout)] == [CLS_VERSION]

    # The registry is up: 2.1 comes.
    file_registry.publish(cls_model_path, CLS_NAME, "2.1", PublishOptions(metadata={"labels": ["0", "180"]}))
    server = RegistryServer(file_registry.root, port=port)
    try:
        back = edge_agent("models", "pull", "-c", str(config), "--json")
        assert back.returncode == 0, back.stderr
        assert {r["version"]: r["source"] for r in json.loads(back.stdout)} == {
            CLS_VERSION: "store",
            "2.1": "registry",
        }
    finally:
        server.close()


@pytest.mark.slow
def test_the_daemon_serves_the_store_while_the_registry_is_away_and_says_so(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path, start_agent: StartAgent
) -> None:
    _preinstall(tmp_path, file_registry)
    file_registry.publish(cls_model_path, CLS_NAME, "2.1", PublishOptions(metadata={"labels": ["0", "180"]}))
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    port = free_port()
    state_dir = tmp_path / "state"
    agent = start_agent(http_registry_config(tmp_path, port, video))

    def registry_state() -> str:
        return str(read_status(state_dir).get("registry", {}).get("state", ""))

    wait_until(
        lambda: pipeline_state(state_dir, "installed") == "running" and registry_state() == "unreachable",
        "the installed version running while the registry is unreachable",
        timeout=120,
    )
    status = read_status(state_dir)
    assert status["registry"]["url"] == f"http://127.0.0.1:{port}"
    assert "cannot reach registry" in status["registry"]["error"]
    assert status["store"]["installed"] == [f"{CLS_NAME}@{CLS_VERSION}"]
    assert "cannot reach registry" in status["pipelines"]["missing"]["error"]

    server = RegistryServer(file_registry.root, port=port)  # back, on the same address
    try:
        log = agent.run_until(
            lambda: pipeline_state(state_dir, "missing") == "running" and registry_state() == "reachable",
            "the missing version pulled once the registry is back",
        )
    finally:
        server.close()
    assert log.count("unreachable (") == 1  # said once, not at every retry
    assert f"serving what the store has: {CLS_NAME}@{CLS_VERSION}" in log
    assert "reachable again" in log
