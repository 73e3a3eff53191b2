"""The typed pipeline status (agent/status.py): its JSON keeps the keys and their order that
status.json, `edge-agent status --json` and scripts know (written out here as the code before the
types built them), the smaller records made of it (MQTT status, reported state, a document's
outcome) say the same, and JSON reads back into the same status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.status import (
    PHASES,
    AudioCounters,
    ChangeStatus,
    Chosen,
    Counts,
    Download,
    LastError,
    Latency,
    Origin,
    Percentiles,
    PipelineStatus,
    ReplayCounters,
    RunStatus,
    SensorCounters,
    SerialCounters,
    Serving,
    SourceCounters,
    SourceStatus,
    StageStatus,
    Step,
    VideoCounters,
    phase_of,
    pipeline_status,
    run_state,
    run_status,
    statuses_json,
    statuses_of,
)

SINCE = "2026-01-02T03:04:05.678Z"
CPU = "onnxruntime/CPUExecutionProvider"
VIDEO = VideoCounters(120, 3)
CHOSEN = Chosen("model.onnx", True)


def _source(counters: SourceCounters = VIDEO, state: Any = "streaming") -> SourceStatus:
    return SourceStatus("rtsp://cam/1", state, None, counters, 4, 1, 2, 1, 3.5)


def _run(chosen: Chosen | None = CHOSEN, tracking: Any = None, degraded: bool = False) -> RunStatus:
    counts = Counts(
        results=10,
        inferences=12,
        degraded=degraded,
        errors=2,
        last_error=LastError("inference failed: busy", SINCE, "det@3"),
        mean_inference_ms=4.25,
        fps=9.5,
        latency=Latency(Percentiles(4.0, 6.5), None),
    )
    stage = StageStatus("det@3", Serving(CPU, "fp32", "chose it", chosen), ("a -> b: why",), {"min_score": 2})
    return run_status(stage, counts, _source(), stage_swaps=1, finished=False, tracking=tracking)


def _change(**extra: Any) -> ChangeStatus:
    return ChangeStatus("running", None, SINCE, Origin("device:box", 4), 1, "det@3", **extra)


def test_a_running_pipelines_json_has_todays_keys_in_todays_order() -> None:
    tracking = {"tracks": 1, "started": 1, "ended": 0, "zones": {}, "lines": {}}
    status = pipeline_status(
        _run(tracking=tracking), _change(running_from=Origin("yaml", None))
    ).with_dropped(5)
    expected = {
        "state": "running",
        "error": None,
        "model": "det@3",
        "backend": CPU,
        "precision": "fp32",
        "artifact": "model.onnx",
        "proven": True,
        "backend_why": "chose it",
        "stage_swaps": 1,
        "backend_switches": ["a -> b: why"],
        "results": 10,
        "inferences": 12,
        "held_back": {"min_score": 2},
        "errors": 2,
        "last_error": "inference failed: busy",
        "last_error_at": SINCE,
        "last_error_model": "det@3",
        "mean_inference_ms": 4.25,
        "fps": 9.5,
        "latency_ms": {"inference": {"p50": 4.0, "p95": 6.5}, "capture_to_result": None},
        "source": {
            "uri": "rtsp://cam/1",
            "state": "streaming",
            "error": None,
            "frames_decoded": 120,
            "frames_skipped_by_fps": 3,
            "frames_dropped": 4,
            "queued": 1,
            "reconnects": 2,
            "outages": 1,
            "last_outage_s": 3.5,
        },
        "tracking": tracking,
        "running_model": "det@3",
        "phase": "running",
        "reason": None,
        "since": SINCE,
        "layer": "device:box",
        "generation": 4,
        "attempts": 1,
        "desired_model": "det@3",
        "running_layer": "yaml",
        "running_generation": None,
        "results_dropped": 5,
    }
    assert json.dumps(status.to_json()) == json.dumps(expected)  # the order too


def test_a_session_not_chosen_has_no_artifact_or_proof_and_no_tracking() -> None:
    data = pipeline_status(_run(chosen=None), _change()).to_json()
    assert list(data)[:6] == ["state", "error", "model", "backend", "precision", "backend_why"]
    assert "artifact" not in data and "proven" not in data and "tracking" not in data
    assert "running_layer" not in data and "step" not in data and "results_dropped" not in data
    assert "steps" not in data  # no step shows anything of itself


def test_nothing_running_is_the_change_alone() -> None:
    download = Download("model.onnx", 100, 400, 50)
    change = ChangeStatus(
        "pulling",
        None,
        SINCE,
        Origin("yaml", None),
        2,
        "det@4",
        step=Step("pulling det@4", 1.5),
        download=download,
    )
    assert json.dumps(pipeline_status(None, change).to_json()) == json.dumps(
        {
            "state": "starting",
            "error": None,
            "backend_why": None,
            "running_model": None,
            "phase": "pulling",
            "reason": None,
            "since": SINCE,
            "layer": "yaml",
            "generation": None,
            "attempts": 2,
            "desired_model": "det@4",
            "step": "pulling det@4",
            "step_s": 1.5,
            "download": {"artifact": "model.onnx", "bytes": 100, "total": 400, "rate_bps": 50},
        }
    )
    failed = pipeline_status(
        None, ChangeStatus("failed", "no such model", SINCE, Origin("yaml", None), 3, "x@1")
    )
    assert (failed.state, failed.error) == ("error", "no such model")


def test_the_run_state_is_made_of_the_threads_the_counters_and_the_source() -> None:
    assert run_state(finished=True, degraded=False, source="finished") == "finished"
    assert run_state(finished=True, degraded=True, source="streaming") == "stopped"
    assert run_state(finished=False, degraded=True, source="retrying") == "degraded"
    assert run_state(finished=False, degraded=False, source="retrying") == "source-unavailable"
    assert run_state(finished=False, degraded=False, source="streaming") == "running"
    degraded = _run(degraded=True)
    assert (degraded.state, degraded.error) == ("degraded", "inference failed: busy")


def test_the_smaller_records_say_the_same() -> None:
    status = pipeline_status(_run(), _change(step=Step("warming up", 0.5)))
    assert status.brief_json() == {
        "state": "running",
        "error": None,
        "phase": "running",
        "step": "warming up",
    }
    reported = status.reported_json(lambda text: None if text is None else text[:5])
    assert list(reported) == [
        "phase", "since", "reason", "layer", "generation", "model", "desired_model", "running_model",
        "running_layer", "running_generation", "backend", "precision", "artifact", "proven", "backend_why",
        "state", "last_error", "last_error_at",
    ]  # fmt: skip
    assert (
        reported["backend_why"] == "chose"
        and reported["last_error"] == "infer"
        and reported["proven"] is True
    )
    nothing = pipeline_status(None, ChangeStatus("failed", "gone", SINCE, Origin("yaml", None), 1, "x@1"))
    assert nothing.reported_json(lambda t: t)["model"] is None and nothing.outcome_json(
        "cam", lambda t: t
    ) == {
        "pipeline": "cam",
        "phase": "failed",
        "desired_model": "x@1",
        "reason": "gone",
        "running_model": None,
        "running_layer": None,
        "running_generation": None,
    }


@pytest.mark.parametrize(
    "counters",
    [
        SourceCounters(),
        VideoCounters(5, 0),
        AudioCounters(7),
        ReplayCounters(20, 1, "a.csv:3: bad", 2),
        SensorCounters(9, 0, None, 3),
        SerialCounters(6, 1, "line 3: not UTF-8 text", 2),
    ],
)
def test_json_reads_back_into_the_same_status(counters: SourceCounters) -> None:
    run = run_status(
        _run().stage,
        _run().counts,
        _source(counters, "retrying"),
        0,
        False,
        {"tracks": 0, "zones": {}, "lines": {}},
        {"motion": {"motion": False, "frames_gated": 7}},  # what steps show of themselves
    )
    statuses = {
        "cam": pipeline_status(
            run, _change(running_from=Origin("group:g", 2), step=Step("x", 1.0))
        ).with_dropped(0),
        "new": pipeline_status(None, _change(download=Download("m.onnx", 1, 2, 3))),
    }
    data = json.loads(json.dumps(statuses_json(statuses)))
    assert statuses_of(data) == statuses
    assert json.dumps(statuses_json(statuses_of(data))) == json.dumps(data)


def test_json_of_another_version_reads_leniently() -> None:
    """A daemon that wrote fewer keys: what is missing reads as empty, never a KeyError."""
    status = PipelineStatus.from_json({"state": "running", "model": "det@3", "backend": CPU})
    assert status.run is not None and status.serving == Serving(CPU, "", None)
    assert (
        status.phase == "running" and status.run.counts.results == 0 and status.run.source.frames_dropped == 0
    )
    assert PipelineStatus.from_json({}).run is None
    source_only = PipelineStatus.from_json(
        {"state": "running", "source": {"state": "streaming", "error": None}}
    )
    assert source_only.run is not None and source_only.run.source.state == "streaming"


def test_phases_are_one_vocabulary() -> None:
    assert [phase_of(p) for p in PHASES] == list(PHASES)
    with pytest.raises(ValueError, match="unknown phase 'compiling'"):
        phase_of("compiling")
