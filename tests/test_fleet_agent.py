"""One real agent (`edge-agent run`) taking desired state over a real mosquitto: a group deployment
hot-swaps the model on a live video stream (every result accounted for, the gap measured, the
camera never reopened), bad documents and bad versions are refused or rolled back with the reason
in reported state while the running pipeline serves on, and accepted state survives a restart."""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.fleet import protocol
from agent.registry import PublishOptions
from agent.registry.file_registry import FileRegistry
from agent.registry.signing import generate_key, load_private_key
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import (
    BAD_TESTDATA,
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
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import wait_until

DEVICE = "fleet-box"
GROUP_TOPIC = "edge/groups/lobby/desired"
DEVICE_TOPIC = f"edge/{DEVICE}/desired"
FPS = 5.0


@pytest.fixture
def fleet_registry(tmp_path: Path, cls_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)


def _running(version: str) -> Any:
    return lambda r: (
        (p := pipeline_in(r, "cam")).get("phase") == "running" and p.get("model") == f"{MODEL}@{version}"
    )


@pytest.mark.slow
def test_a_group_deployment_hot_swaps_the_model_on_a_live_stream(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    fleet_registry: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path = video[0]
    # "other" is in agent.yaml and not in the document: it must not be touched.
    yaml_pipelines = {"cam": pipeline_body(GOOD, path, FPS), "other": pipeline_body(GOOD, path, 1.0)}
    config = agent_config(tmp_path, DEVICE, mosquitto.port, fleet_registry, yaml_pipelines)
    results = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/cam")
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    reported.wait(_running(GOOD), "cam running 1.0 from agent.yaml")
    results.wait_until(lambda ms: len(ms) >= 5, timeout=60)

    publish(mosquitto, GROUP_TOPIC, document("group:lobby", 1, {"cam": pipeline_body(NEWER, path, FPS)}))
    state = reported.wait(_running(NEWER), "cam running 2.0 from the group document")
    assert state["documents"]["group:lobby"] == {
        "observed_generation": 1, "applied_generation": 1, "state": "applied", "reason": None
    }  # fmt: skip
    cam = pipeline_in(state, "cam")
    assert (cam["layer"], cam["generation"], cam["state"]) == ("group:lobby", 1, "running")
    swapped_at = len(results.messages)
    results.wait_until(lambda ms: len(ms) >= swapped_at + 5, timeout=60)
    status = read_status(tmp_path / DEVICE / "state")
    agent.stop()

    messages = [json.loads(m.payload) for m in results.messages]
    versions = [m["model"]["version"] for m in messages]
    first_new = versions.index(NEWER)
    assert set(versions[:first_new]) == {GOOD} and set(versions[first_new:]) == {NEWER}, versions
    # Every result accounted for: sequence numbers without a hole across the swap.
    seqs = [m["seq"] for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    # The camera was not reopened: one source, its frame count running on, no outage.
    frames = [m["source"]["frame"] for m in messages]
    assert frames == sorted(frames) and frames[first_new] > frames[first_new - 1], frames
    assert {m["source"]["outages"] for m in messages} == {0}
    assert status["pipelines"]["cam"]["stage_swaps"] == 1
    other = status["pipelines"]["other"]
    assert (other["stage_swaps"], other["layer"], other["model"]) == (0, "yaml", f"{MODEL}@{GOOD}"), other
    assert other["source"]["reconnects"] == 0 and other["attempts"] == 1, other
    assert status["pipelines"]["cam"]["source"]["reconnects"] == 0
    # The gap at the swap, against the frame interval the fps cap sets (captured_at of neighbours).
    gap = _seconds(messages[first_new]["captured_at"]) - _seconds(messages[first_new - 1]["captured_at"])
    stamps = [_seconds(m["captured_at"]) for m in messages]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    print(f"hot swap: gap {gap:.3f} s at the swap, largest {max(gaps):.3f} s, frame interval {1 / FPS:.3f} s")
    assert gap <= max(gaps) and gap < 4 / FPS, (gap, gaps)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
def test_bad_documents_and_bad_versions_leave_the_running_pipeline_serving(
    tmp_path: Path,
    mosquitto: Mosquitto,
    fleet_registry: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    path = video[0]
    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, fleet_registry, {"cam": pipeline_body(GOOD, path)}
    )
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    reported.wait(_running(GOOD), "cam running 1.0")

    body = pipeline_body(GOOD, path)
    good = document(f"device:{DEVICE}", 5, {"cam": body})
    bad_payloads: list[tuple[bytes | dict[str, Any], str]] = [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "expected a JSON object"),
        ({**good, "schema_version": 7}, "schema_version"),
        ({**good, "colour": "blue"}, "colour"),
        ({**good, "target": "device:someone-else"}, "someone-else"),
        ({**good, "generation": 0}, "generation"),
        ({**good, "expires_at": "2001-01-01T00:00:00Z"}, "expired"),
        ({**good, "pipelines": {"cam": {**body, "source": {"type": "video"}}}}, "$.pipelines.cam.source.uri"),
        ({**good, "pipelines": {"cam": {**body, "model": {"name": MODEL, "path": "/etc/x"}}}}, "local files"),
        (b'{"pad": "' + b"x" * 70_000 + b'"}', "over fleet.max_document_bytes"),
        (b"[" * 5000 + b"]" * 5000, "nest"),
    ]  # fmt: skip
    for i, (payload, reason) in enumerate(bad_payloads, start=1):
        publish(mosquitto, DEVICE_TOPIC, payload)
        state = reported.wait(lambda r, i=i: r.get("refusals", 0) >= i, f"refusal {i} ({reason})")
        assert reason in state["refused"][-1]["reason"], (reason, state["refused"][-1])
        assert state["documents"][f"device:{DEVICE}"]["state"] == "refused"
        assert _running(GOOD)(state), state
    assert agent.poll() is None

    # Versions that cannot serve: the document is accepted, the version is not, 1.0 keeps running.
    for generation, version, phase, why in (
        (6, MISSING, "failed", "9.9"),
        (7, BAD_TESTDATA, "failed", "expected outputs"),
        (8, NAN_LIVE, "rolled-back", "NaN"),
    ):
        doc = document(f"device:{DEVICE}", generation, {"cam": pipeline_body(version, path)})
        publish(mosquitto, DEVICE_TOPIC, doc)
        state = reported.wait(
            lambda r, g=generation, ph=phase: (
                (p := pipeline_in(r, "cam")).get("generation") == g and p.get("phase") == ph
            ),
            f"generation {generation} ({version}) {phase}",
            timeout=180,
        )
        cam = pipeline_in(state, "cam")
        assert why in (cam["reason"] or ""), cam
        assert cam["model"] == f"{MODEL}@{GOOD}" and cam["state"] == "running", cam
        assert state["documents"][f"device:{DEVICE}"]["applied_generation"] == generation
    agent.stop()

    # After a restart the persisted document still names the version that failed here: it is not
    # tried again, the last good version runs, reported as the rollback it is.
    restarted = time.time()
    agent = start_agent(config)
    state = reported.wait(
        lambda r: (p := pipeline_in(r, "cam")).get("phase") == "rolled-back" and p.get("state") == "running",
        "the last good version after a restart",
        since=restarted,
    )
    cam = pipeline_in(state, "cam")
    assert cam["model"] == f"{MODEL}@{GOOD}" and cam["generation"] == 8, cam
    assert f"{MODEL}@{NAN_LIVE} failed here before" in cam["reason"], cam
    log = agent.stop()
    assert f"now on {MODEL}@{NAN_LIVE}" not in log


@pytest.mark.slow
def test_signed_desired_state_refuses_forged_unsigned_replayed_and_expired_documents_and_survives_a_restart(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    """With registry.trusted_keys, documents need a signature by a trusted key (the same keys sign
    the models); an older generation and an expired document are refused even when signed. What was
    accepted is persisted: a restart starts on it, and a document published while the agent was
    down is applied when it is back."""
    path = video[0]
    generate_key(tmp_path / "keys" / "release.key")
    stranger, _ = generate_key(tmp_path / "keys" / "stranger.key")
    release_key, stranger_key = (
        load_private_key(tmp_path / "keys" / "release.key"),
        load_private_key(tmp_path / "keys" / "stranger.key"),
    )
    registry = FileRegistry(tmp_path / "registry")
    for version in (GOOD, NEWER):
        registry.publish(cls_model_path, MODEL, version, PublishOptions(sign_with=release_key))
    trusted = {"trusted_keys": [{"key": str(tmp_path / "keys" / "release.key.pub")}]}
    cam = {"cam": pipeline_body(GOOD, path)}
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry.root, cam, registry_settings=trusted)
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    reported.wait(_running(GOOD), "cam running 1.0")

    def signed(generation: int, version: str, key: Any = release_key, **extra: Any) -> bytes:
        body = document(f"device:{DEVICE}", generation, {"cam": pipeline_body(version, path)}, **extra)
        return protocol.sign_envelope(protocol.encode(body), key)

    forged = json.loads(signed(2, NEWER))
    forged["document"] = forged["document"].replace('"generation":2', '"generation":3')
    for i, (payload, reason) in enumerate(
        [
            (
                protocol.encode(document(f"device:{DEVICE}", 2, {"cam": pipeline_body(NEWER, path)})),
                "unsigned",
            ),
            (json.dumps(forged).encode(), "does not match the signed bytes"),
            (signed(2, NEWER, stranger_key), f"key {stranger} is not trusted"),
            (signed(2, NEWER, expires_at="2020-01-01T00:00:00Z"), "expired"),
        ],
        start=1,
    ):
        publish(mosquitto, DEVICE_TOPIC, payload)
        state = reported.wait(lambda r, i=i: r.get("refusals", 0) >= i, f"refusal {i} ({reason})")
        assert reason in state["refused"][-1]["reason"], (reason, state["refused"][-1])
        assert _running(GOOD)(state)

    publish(mosquitto, DEVICE_TOPIC, signed(3, NEWER))
    reported.wait(_running(NEWER), "the signed generation 3 running 2.0")
    publish(mosquitto, DEVICE_TOPIC, signed(2, GOOD))  # validly signed, but older: a replay
    state = reported.wait(lambda r: r.get("refusals", 0) >= 5, "the replay refused")
    assert "generation 2 is not newer than the applied 3" in state["refused"][-1]["reason"], state["refused"]
    assert _running(NEWER)(state)
    agent.stop()

    # Restart: it starts on the accepted document (persisted, signature checked again) at once.
    restarted = time.time()
    agent = start_agent(config)
    reported.wait(_running(NEWER), "2.0 again after the restart", since=restarted)
    agent.stop()
    assert f"desired state: starting on device:{DEVICE} generation 3" in agent.log()

    # Published while the agent is down: applied once it is back (retained on the broker).
    publish(mosquitto, DEVICE_TOPIC, signed(4, GOOD))
    restarted = time.time()
    agent = start_agent(config)
    state = reported.wait(
        lambda r: _running(GOOD)(r) and pipeline_in(r, "cam").get("generation") == 4,
        "generation 4 after a restart",
        since=restarted,
    )
    assert state["documents"][f"device:{DEVICE}"]["applied_generation"] == 4
    agent.stop()


def test_a_newer_generation_pre_empts_one_still_in_its_health_window(
    tmp_path: Path,
    mosquitto: Mosquitto,
    fleet_registry: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    """Generation 1 (2.0, a 60 s health window) is still being watched when generation 2 (back to
    1.0) comes: 2.0 is dropped at once, 1.0 serves, nothing waits for the first window to end."""
    path = video[0]
    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, fleet_registry, {"cam": pipeline_body(GOOD, path)}
    )
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    reported.wait(_running(GOOD), "cam running 1.0")
    slow = document(f"device:{DEVICE}", 1, {"cam": pipeline_body(NEWER, path)}, window_s=60)
    publish(mosquitto, DEVICE_TOPIC, slow)
    reported.wait(lambda r: pipeline_in(r, "cam").get("phase") == "health-check", "2.0 in its health window")
    started = time.monotonic()
    publish(mosquitto, DEVICE_TOPIC, document(f"device:{DEVICE}", 2, {"cam": pipeline_body(GOOD, path)}))
    state = reported.wait(
        lambda r: _running(GOOD)(r) and pipeline_in(r, "cam").get("generation") == 2,
        "generation 2 running 1.0",
    )
    assert time.monotonic() - started < 30, "the first health window was waited out"
    status_path = tmp_path / DEVICE / "state"
    back = f"{MODEL}@{GOOD}"
    wait_until(
        lambda: read_status(status_path)["pipelines"]["cam"].get("model") == back, "back on 1.0", timeout=30
    )
    log = agent.stop()
    assert "change to text-direction@2.0 abandoned" in log
    assert state["pipelines"]["cam"]["state"] == "running"
