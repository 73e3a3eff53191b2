"""Telemetry for real: `edge-agent run` with a real mosquitto and a real video pipeline sends health
reports on <prefix>/<device>/telemetry every interval, with the pipeline's rates over that interval;
without a broker they are skipped and counted, never queued in front of results. Temperatures are
read from a Jetson's thermal zones (a fixture tree the real reader reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.telemetry import read_temperatures
from tests.agent_process import StartAgent, read_status
from tests.daemon_fixtures import (
    DEVICE,
    outbox_pending,
    pipeline,
    write_config,
)
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import free_port

SYSROOTS = Path(__file__).resolve().parent / "fixtures" / "sysroots"


def test_thermal_zones_are_read_by_their_type() -> None:
    temperatures = read_temperatures(SYSROOTS / "jetson-agx-orin")
    assert temperatures["cpu-thermal"] == 47.3 and temperatures["tj-thermal"] == 47.3
    assert len(temperatures) == 9 and "PMIC-Die" not in temperatures  # its temp cannot be read
    assert read_temperatures(SYSROOTS / "x86_64-cpu-only") == {}  # a VM without zones


def _with_telemetry(config: Path, interval_s: float) -> None:
    data = yaml.safe_load(config.read_text())
    data["telemetry"] = {"interval_s": interval_s}
    config.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.slow
def test_reports_arrive_every_interval_with_the_pipelines_rates(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    config = write_config(tmp_path, mosquitto.port, registry_dir, [pipeline("signs", str(path), loop=True)])
    _with_telemetry(config, 1.0)
    telemetry = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/telemetry")

    def running_reports() -> int:
        reports = [json.loads(m.payload) for m in telemetry.messages]
        return sum(1 for r in reports if r["pipelines"].get("signs", {}).get("fps"))

    agent = start_agent(config)
    log = agent.run_until(lambda: running_reports() >= 5, "five reports from the running pipeline")
    reports = [json.loads(m.payload) for m in telemetry.messages]
    assert len(reports) >= 5 and "Traceback" not in log
    for report in reports:
        assert report["device"] == DEVICE and report["timestamp"].endswith("Z")
        assert 0.5 <= report["interval_s"] <= 2.5, report["interval_s"]
        system = report["system"]
        assert 0 <= system["cpu_percent"] <= 100 and len(system["load"]) == 3
        assert 0 < system["memory"]["used_mb"] < system["memory"]["total_mb"]
        assert system["disk"]["path"] == str(tmp_path / "state") and system["disk"]["free_mb"] > 0
        assert isinstance(system["temperatures_c"], dict)
        assert report["agent"]["rss_mb"] > 20 and report["agent"]["threads"] > 1
        assert report["mqtt"] == {"connected": True} and report["skipped_while_offline"] == 0
        assert set(report["outbox"]) == {"pending", "dropped"}
    running = [r["pipelines"]["signs"] for r in reports if r["pipelines"].get("signs", {}).get("fps")]
    assert len(running) >= 5, reports  # the video plays at the 2 fps cap once the pipeline is built
    for signs in running:
        assert signs["state"] == "running" and signs["backend"]
        assert signs["inference_ms"] > 0 and signs["errors"] == 0
    # The rate over each interval (1 to 3 frames fall in one second at the 2 fps cap), not since start.
    rates = [s["fps"] for s in running[1:]]  # the first running interval may include the build
    assert all(0.5 <= fps <= 4.0 for fps in rates) and 1.3 <= sum(rates) / len(rates) <= 2.7, rates
    assert sum(s["results"] for s in running) >= 5


@pytest.mark.slow
def test_without_a_broker_reports_are_skipped_and_counted_not_queued(
    tmp_path: Path,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    config = write_config(tmp_path, free_port(), registry_dir, [pipeline("signs", str(path))])
    _with_telemetry(config, 1.0)
    state_dir = tmp_path / "state"

    def skipped() -> int:
        return int(read_status(state_dir).get("telemetry", {}).get("skipped_while_offline", 0))

    def results() -> int:
        return int(read_status(state_dir).get("pipelines", {}).get("signs", {}).get("results", 0))

    # (On a busy machine three reports can pass before the pipeline is built: wait for results too.)
    start_agent(config).run_until(
        lambda: skipped() >= 3 and results() > 0, "three reports skipped while offline, and results"
    )
    status = read_status(state_dir)
    assert status["telemetry"]["interval_s"] == 1.0
    assert status["telemetry"]["skipped_while_offline"] >= 3, status["telemetry"]
    # The outbox holds the results, and nothing but them.
    assert outbox_pending(tmp_path / "state") == status["pipelines"]["signs"]["results"] > 0
