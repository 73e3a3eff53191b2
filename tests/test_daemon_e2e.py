"""The daemon end to end, as a user runs it: `edge-agent run` as a subprocess, a real mosquitto,
a real trained model published to a file registry, a real video decoded by OpenCV."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agent_process import EDGE_AGENT, StartAgent
from tests.daemon_fixtures import (
    DEVICE,
    LABELS,
    MODEL,
    VERSION,
    outbox_pending,
    parse_time,
    pipeline,
    results_of,
    write_config,
)
from tests.media_fixtures import demo_video_module
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import free_port, wait_until

# --- the main job ----------------------------------------------------------------------------


def test_results_arrive_over_mqtt_and_agree_with_the_video(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, truth = video
    config = write_config(
        tmp_path, mosquitto.port, registry_dir, [pipeline("signs", str(path))], benchmark=True
    )
    results_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/#")
    status_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")

    # The first start serves on the CPU reference at once while the top candidates are proven on its
    # first frame beside it (backends.prove_in_background); the winner takes over between two frames.
    agent = start_agent(config)
    decision_file = tmp_path / "state" / "decisions" / "pipelines" / "signs.json"

    def proven() -> bool:
        return decision_file.exists() and json.loads(decision_file.read_text())["decision"]["checked"]

    log = agent.run_until(
        lambda: len(results_sub.messages) >= 12 and proven(), "the video's 12 results and a proven decision"
    )
    decision = json.loads(decision_file.read_text())
    chosen = decision["decision"]["backend"]
    assert (
        decision["decision"]["checked"]
        and decision["decision"]["reference"] == "onnxruntime/CPUExecutionProvider"
    )
    assert f"chose {chosen} for ch_ppocr_mobile_v2.0_cls_infer.onnx" in log

    results = results_of(results_sub.wait_for(12, timeout=10))
    assert len(results) == 12, [r["source"]["position_s"] for r in results]
    backends = [r["backend"] for r in results]
    on_reference = backends.index(chosen) if chosen in backends else len(backends)
    assert set(backends[:on_reference]) <= {"onnxruntime/CPUExecutionProvider"}, backends
    assert set(backends[on_reference:]) <= {chosen}, backends  # once taken over, it stays
    assert [r["seq"] for r in results] == list(range(1, 13))
    assert len({r["id"] for r in results}) == 12
    for r in results:
        assert set(r) == {"id", "device", "pipeline", "seq", "captured_at", "produced_at", "published_at",
                          "model", "backend", "precision", "latency_ms", "source", "output",
                          "held_back"}  # fmt: skip
        assert (r["device"], r["pipeline"]) == (DEVICE, "signs")
        assert r["model"]["name"] == MODEL and r["model"]["version"] == VERSION
        assert len(r["model"]["sha256"]) == 64
        assert r["precision"] in ("fp32", "bf16")
        assert parse_time(r["captured_at"]) <= parse_time(r["produced_at"]) <= parse_time(r["published_at"])
        assert r["latency_ms"]["inference"] > 0
        assert r["held_back"] == 0  # no report rules: every result is published
        assert r["source"]["uri"] == str(path)
        top = r["output"]["top"]
        assert [t["label"] for t in top] == sorted(LABELS, key=lambda label: label != top[0]["label"])
        assert abs(sum(t["score"] for t in top) - 1.0) < 1e-3
        shown = demo_video_module().truth_at(truth, r["source"]["position_s"])
        assert shown is not None and top[0]["label"] == shown["orientation"], (r["source"], top, shown)
    positions = [r["source"]["position_s"] for r in results]
    assert positions == pytest.approx([i * 0.5 for i in range(12)], abs=0.05)

    def saw_offline(msgs: list[Any]) -> bool:
        return any(json.loads(m.payload)["status"] == "offline" for m in msgs)

    statuses = [json.loads(m.payload) for m in status_sub.wait_until(saw_offline, timeout=10)]
    online = [s for s in statuses if s["status"] == "online"]
    assert online and any(s["pipelines"]["signs"]["state"] == "running" for s in online)
    assert statuses[-1]["status"] == "offline" and statuses[-1]["agent_version"]

    # The store holds the verified model; `models list --json` shows it.
    listed = json.loads(subprocess.run(
        [EDGE_AGENT, "models", "list", "-c", str(config), "--json"],
        check=True, capture_output=True, text=True, timeout=30).stdout)  # fmt: skip
    assert [(m["name"], m["version"]) for m in listed] == [(MODEL, VERSION)]
    assert listed[0]["artifacts"][0]["sha256"] == results[0]["model"]["sha256"]


@pytest.mark.slow
def test_results_made_while_the_broker_is_down_all_arrive_when_it_comes_up(
    tmp_path: Path,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    broker = Mosquitto(tmp_path / "broker", persistence=True)
    broker.start()
    try:
        # A persistent session: the broker keeps what arrives for this watcher until it is back.
        topic = f"edge/{DEVICE}/results/#"
        sub = mqtt_subscriber_factory(broker, topic, persistent=True, client_id="watcher")
        broker.stop()
        config = write_config(tmp_path, broker.port, registry_dir, [pipeline("signs", str(path))])
        agent = start_agent(config)
        state_dir = tmp_path / "state"
        wait_until(lambda: outbox_pending(state_dir) >= 4, "results queued in the outbox", timeout=120)
        assert agent.poll() is None, "the agent must keep running without a broker"
        broker_up = time.time()
        broker.start()
        log = agent.run_until(
            lambda: len(sub.messages) >= 12, "the video's 12 results after the broker came up"
        )
        results = results_of(sub.wait_for(12))
        assert sorted(r["seq"] for r in results) == list(range(1, 13))
        waited = [r for r in results if parse_time(r["produced_at"]).timestamp() < broker_up]
        assert len(waited) >= 4
        # They were sent when the broker came up, not when they were made.
        assert all(parse_time(r["published_at"]).timestamp() >= broker_up - 0.01 for r in waited)
        assert outbox_pending(state_dir) == 0
        assert "stay queued" not in log
    finally:
        broker.close()


@pytest.mark.slow
def test_a_bad_model_and_a_dead_source_do_not_stop_the_good_pipeline(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    # A version whose manifest is right about its bytes, but the bytes are not ONNX.
    bad_dir = registry_dir / "broken-model" / "1"
    bad_dir.mkdir(parents=True)
    junk = b"this is a JPEG, not an ONNX model" * 10
    (bad_dir / "model.onnx").write_bytes(junk)

    manifest = {
        "schema_version": 1, "name": "broken-model", "version": "1", "created": "2026-11-22T10:00:00Z",
        "artifacts": [{"file": "model.onnx", "sha256": hashlib.sha256(junk).hexdigest(), "size": len(junk),
                       "format": "onnx", "target": "any"}],
    }  # fmt: skip
    (bad_dir / "manifest.json").write_text(json.dumps(manifest))
    dead_port = free_port()
    config = write_config(
        tmp_path,
        mosquitto.port,
        registry_dir,
        [
            pipeline("good", str(path), loop=True),
            pipeline("bad-model", str(path), model="broken-model", version="1"),
            pipeline("missing-file", str(tmp_path / "no-such-video.mp4"), reopen_min_s=0.2, reopen_max_s=0.5),
            pipeline("dead-camera", f"rtsp://admin:hunter2@127.0.0.1:{dead_port}/stream", reopen_max_s=1.0),
        ],
    )
    results_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/#")
    status_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    status_path = tmp_path / "state" / "status.json"

    def settled() -> bool:
        """The good pipeline delivers, the others are in their error states, the missing file retried."""
        with contextlib.suppress(OSError, ValueError, KeyError):  # not written yet, or not all there
            states = json.loads(status_path.read_text())["pipelines"]
            return (
                len(results_sub.messages) >= 6
                and states["good"]["state"] == "running"
                and states["bad-model"]["state"] == "error"
                and states["missing-file"]["source"]["reconnects"] >= 3
                and states["dead-camera"]["state"] == "source-unavailable"
            )
        return False

    log = start_agent(config).run_until(settled, "the good pipeline's results and the others' errors")

    results = results_of(results_sub.wait_for(6))
    assert {r["pipeline"] for r in results} == {"good"}
    statuses = [json.loads(m.payload) for m in status_sub.messages]
    online = [s for s in statuses if s["status"] == "online"]
    last = online[-1]["pipelines"]
    assert last["good"]["state"] == "running"
    assert last["bad-model"]["state"] == "error"
    assert "not a valid ONNX model" in last["bad-model"]["error"]
    assert last["missing-file"]["state"] == "source-unavailable"
    assert "does not exist" in last["missing-file"]["error"]
    assert last["dead-camera"]["state"] == "source-unavailable"
    assert "hunter2" not in json.dumps(online) and "hunter2" not in log
    assert "pipeline bad-model not started" in log and "not a valid ONNX model" in log
    status_file = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status_file["pipelines"]["missing-file"]["source"]["reconnects"] >= 3  # retried with backoff
    assert status_file["pipelines"]["bad-model"]["attempts"] >= 1


def _signs_testdata(path: Path, cls_model_path: Path) -> Path:
    """Two rendered signs (one upside down), preprocessed as the pipeline does, with the outputs the
    model gives on onnxruntime CPU as the expected outputs."""
    import numpy as np
    import onnxruntime as ort

    from agent.processing import Preprocessor
    from providers import TensorSpec
    from tests.media_fixtures import CLS_PREPROCESS, demo_video_module

    rng = np.random.default_rng(7)
    render = demo_video_module().render_sign
    preprocess = Preprocessor(CLS_PREPROCESS, [TensorSpec("x", (None, 3, 48, 192), "float32")])
    batch = np.concatenate([preprocess(render("LOADING BAY 3", flip, rng)) for flip in (False, True)])
    session = ort.InferenceSession(str(cls_model_path), providers=["CPUExecutionProvider"])
    [output] = session.get_outputs()
    [probs] = session.run(None, {"x": batch})
    assert list(probs.argmax(axis=1)) == [0, 1]  # upright, upside down: real inputs, right answers
    np.savez(path, x=batch, **{f"expected:{output.name}": probs})
    return path


@pytest.mark.slow
def test_test_data_proves_the_backends_and_build_steps_show_in_log_and_status(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    cls_model_path: Path,
    start_agent: StartAgent,
) -> None:
    """Published test data proves the candidates although the camera never delivers a frame; a
    second pipeline, whose model has no test data, waits for a frame from its dead camera: that
    step shows in status.json and in the status over MQTT while it lasts."""
    root = tmp_path / "registry"
    testdata = _signs_testdata(tmp_path / "inputs.npz", cls_model_path)
    for version, extra in (("2.0", ["--test-data", str(testdata)]), ("2.1", [])):
        subprocess.run(
            [EDGE_AGENT, "registry", "publish", str(cls_model_path), "--name", MODEL, "--version", version,
             "--registry", f"file://{root}", *extra],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    dead = f"rtsp://127.0.0.1:{free_port()}/stream"
    config = write_config(
        tmp_path,
        mosquitto.port,
        root,
        [
            pipeline("signs", dead, reopen_max_s=1.0),
            pipeline("waiting", dead, version="2.1", reopen_max_s=1.0),
        ],
        benchmark=True,
    )
    settings = yaml.safe_load(config.read_text())
    # The build steps of proving before serving (not beside it: prove_in_background off). The wait for
    # a frame (sample_timeout_s) spans at least one status.json write (every 5 s).
    settings["backends"].update(
        max_trials=2, runs=3, warmup=1, budget_s=1.0, sample_timeout_s=8.0, prove_in_background=False
    )
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    status_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    agent = start_agent(config)
    status_path = tmp_path / "state" / "status.json"

    def waiting_phase() -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            state: dict[str, Any] = json.loads(status_path.read_text())["pipelines"]["waiting"]
            return state if state.get("step") == "getting inputs to prove backends on" else None
        return None

    wait_until(
        lambda: waiting_phase() is not None, "the waiting pipeline's phase in status.json", timeout=120
    )
    shown = waiting_phase()
    assert shown is not None and shown["state"] == "starting" and shown["step_s"] >= 0
    gave_up_waiting = "pipeline waiting: no frame from its source within 8 s"
    # Neither camera ever delivers: once both pipelines have started and failed to open it, `run`
    # exits 1 (no pipeline ran); stopped before the second has, 0. Either is right here.
    log = agent.run_until(
        lambda: "pipeline signs started" in (text := agent.log()) and gave_up_waiting in text,
        "signs to start and waiting to give up on a frame",
        exit_codes=(0, 1),
    )

    record = json.loads((tmp_path / "state" / "decisions" / "pipelines" / "signs.json").read_text())
    decision = record["decision"]
    assert decision["checked"] is True and decision["inputs"] == "test data inputs.npz"
    assert decision["reference"] == "the expected outputs in test data inputs.npz"
    tried = [c for c in decision["candidates"] if c["median_ms"] is not None]
    assert len(tried) == 2 and all(c["max_abs_diff"] is not None for c in tried)
    chosen = decision["backend"]
    for step in (
        f"pipeline signs: pulling {MODEL}@2.0",
        "pipeline signs: trial 1: ",
        "pipeline signs: trial 2: ",
        f"pipeline signs: loading ch_ppocr_mobile_v2.0_cls_infer.onnx on {chosen}",
        f"pipeline signs: warming up on {chosen}",
        "pipeline signs started",
        "pipeline waiting: getting inputs to prove backends on",
        "pipeline waiting: no frame from its source within 8 s; "
        "serving on the full-precision CPU reference, outputs not checked",
    ):
        assert step in log, step
    # Its own test data proved "signs": it never waited for a frame.
    assert "pipeline signs: no frame" not in log and "pipeline signs: getting inputs" in log
    online = [json.loads(m.payload) for m in status_sub.messages]
    steps = [s["pipelines"]["waiting"].get("step") for s in online if s["status"] == "online"]
    assert "getting inputs to prove backends on" in steps, online


@pytest.mark.slow
def test_sigterm_stops_gracefully_with_sd_notify(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path, _ = video
    notify_path = tmp_path / "notify.sock"
    notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_sock.bind(str(notify_path))
    notify_sock.settimeout(0.2)
    config = write_config(tmp_path, mosquitto.port, registry_dir, [pipeline("signs", str(path), loop=True)])
    results_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/#")
    status_sub = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/status")
    agent = start_agent(config, env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "2000000"})

    notes: list[str] = []
    deadline = time.monotonic() + 180  # a pull, a backend choice and a warm-up on a busy machine
    while not any("WATCHDOG=1" in n for n in notes) or len(results_sub.messages) < 3:
        assert time.monotonic() < deadline, f"no READY/WATCHDOG/results: {notes}"
        with contextlib.suppress(TimeoutError):
            notes.append(notify_sock.recv(4096).decode())
    agent.stop()
    while True:
        try:
            notes.append(notify_sock.recv(4096).decode())
        except TimeoutError:
            break
    notify_sock.close()

    ready = next(i for i, n in enumerate(notes) if "READY=1" in n)
    stopping = next(i for i, n in enumerate(notes) if "STOPPING=1" in n)
    assert ready < stopping
    assert any("WATCHDOG=1" in n for n in notes[ready:stopping])
    assert any(n.startswith("STATUS=") or "\nSTATUS=" in n for n in notes)
    # Everything produced was delivered before exit, in sequence, and `offline` was published.
    status_file = json.loads((tmp_path / "state" / "status.json").read_text())
    produced = status_file["pipelines"]["signs"]["results"]
    results = results_of(results_sub.wait_for(produced, timeout=10))
    assert [r["seq"] for r in results] == list(range(1, produced + 1))
    assert outbox_pending(tmp_path / "state") == 0
    status_sub.wait_until(lambda msgs: json.loads(msgs[-1].payload)["status"] == "offline", timeout=10)


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (Path(__file__).resolve().parents[1] / "systemd" / "edge-agent.service").read_text()
    for directive in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "StateDirectory=edge-agent",
                      "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                      "StateDirectoryMode=0700\n", "UMask=0077\n"):  # fmt: skip
        assert directive in unit
    # `verify` checks that ExecStart exists: point it at this checkout's console script.
    local = unit.replace("/opt/edge-agent/venv/bin/edge-agent", EDGE_AGENT)
    (tmp_path / "edge-agent.service").write_text(local)
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is installed by scripts/setup.sh"
    done = subprocess.run([analyze, "verify", str(tmp_path / "edge-agent.service")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [line for line in (done.stdout + done.stderr).splitlines() if "edge-agent.service" in line]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr


def test_an_unusable_state_dir_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"device": {"id": DEVICE}, "state_dir": str(blocker / "state")}))
    done = subprocess.run([EDGE_AGENT, "run", "-c", str(config), "--duration", "1"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert f"error: cannot use state_dir {blocker / 'state'}:" in done.stderr
    assert "hint: it must be a writable directory" in done.stderr
    assert "Traceback" not in done.stderr
