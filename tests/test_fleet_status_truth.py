"""What `edge-agent fleet status` and `edge-agent status` say is what runs: per pipeline the version
that serves, the desired one and why it failed; an offline device (or one that restarted and has
not reported since) is not listed as running; a failed generation is not "applied"; the last error
has a time and goes once the pipeline has run cleanly for a health window.

Against a real mosquitto: first retained reports and statuses as agents publish them (every case at
once, fast), then one real agent (`edge-agent run`) taking a version that fails its health window
and one that is missing from the registry, and going offline."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.cli.render.status import render
from agent.fleet.reconciler import generation_outcomes
from agent.status import statuses_of
from tests.agent_process import EDGE_AGENT, StartAgent
from tests.fleet_fixtures import (
    GOOD,
    MISSING,
    MODEL,
    NAN_LIVE,
    Reported,
    agent_config,
    document,
    fleet,
    pipeline_body,
    pipeline_in,
    publish,
    publish_fleet_versions,
)
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

T0 = "2026-11-23T19:00:00.000Z"
T1 = "2026-11-23T19:01:00.000Z"
T2 = "2026-11-23T19:02:00.000Z"


def fleet_status(broker: Mosquitto, *args: str) -> tuple[int, dict[str, Any]]:
    """`edge-agent fleet status --json` in-process: (exit code, the printed JSON object)."""
    return fleet(broker, "status", *args)


def fleet_table(broker: Mosquitto) -> tuple[int, str]:
    """`edge-agent fleet status` as a person reads it (a wide terminal: one line per pipeline)."""
    result = CliRunner().invoke(
        app, ["fleet", "status", "--broker", f"{broker.host}:{broker.port}"], env={"COLUMNS": "400"}
    )
    return result.exit_code, result.output


def _line(output: str, *parts: str) -> str:
    """The one output line holding every part."""
    lines = [line for line in output.splitlines() if all(p in line for p in parts)]
    assert len(lines) == 1, (parts, output)
    return lines[0]


# --- retained state as agents publish it -------------------------------------------------------


def _reported(device: str, pipeline: dict[str, Any], updated_at: str = T1) -> dict[str, Any]:
    layer = f"device:{device}"
    return {
        "schema_version": 1,
        "device": device,
        "groups": ["lobby"],
        "agent_version": "0.5.0",
        "updated_at": updated_at,
        "documents": {
            layer: {"observed_generation": 5, "applied_generation": 5, "state": "applied", "reason": None}
        },
        "pipelines": {"faces": {"layer": layer, "generation": 5, "backend": "onnxruntime/CPU", **pipeline}},
        "refused": [],
    }


def _status(device: str, state: str, started_at: str = T0, at: str = T1) -> bytes:
    payload: dict[str, Any] = {"status": state, "device": device, "timestamp": at}
    if state == "online":
        payload["started_at"] = started_at
    return json.dumps(payload).encode()


SERVING_3 = {"model": "faces@3", "running_model": "faces@3", "state": "running"}
RUNNING_3 = {"phase": "running", "desired_model": "faces@3", **SERVING_3}
CASES: dict[str, tuple[dict[str, Any], bytes | None]] = {
    # device: (its reported pipeline `faces`, its status; None: the agent's own online birth)
    "box-ok": (RUNNING_3, None),
    "box-failed": (
        {"phase": "failed", "desired_model": "faces@4", "reason": "faces@4 is not in the registry",
         "running_layer": "device:box-failed", "running_generation": 4, **SERVING_3},
        None,
    ),
    "box-rolled-back": (
        {"phase": "rolled-back", "desired_model": "faces@4",
         "reason": "faces@4 failed its health window: NaN",
         "last_error": "inference failed: output 'y' contains NaN or infinite values", "last_error_at": T1,
         **SERVING_3},
        None,
    ),
    "box-first-start": (
        {"phase": "failed", "model": None, "running_model": None, "desired_model": "faces@4",
         "state": "error", "reason": "cannot open rtsp://cam"},
        None,
    ),
    # An agent from before running_model (and the fleet simulator): `model` names what failed to start.
    "box-older-agent": ({"phase": "failed", "model": "faces@4", "reason": "faces@4 failed to start"}, None),
    "box-in-flight": ({"phase": "pulling", "desired_model": "faces@4", **SERVING_3}, None),
    "box-degraded": ({**RUNNING_3, "state": "degraded"}, None),
    # Its last will said offline after its last report: what it reported is history.
    "box-offline": (RUNNING_3, _status("box-offline", "offline")),
    # Online again, started after its last report: that report is from the run before.
    "box-restarted": (RUNNING_3, _status("box-restarted", "online", started_at=T2, at=T2)),
}  # fmt: skip
TEXTS = {
    "box-ok": ("running", "faces@3", "faces@3", "running faces@3"),
    "box-failed": (
        "failed", "faces@3", "faces@4",
        "serving faces@3; desired faces@4 failed: faces@4 is not in the registry",
    ),
    "box-rolled-back": (
        "rolled-back", "faces@3", "faces@4",
        "serving faces@3; desired faces@4 rolled back: faces@4 failed its health window: NaN",
    ),
    "box-first-start": (
        "failed", None, "faces@4", "nothing serving; desired faces@4 failed: cannot open rtsp://cam"
    ),
    "box-older-agent": (
        "failed", None, "faces@4", "nothing serving; desired faces@4 failed: faces@4 failed to start"
    ),
    "box-in-flight": ("in-flight", "faces@3", "faces@4", "serving faces@3; desired faces@4 pulling"),
    "box-degraded": ("running", "faces@3", "faces@3", "running faces@3 (degraded)"),
    "box-offline": ("offline", None, "faces@3", f"offline; last reported at {T1}: running faces@3"),
    "box-restarted": (
        "stale", None, "faces@3",
        f"not reported since the agent started at {T2} (last report {T1}); it reported: running faces@3",
    ),
}  # fmt: skip
CONDITIONS = {
    "box-ok": "converged",
    "box-degraded": "converged",
    "box-failed": "failed",
    "box-rolled-back": "failed",
    "box-first-start": "failed",
    "box-older-agent": "failed",
    "box-in-flight": "in-flight",
    "box-offline": "offline",
    "box-restarted": "in-flight",
}


def test_fleet_status_says_what_serves_what_failed_and_who_is_offline(mosquitto: Mosquitto) -> None:
    for device, (pipeline, status) in CASES.items():
        publish(mosquitto, f"edge/{device}/status", status or _status(device, "online"))
        publish(mosquitto, f"edge/{device}/reported", _reported(device, pipeline))

    code, out = fleet_status(mosquitto)
    assert code == 4, out  # some failed
    devices = {d["device"]: d for d in out["devices"]}
    assert sorted(devices) == sorted(CASES)
    for device, (condition, serving, desired, text) in TEXTS.items():
        faces = devices[device]["pipelines"]["faces"]
        assert (faces["condition"], faces["serving"], faces["desired"], faces["text"]) == (
            condition, serving, desired, text,
        ), device  # fmt: skip
        assert devices[device]["condition"] == CONDITIONS[device], devices[device]
    rolled_back = devices["box-rolled-back"]["pipelines"]["faces"]
    assert rolled_back["last_error_at"] == T1 and "NaN" in rolled_back["last_error"]
    assert out["summary"] == {"devices": 9, "converged": 2, "failed": 4, "in-flight": 2, "offline": 1}

    offline = devices["box-offline"]
    assert offline["online"] is False and offline["presence"] == {
        "status": "offline",
        "at": T1,
        "started_at": None,
    }
    assert offline["pipelines"]["faces"]["phase"] == "running"  # as it was reported, kept for reference
    restarted = devices["box-restarted"]
    assert restarted["online"] is True and restarted["presence"]["started_at"] == T2
    assert restarted["stale"] == f"not reported since the agent started at {T2} (last report {T1})"
    assert restarted["why"] == restarted["stale"]

    code, table = fleet_table(mosquitto)
    assert code == 4, table
    for device, (_, _, _, text) in TEXTS.items():
        _line(table, device, f"faces: {text}")
    assert "onnxruntime/CPU" in _line(table, "box-failed")
    assert "onnxruntime/CPU" not in _line(table, "box-offline")  # nothing known to serve there
    assert "online (restarted, not reported since)" in _line(table, "box-restarted")
    assert "9 devices: 2 converged, 4 failed, 2 in flight, 1 offline" in table


# --- the local status line ----------------------------------------------------------------------


def _local_status(documents: dict[str, Any], pipelines: dict[str, Any]) -> str:
    """The fleet line `edge-agent status` shows for these pipelines' statuses (as status.json has them)."""
    outcomes = generation_outcomes(documents, statuses_of(pipelines))
    status = {"fleet": {"documents": outcomes}, "pipelines": pipelines}
    return _line(_render(status), "fleet:")


def _render(status: dict[str, Any]) -> str:
    from rich.console import Console

    console = Console(width=400, record=True)
    with console.capture() as capture:
        console.print(render(status))
    return capture.get()


def test_the_local_status_says_a_failed_generation_failed_and_what_serves() -> None:
    layer = "device:box"
    applied = {layer: {"observed_generation": 5, "applied_generation": 5, "state": "applied", "reason": None}}
    rolled_back = {
        "phase": "rolled-back", "layer": layer, "generation": 5, "desired_model": "faces@4",
        "running_model": "faces@3", "running_layer": layer, "running_generation": 4,
        "reason": "faces@4 failed its health window", "state": "running", "model": "faces@3",
    }  # fmt: skip
    line = _local_status(applied, {"faces": rolled_back})
    assert line.strip() == (
        f"fleet: {layer} generation 5 failed "
        f"(faces: faces@4 rolled back, serving faces@3 from {layer} generation 4)"
    )
    failed_first = {**rolled_back, "phase": "failed", "running_model": None, "model": None}
    del failed_first["running_layer"], failed_first["running_generation"]
    assert "generation 5 failed (faces: faces@4 failed, nothing serving)" in _local_status(
        applied, {"faces": failed_first}
    )
    running = {**rolled_back, "phase": "running", "desired_model": "faces@3"}
    assert _line_of(applied, running) == f"fleet: {layer} generation 5 applied"
    pulling = {**rolled_back, "phase": "pulling"}
    assert _line_of(applied, pulling) == f"fleet: {layer} generation 5 applying"
    refused = {layer: {**applied[layer], "observed_generation": 6, "state": "refused", "reason": "expired"}}
    assert _line_of(refused, running) == f"fleet: {layer} generation 6 refused; generation 5 applied"


def _line_of(documents: dict[str, Any], pipeline: dict[str, Any]) -> str:
    return _local_status(documents, {"faces": pipeline}).strip()


# --- a real agent --------------------------------------------------------------------------------

DEVICE = "truth-box"
FPS = 5.0


def _seconds(stamp: str) -> float:
    assert stamp.endswith("Z"), stamp
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _edge_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EDGE_AGENT, *args], capture_output=True, text=True, timeout=60, check=False)


def _local(config: Path) -> tuple[str, dict[str, Any]]:
    """`edge-agent status` as text and as JSON."""
    table = _edge_agent("status", "-c", str(config))
    assert table.returncode == 0, table.stderr
    data = _edge_agent("status", "-c", str(config), "--json")
    assert data.returncode == 0, data.stderr
    return table.stdout, json.loads(data.stdout)


def _cam_reports(reported: Reported) -> list[dict[str, Any]]:
    return [pipeline_in(json.loads(m.payload), "cam") for m in reported.subscriber.messages if m.payload]


@pytest.mark.slow
def test_a_real_agent_reports_what_serves_clears_its_last_error_and_goes_offline(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path = video[0]
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry, {"cam": pipeline_body(GOOD, path, FPS)})
    reported = Reported(mosquitto, DEVICE)
    results = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/cam")
    try:
        agent = start_agent(config)
        reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("phase") == "running" and p.get("running_model"),
            "cam running 1.0 from agent.yaml",
        )
        results.wait_until(lambda ms: len(ms) >= 3, timeout=60)

        # A version that gives NaN on live frames: rolled back in its window (3 s); 1.0 serves again.
        layer = f"device:{DEVICE}"
        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(layer, 1, {"cam": pipeline_body(NAN_LIVE, path, FPS)}),
        )
        state = reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("generation") == 1 and p.get("phase") == "rolled-back",
            "generation 1 rolled back",
            timeout=150,
        )
        cam = pipeline_in(state, "cam")
        assert (cam["running_model"], cam["desired_model"]) == (f"{MODEL}@{GOOD}", f"{MODEL}@{NAN_LIVE}"), cam
        assert (cam["running_layer"], cam["running_generation"]) == ("yaml", None), cam
        # The NaN frames' error, with its time and the version it came from, was reported...
        errors = [c for c in _cam_reports(reported) if c.get("last_error")]
        assert errors and "NaN or infinite" in errors[-1]["last_error"], errors
        error_at = _seconds(errors[-1]["last_error_at"])
        assert _seconds(state["updated_at"]) - 120 < error_at <= _seconds(state["updated_at"])

        code, out = fleet_status(mosquitto)
        assert code == 4, out
        truth = out["devices"][0]["pipelines"]["cam"]
        expected = (
            f"serving {MODEL}@{GOOD}; desired {MODEL}@{NAN_LIVE} rolled back: {MODEL}@{NAN_LIVE} failed its "
            "health window"
        )
        assert truth["text"].startswith(expected), truth
        assert (truth["condition"], truth["serving"], truth["desired"]) == (
            "rolled-back", f"{MODEL}@{GOOD}", f"{MODEL}@{NAN_LIVE}",
        )  # fmt: skip
        code, table = fleet_table(mosquitto)
        assert code == 4 and f"cam: {expected}" in _line(table, DEVICE), table

        text, local = _local(config)
        assert local["fleet"]["documents"][layer]["outcome"] == "failed", local["fleet"]
        assert local["fleet"]["documents"][layer]["state"] == "applied"  # accepted, but it does not serve
        assert (
            f"fleet: {layer} generation 1 failed (cam: {MODEL}@{NAN_LIVE} rolled back, serving "
            f"{MODEL}@{GOOD} from agent.yaml)"
        ) in text, text
        assert "generation 1 applied" not in text

        # ...and, once 1.0 has served cleanly for the window (3 s, 2 frames), is cleared.
        state = reported.wait(
            lambda r: (
                (p := pipeline_in(r, "cam")).get("phase") == "rolled-back" and p.get("last_error") is None
            ),
            "the last error cleared after a clean window",
            timeout=60,
        )
        assert pipeline_in(state, "cam")["last_error_at"] is None
        assert _local(config)[1]["pipelines"]["cam"]["last_error"] is None

        # A version missing from the registry: failed; 1.0 serves on.
        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(layer, 2, {"cam": pipeline_body(MISSING, path, FPS)}),
        )
        reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("generation") == 2 and p.get("phase") == "failed",
            "generation 2 failed",
            timeout=120,
        )
        code, out = fleet_status(mosquitto)
        truth = out["devices"][0]["pipelines"]["cam"]
        assert code == 4 and truth["condition"] == "failed", out
        assert truth["text"].startswith(f"serving {MODEL}@{GOOD}; desired {MODEL}@{MISSING} failed: "), truth
        assert MISSING in truth["text"].split("failed: ", 1)[1]
        text, local = _local(config)
        assert (
            f"fleet: {layer} generation 2 failed (cam: {MODEL}@{MISSING} failed, serving {MODEL}@{GOOD} from "
            "agent.yaml)"
        ) in text, text
        served = len(results.messages)
        wait_until(lambda: len(results.messages) >= served + 3, f"{MODEL}@{GOOD} serving on", timeout=60)
        assert {json.loads(m.payload)["model"]["version"] for m in results.messages[served:]} == {GOOD}
        agent.stop()

        # Stopped: its status says offline; its retained reported state still says what it ran.
        code, out = fleet_status(mosquitto)
        assert code == 7, out
        device = out["devices"][0]
        assert device["online"] is False and device["condition"] == "offline"
        cam = device["pipelines"]["cam"]
        assert cam["phase"] == "failed"  # as last reported, kept for reference
        assert cam["condition"] == "offline" and cam["serving"] is None, cam
        last = device["last_seen"]
        assert cam["text"].startswith(f"offline; last reported at {last}: serving {MODEL}@{GOOD}"), cam
        code, table = fleet_table(mosquitto)
        assert code == 7 and "cam: offline; last reported at" in _line(table, DEVICE), table
    finally:
        results.close()
        reported.close()
