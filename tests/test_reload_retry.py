"""A failed pipeline is retried at once, not at its next backoff slot (issue 26): by a config reload
(what SIGHUP sets off), which reports it as retried rather than unchanged, and by the registry
answering again, for the pipelines that could not reach it. A real daemon (`Agent.run`, as
`edge-agent run` drives it) on a looping video, with a real HTTP registry on loopback that is down,
then up on the same port. The backoff is set to ten minutes, so "at once" cannot be its slot."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent.supervisor
from agent.daemon import Agent
from agent.registry import FileRegistry, PublishOptions
from agent.reload import load_for_run
from agent.status import PipelineStatus
from tests.agent_process import read_status
from tests.media_fixtures import demo_video_module
from tests.registry_server import RegistryServer
from tests.store_fixtures import CLS_NAME, http_registry_config
from tests.waits import free_port, wait_until

BACKOFF_S = 600.0
AT_ONCE_S = 90.0  # a pull, a backend proof and a warm-up on a busy machine; far below the backoff


@pytest.fixture
def long_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent.supervisor, "REBUILD_MIN_S", BACKOFF_S)


@pytest.fixture
def rare_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's own registry probe (every REGISTRY_PROBE_S) also notices the registry's
    return; a test of what else retries at once must not race it (CI saw the probe win)."""
    monkeypatch.setattr(agent.supervisor.state, "REGISTRY_PROBE_S", BACKOFF_S)


def _config(tmp_path: Path, port: int, versions: dict[str, str]) -> Path:
    """The offline tests' config (a looping video, the registry on `port`), with these pipelines."""
    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    path = http_registry_config(tmp_path, port, video)
    config = json.loads(path.read_text())
    like = config["pipelines"][0]
    config["pipelines"] = [
        {**like, "name": name, "model": {"name": CLS_NAME, "version": version}}
        for name, version in versions.items()
    ]
    path.write_text(json.dumps(config))
    return path


class Running:
    """The daemon's main loop on a thread, as `edge-agent run` runs it; `reload` is what SIGHUP sets."""

    def __init__(self, config: Path) -> None:
        loaded = load_for_run(config)
        self.agent = Agent(loaded.config, loaded)
        self.stop, self.reload = threading.Event(), threading.Event()
        self.thread = threading.Thread(
            target=self.agent.run, args=(self.stop,), kwargs={"reload": self.reload}, daemon=True
        )
        self.thread.start()

    def state(self, name: str) -> PipelineStatus | None:
        return self.agent.supervisor.states().get(name)  # None until the first apply

    def phase(self, name: str) -> str | None:
        state = self.state(name)
        return None if state is None else state.phase

    def attempts(self, name: str) -> int | None:
        state = self.state(name)
        return None if state is None else state.change.attempts

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture
def published(file_registry: FileRegistry, cls_model_path: Path) -> FileRegistry:
    for version in ("2.1", "2.2"):
        file_registry.publish(
            cls_model_path, CLS_NAME, version, PublishOptions(metadata={"labels": ["0", "180"]})
        )
    return file_registry


@pytest.fixture
def daemon() -> Iterator[list[Running]]:
    """The daemons a test started, stopped however it ends."""
    started: list[Running] = []
    yield started
    for running in started:
        running.close()


def _failed_unreachable(running: Running, name: str) -> bool:
    state = running.state(name)
    return (
        state is not None
        and state.phase == "failed"
        and "cannot reach registry" in (state.change.reason or "")
    )


def test_a_reload_retries_a_pipeline_that_failed_on_the_registry_at_once(
    tmp_path: Path, published: FileRegistry, long_backoff: None, rare_probe: None, daemon: list[Running]
) -> None:
    port = free_port()
    running = Running(_config(tmp_path, port, {"door": "2.1"}))
    daemon.append(running)
    wait_until(lambda: _failed_unreachable(running, "door"), "door failed: the registry is down", timeout=120)

    server = RegistryServer(published.root, port=port)  # back, on the same address
    try:
        asked = time.monotonic()
        running.reload.set()  # SIGHUP, with agent.yaml as it was
        wait_until(
            lambda: (read_status(tmp_path / "state").get("config") or {}).get("last_reload"),
            "the reload's outcome in status.json",
            timeout=60,
        )
        outcome = read_status(tmp_path / "state")["config"]["last_reload"]
        assert outcome["result"] == "applied", outcome
        assert outcome["changes"]["pipelines"]["retried"] == ["door"]
        assert outcome["changes"]["pipelines"]["unchanged"] == []
        wait_until(lambda: running.phase("door") == "running", "door running", timeout=AT_ONCE_S)
        assert time.monotonic() - asked < BACKOFF_S / 4
        assert running.attempts("door") == 2  # the failed one and the retry: no slot came
    finally:
        running.close()
        server.close()


def test_the_registry_answering_again_retries_the_pipelines_waiting_on_it(
    tmp_path: Path, published: FileRegistry, long_backoff: None, daemon: list[Running]
) -> None:
    port = free_port()
    running = Running(_config(tmp_path, port, {"door": "2.1", "gate": "2.2"}))
    daemon.append(running)
    wait_until(
        lambda: _failed_unreachable(running, "door") and _failed_unreachable(running, "gate"),
        "both pipelines failed: the registry is down",
        timeout=120,
    )
    server = RegistryServer(published.root, port=port)
    try:
        asked = time.monotonic()
        running.agent.supervisor.restart("door")  # the fleet's restart_pipeline: door asks the registry
        wait_until(
            lambda: all(running.phase(n) == "running" for n in ("door", "gate")),
            "gate retried as soon as door's pull found the registry back",
            timeout=AT_ONCE_S,
        )
        assert time.monotonic() - asked < BACKOFF_S / 4
        assert running.attempts("gate") == 2
        assert running.agent.registry_link.state == "reachable"
    finally:
        running.close()
        server.close()


def test_the_registry_back_is_noticed_by_itself_and_the_pipeline_retried(
    tmp_path: Path, published: FileRegistry, long_backoff: None, daemon: list[Running]
) -> None:
    """No reload, no other pull: while the registry is unreachable and a pipeline waits on it, the
    supervisor asks it now and then (REGISTRY_PROBE_S), so its return retries the pipeline at once."""
    port = free_port()
    running = Running(_config(tmp_path, port, {"door": "2.1"}))
    daemon.append(running)
    wait_until(lambda: _failed_unreachable(running, "door"), "door failed: the registry is down", timeout=120)
    server = RegistryServer(published.root, port=port)
    try:
        back = time.monotonic()
        wait_until(lambda: running.phase("door") == "running", "door running", timeout=AT_ONCE_S)
        assert time.monotonic() - back < BACKOFF_S / 4
        assert running.attempts("door") == 2  # the failed one and the retry: no slot came
        assert running.agent.registry_link.state == "reachable"
    finally:
        running.close()
        server.close()
