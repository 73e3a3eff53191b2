"""Config reload (SIGHUP) and the last good config (agent/reload.py): the plan a reload makes, and a
real `edge-agent run` on a looping video with a real mosquitto, reloaded with a changed, an unchanged
and an invalid config, then booted on the invalid one."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config_loader import parse_config
from agent.errors import ConfigError
from agent.reload import LastGoodConfig, load_for_run, plan_reload, state_dir_of, with_hot_settings
from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.config_cases import assert_both_accept
from tests.fleet_fixtures import GOOD, agent_config, pipeline_body, publish_fleet_versions
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

DEVICE = "reload-box"


def pipeline(name: str, **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "/m.onnx"},
        "source": {"type": "video", "uri": f"/{name}.mp4", **source},
        "postprocess": {"type": "classification"},
    }


def config_dict(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "device": {"id": "box"},
        "state_dir": "/tmp/never-used",
        "mqtt": {"host": "127.0.0.1", "username": "box", "password": "s3cret-old"},
        "pipelines": [pipeline(name) for name in ("a", "b", "c")],
    }
    base.update(overrides)
    return base


def test_the_config_written_here_passes_the_validator_and_the_schema() -> None:
    assert_both_accept(yaml.safe_dump(config_dict()), "test_reload.config_dict()")


def parsed(data: dict[str, Any]) -> Any:
    return parse_config(yaml.safe_dump(data))


# --- the plan ------------------------------------------------------------------------------------


def test_the_plan_names_each_pipeline_change_and_what_needs_a_restart() -> None:
    old = config_dict()
    new = config_dict(log_level="debug", telemetry={"interval_s": 5})
    new["mqtt"] = {"host": "127.0.0.2", "username": "box", "password": "s3cret-new"}
    new["pipelines"] = [pipeline("a"), pipeline("b", fps=2), pipeline("d")]  # b changed, c out, d in
    plan = plan_reload(parsed(old), parsed(new))
    assert plan.unchanged == ["a"]
    assert plan.changed == {"b": ["source.fps"]}
    assert (plan.added, plan.removed) == (["d"], ["c"])
    assert plan.settings == ["log_level", "telemetry.interval_s"]
    assert plan.restart_needed == ["mqtt.host", "mqtt.password"]  # a changed password counts
    shown = json.dumps(plan.to_dict()) + "\n".join(plan.lines())
    assert "s3cret" not in shown  # values shown, secrets never
    assert "! mqtt.host: 127.0.0.1 -> 127.0.0.2 (needs a restart" in "\n".join(plan.lines())
    assert "! mqtt.password: (a secret; changed) (needs a restart" in "\n".join(plan.lines())


def test_the_same_config_plans_no_change() -> None:
    plan = plan_reload(parsed(config_dict()), parsed(config_dict()))
    assert not plan.changes_anything
    assert plan.unchanged == ["a", "b", "c"] and plan.lines()[0] == "no changes"


def test_a_disabled_pipeline_counts_as_removed() -> None:
    new = config_dict()
    new["pipelines"][2] = {**new["pipelines"][2], "enabled": False}
    plan = plan_reload(parsed(config_dict()), parsed(new))
    assert plan.removed == ["c"] and plan.unchanged == ["a", "b"]


def test_hot_settings_over_a_running_config_that_cannot_serve_them_are_refused() -> None:
    # Registry models need the registry, which only a restart brings in.
    new = config_dict(registry={"url": "file:///srv/registry"})
    new["pipelines"].append({**pipeline("r"), "model": {"name": "m", "version": "1"}})
    running = parsed(config_dict())
    with pytest.raises(ConfigError) as caught:
        with_hot_settings(running, parsed(new))
    assert "registry" in str(caught.value) and "restart" in (caught.value.hint or "")
    merged = with_hot_settings(running, parsed(config_dict(log_level="warning")))
    assert merged.log_level == "warning" and merged.mqtt == running.mqtt


# --- the last good config ------------------------------------------------------------------------


def test_an_invalid_config_falls_back_to_the_last_good_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    good = yaml.safe_dump(config_dict(state_dir=str(state)))
    LastGoodConfig(state).save(good, tmp_path / "agent.yaml")
    assert (state / "config" / "last-good.yaml").stat().st_mode & 0o777 == 0o600
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config_dict(state_dir=str(state), log_level="loud")))
    loaded = load_for_run(path)
    assert loaded.running_last_good and loaded.text == good
    assert loaded.config.log_level == "info"
    assert any("log_level" in p for p in loaded.problems), loaded.problems

    # Without a last good config the error stands (and systemd's start limit ends the loop).
    path.write_text(yaml.safe_dump(config_dict(state_dir=str(tmp_path / "empty"), log_level="loud")))
    with pytest.raises(ConfigError):
        load_for_run(path)


def test_where_a_broken_config_keeps_its_last_good_copy(tmp_path: Path) -> None:
    default = Path("/var/lib/edge-agent")
    path = tmp_path / "agent.yaml"
    path.write_text("state_dir: /srv/agent\ndevice: {id: [unclosed\n")
    assert state_dir_of(path, default) == default  # not YAML at all
    path.write_text("state_dir: /srv/agent\ndevice: 7\n")
    assert state_dir_of(path, default) == Path("/srv/agent")  # YAML, not a valid config
    path.write_text("state_dir: ${STATE}\n")
    assert state_dir_of(path, default) == default
    assert state_dir_of(tmp_path / "missing.yaml", default) == default


# --- a running daemon ----------------------------------------------------------------------------


def _status_config(watcher: Subscriber) -> dict[str, Any]:
    """`config` in the latest retained MQTT status; {} before one (or in `offline`)."""
    payload = watcher.messages[-1].payload if watcher.messages else b""
    config: dict[str, Any] = json.loads(payload or b"{}").get("config") or {}
    return config


def _seqs(watcher: Subscriber) -> list[int]:
    return [json.loads(m.payload)["seq"] for m in watcher.messages]


@pytest.mark.slow
def test_sighup_applies_what_changed_refuses_an_invalid_config_and_boot_falls_back(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    clip = video[0]
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    pipelines = {"steady": pipeline_body(GOOD, clip, 10.0), "tuned": pipeline_body(GOOD, clip, 2.0)}
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry, pipelines)
    state = tmp_path / DEVICE / "state"
    steady = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/steady")
    added = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/added")
    status = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/status")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # plays systemd's part
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(0.2)
    notes: list[str] = []
    listening = threading.Event()
    listening.set()

    def listen() -> None:
        while listening.is_set():
            with contextlib.suppress(TimeoutError):
                notes.append(notify.recv(4096).decode())

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    agent = start_agent(config, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    steady.wait_until(lambda ms: len(ms) >= 5, timeout=120)
    wait_until(lambda: (state / "config" / "last-good.yaml").exists(), "the last good config kept")

    def reload(what: str, result: str) -> dict[str, Any]:
        before = (read_status(state).get("config") or {}).get("last_reload")
        agent.send_signal(signal.SIGHUP)
        wait_until(
            lambda: (r := (read_status(state).get("config") or {}).get("last_reload")) and r != before,
            f"the reload of the {what} config in status.json",
            timeout=60,
            state=lambda: agent.log()[-2000:],
        )
        outcome: dict[str, Any] = read_status(state)["config"]["last_reload"]
        assert outcome["result"] == result, outcome
        return outcome

    # 1. Changed: `tuned` at another rate, `added` new, log_level and a restart-only setting.
    data = yaml.safe_load(config.read_text())
    data["pipelines"][1]["source"]["fps"] = 4.0
    data["pipelines"].append({"name": "added", **pipeline_body(GOOD, clip, 5.0)})
    data["log_level"] = "debug"
    data["mqtt"]["keepalive_s"] = 45
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    changes = reload("changed", "applied")["changes"]
    assert changes["pipelines"] == {
        "added": ["added"], "removed": [], "changed": {"tuned": ["source.fps"]}, "unchanged": ["steady"],
        "retried": [],
    }  # fmt: skip
    assert changes["settings"] == ["log_level"] and changes["restart_needed"] == ["mqtt.keepalive_s"]
    added.wait_until(lambda ms: len(ms) >= 3, timeout=120)
    # 2. Unchanged.
    unchanged = reload("unchanged", "unchanged")["changes"]
    assert unchanged["pipelines"]["unchanged"] == ["steady", "tuned", "added"]
    assert unchanged["restart_needed"] == ["mqtt.keepalive_s"]  # still waiting for a restart
    # 3. Invalid: refused, reported over MQTT, the running config stays.
    config.write_text(config.read_text().replace("fps: 4.0", "fps: -1"))
    refused = reload("invalid", "refused")
    assert any("pipelines[1].source.fps" in p for p in refused["problems"]), refused
    status.wait_until(
        lambda _: (_status_config(status).get("last_reload") or {}).get("result") == "refused", timeout=30
    )
    served = len(steady.messages)
    steady.wait_until(lambda ms: len(ms) >= served + 5, timeout=60)
    log = agent.stop()
    assert "reload refused" in log and "take effect after a restart" in log
    assert " DEBUG " in log.split("reload of", 1)[1]  # log_level applied at once
    listening.clear()
    listener.join(5)
    reloading = [i for i, n in enumerate(notes) if "RELOADING=1" in n]
    assert len(reloading) == 3 and all("READY=1" in notes[i + 1] for i in reloading), notes
    notify.close()
    # `steady` ran through three reloads untouched: no gap, no reopened camera.
    seqs = _seqs(steady)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    final = read_status(state)["pipelines"]
    assert final["steady"]["attempts"] == 1 and final["steady"]["source"]["reconnects"] == 0
    assert final["steady"]["stage_swaps"] == 0

    # 4. Boot on the invalid file: the last good config runs, the problems are reported.
    booted_at = len(added.messages)
    agent = start_agent(config)
    added.wait_until(lambda ms: len(ms) >= booted_at + 3, timeout=120)  # `added` is in the last good one
    status.wait_until(lambda _: _status_config(status).get("running") == "last-good", timeout=30)
    reported = _status_config(status)
    assert reported["problems"] and any("fps" in p for p in reported["problems"]), reported
    log = agent.stop()
    assert "is not valid" in log and "running the last good config instead" in log

    # `config diff` against what ran: the invalid file is an error; a fixed one shows the change.
    diff = subprocess.run([EDGE_AGENT, "config", "diff", str(config)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert diff.returncode == 1 and "fps" in diff.stderr, diff
    config.write_text(config.read_text().replace("fps: -1", "fps: 3.0"))
    diff = subprocess.run([EDGE_AGENT, "config", "diff", str(config), "--json"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert diff.returncode == 0, diff.stderr
    assert json.loads(diff.stdout)["pipelines"]["changed"] == {"tuned": ["source.fps"]}
    for watcher in (steady, added, status):
        watcher.close()
