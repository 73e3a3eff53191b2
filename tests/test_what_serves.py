"""What is shown is what runs: through a pipeline's life on a real agent (a first start on the CPU
reference, the background proof that may switch it, a fleet swap to another version, a version that
fails its health window and is rolled back, one that cannot be pulled), `edge-agent status` (text
and --json), the retained
reported state and `edge-agent explain` always name the backend and the version that produced the
latest results, and the last error goes once the pipeline has run cleanly for a health window.

Real components: mosquitto on a loopback port, a file registry with the real PP-OCR direction
classifier (scripts/fleet_agents.py), a real video, `edge-agent run` in its own process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agent.cli import app
from agent.control import ask, socket_path
from tests.agent_process import StartAgent
from tests.fleet_fixtures import (
    GOOD,
    MISSING,
    MODEL,
    NAN_LIVE,
    NEWER,
    Reported,
    agent_config,
    document,
    pipeline_body,
    pipeline_in,
    publish,
    publish_fleet_versions,
)
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import wait_until

DEVICE = "serving-box"
FPS = 5.0
REFERENCE = "onnxruntime/CPUExecutionProvider"
ARTIFACT = "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def _views(config: Path, state_dir: Path, reported: Reported, results: Subscriber) -> dict[str, Any]:
    """What each view says serves `cam`, beside what produced its latest result."""
    latest = json.loads(results.messages[-1].payload)
    status = ask(socket_path(state_dir), "status")["status"]["pipelines"]["cam"]
    text = CliRunner().invoke(app, ["status", "-c", str(config)], env={"COLUMNS": "400"})
    explained = CliRunner().invoke(app, ["explain", "cam", "-c", str(config), "--json"])
    [record] = json.loads(explained.stdout)
    cam = pipeline_in(reported.latest(), "cam")
    serving = record["serving"]
    return {
        "result": (latest["backend"], f"{MODEL}@{latest['model']['version']}"),
        "backend": latest["backend"],
        "status": (status["backend"], status["model"]),
        "status_text": text.stdout,
        "status_why": status["backend_why"] or "",
        "reported": (cam.get("backend"), cam.get("model")),
        "explain": (serving["backend"], record["model"]),
        # Beyond backend and version: the artifact, precision and proof, alike in each view.
        "details": {
            (status.get("artifact"), status.get("precision"), status.get("proven")),
            (cam.get("artifact"), cam.get("precision"), cam.get("proven")),
            (serving.get("artifact"), serving.get("precision"), serving.get("proven")),
        },
        "live": record.get("live"),
        "proven": status.get("proven"),
        "last_error": status.get("last_error"),
    }


def _agree(
    config: Path, state_dir: Path, reported: Reported, results: Subscriber, what: str, **want: Any
) -> dict[str, Any]:
    """Wait until every view names what produced the latest result (and `want` holds of the views);
    return them. A view that lags is waited for, one that names another backend or version fails."""
    seen: dict[str, Any] = {}

    def agreed() -> bool:
        if not results.messages:
            return False
        seen.update(_views(config, state_dir, reported, results))
        backend, model = seen["result"]
        return (
            seen["status"] == seen["reported"] == seen["explain"] == (backend, model)
            and f"{backend}" in seen["status_text"]
            and model in seen["status_text"]
            and backend in seen["status_why"]
            and seen["live"] is True
            and len(seen["details"]) == 1
            and all(seen.get(key) == value for key, value in want.items())
        )

    wait_until(agreed, what, timeout=120, interval=0.2, state=lambda: seen)
    return seen


@pytest.mark.slow
def test_status_reported_and_explain_name_what_produced_the_latest_results(
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
    settings = yaml.safe_load(config.read_text())
    # Benchmarking on, proven beside the serving reference (backends.prove_in_background, the default);
    # trials of 2 s each, so the first start's views can be read before the proof ends.
    settings["backends"] = {"benchmark": True, "max_trials": 2, "runs": 3, "warmup": 1, "min_time_s": 2.0}
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    state_dir = Path(settings["state_dir"])
    reported = Reported(mosquitto, DEVICE)
    results = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/results/cam")
    try:
        agent = start_agent(config)
        # 1. A first start: the full-precision reference serves at once, unproven.
        results.wait_until(lambda ms: len(ms) >= 1, timeout=120)
        first = json.loads(results.messages[0].payload)
        assert (first["backend"], first["model"]["version"]) == (REFERENCE, GOOD), first
        start = _agree(
            config,
            state_dir,
            reported,
            results,
            "the first start in every view",
            proven=False,
            backend=REFERENCE,
        )
        assert "serving on the full-precision reference until a sample proves" in start["status_why"]
        assert (REFERENCE, f"{MODEL}@{GOOD}") == start["result"]

        # 2. The background proof on a frame: once its choice serves, every view names it.
        record = state_dir / "decisions" / "pipelines" / "cam.json"
        wait_until(
            lambda: record.exists() and json.loads(record.read_text())["decision"]["checked"],
            "the proof on a frame",
            timeout=120,
        )
        decision = json.loads(record.read_text())["decision"]
        chosen = decision["backend"]
        proven = _agree(
            config,
            state_dir,
            reported,
            results,
            "the proven choice in every view",
            proven=True,
            backend=chosen,
        )
        assert proven["result"] == (chosen, f"{MODEL}@{GOOD}"), proven
        assert f"chose {chosen} for {ARTIFACT}" in proven["status_why"]
        # The first-start note is gone: it described the reference before the proof.
        assert "until a sample proves" not in proven["status_why"]
        backends = {json.loads(m.payload)["backend"] for m in results.messages}
        assert backends <= {REFERENCE, chosen}, backends

        # 3. A fleet swap to 2.0 (the same file: its proven decision is the cached one).
        layer = f"device:{DEVICE}"
        publish(
            mosquitto, f"edge/{DEVICE}/desired", document(layer, 1, {"cam": pipeline_body(NEWER, path, FPS)})
        )
        reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("generation") == 1 and p.get("phase") == "running",
            "generation 1 running",
            timeout=150,
        )
        swapped = _agree(config, state_dir, reported, results, "2.0 in every view")
        assert swapped["result"] == (chosen, f"{MODEL}@{NEWER}"), swapped

        # 4. A version that gives NaN on live frames fails its window and is rolled back to 2.0.
        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(layer, 2, {"cam": pipeline_body(NAN_LIVE, path, FPS)}),
        )
        state = reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("generation") == 2 and p.get("phase") == "rolled-back",
            "generation 2 rolled back",
            timeout=150,
        )
        assert "failed its health window" in pipeline_in(state, "cam")["reason"]
        back = _agree(config, state_dir, reported, results, "2.0 again in every view after the rollback")
        assert back["result"] == (chosen, f"{MODEL}@{NEWER}"), back
        # Why 2.0 runs, not why the failed one did (a median such as "14.05 ms" is not the version).
        version = rf"(?<![\d.]){re.escape(NAN_LIVE)}(?!\d)"
        assert not re.search(version, back["status_why"]), back["status_why"]

        # The NaN version's error was reported with its time, and goes after a clean window (3 s).
        errors = [
            pipeline_in(json.loads(m.payload), "cam")
            for m in reported.subscriber.messages
            if m.payload and pipeline_in(json.loads(m.payload), "cam").get("last_error")
        ]
        assert errors and "NaN or infinite" in errors[-1]["last_error"] and errors[-1]["last_error_at"]
        cleared = _agree(
            config,
            state_dir,
            reported,
            results,
            "the last error cleared after a clean window",
            last_error=None,
        )
        reported.wait(
            lambda r: pipeline_in(r, "cam").get("last_error") is None,
            "the reported state without it",
            timeout=60,
        )
        assert cleared["result"] == (chosen, f"{MODEL}@{NEWER}")

        # 5. A version missing from the registry never builds: 2.0 serves on, and every view says so.
        publish(
            mosquitto,
            f"edge/{DEVICE}/desired",
            document(layer, 3, {"cam": pipeline_body(MISSING, path, FPS)}),
        )
        reported.wait(
            lambda r: (p := pipeline_in(r, "cam")).get("generation") == 3 and p.get("phase") == "failed",
            "generation 3 failed",
            timeout=150,
        )
        served = len(results.messages)
        results.wait_until(lambda ms: len(ms) >= served + 2, timeout=60)
        kept = _agree(config, state_dir, reported, results, "2.0 in every view after a failed pull")
        assert kept["result"] == (chosen, f"{MODEL}@{NEWER}"), kept
        agent.stop()
    finally:
        results.close()
        reported.close()
