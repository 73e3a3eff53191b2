"""The fleet controller (`edge-agent fleet ...`, agent/fleetctl/client.py) against a real mosquitto
and 50 simulated devices (scripts/fleet_sim.py): deploys converge, failures and canary waves roll
back, status lists every device, commands round-trip, and nothing is published that should not be.
The CLI runs in-process (Typer's CliRunner); every wait is bounded and waits on a condition."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from agent.cli import app
from agent.config import TrustedKey
from agent.fleet.protocol import in_canary, open_envelope
from agent.fleetctl.client import FleetClient
from agent.fleetctl.connection import BrokerOptions
from agent.registry.signing import TrustPolicy, generate_key
from tests.fleet_fixtures import fleet
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.pki import Pki, run_tool, tool
from tests.waits import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fleet_sim import Simulator

GROUP = "lobby"
DEVICES = 50
BAD = "9.9-bad"
WAIT_S = "30"  # --timeout of deploys: generous for a loaded machine; healthy runs take well under 1 s


@pytest.fixture
def sim(mosquitto: Mosquitto) -> Iterator[Simulator]:
    simulator = Simulator(
        mosquitto.host, mosquitto.port, DEVICES, groups=[GROUP], fail_versions=[BAD], delay_s=0.02
    )
    simulator.start(timeout_s=60)
    try:
        yield simulator
    finally:
        simulator.stop()


def _spec(tmp_path: Path, version: str) -> Path:
    path = tmp_path / f"spec-{version}.yaml"
    path.write_text(
        f"""
pipelines:
  - name: door-cam
    model: {{name: mobilenet, version: "{version}"}}
    source: {{type: video, uri: "rtsp://10.0.0.5/stream1"}}
    postprocess: {{type: classification, top_k: 3}}
health: {{window_s: 30}}
"""
    )
    return path


def _client(broker: Mosquitto) -> FleetClient:
    return FleetClient(BrokerOptions(broker.host, broker.port))


def _models(broker: Mosquitto) -> dict[str, str | None]:
    with _client(broker) as client:
        return {r.device: r.pipelines["door-cam"].model for r in client.collect(GROUP)}


class Recorder:
    """An MQTT 5 client recording (topic, payload, correlation data) of everything on `filters`."""

    def __init__(self, broker: Mosquitto, *filters: str) -> None:
        self._cond = threading.Condition()
        self.messages: list[tuple[str, bytes, bytes | None]] = []
        subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"recorder-{time.monotonic_ns()}", protocol=mqtt.MQTTv5
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self.client.subscribe([(f, 1) for f in filters])
        assert subscribed.wait(30), "no SUBACK for the recorder"

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        correlation = getattr(message.properties, "CorrelationData", None)
        with self._cond:
            self.messages.append((message.topic, bytes(message.payload), correlation))
            self._cond.notify_all()

    def wait_until(
        self, predicate: Callable[[list[tuple[str, bytes, bytes | None]]], bool], what: str
    ) -> None:
        deadline = time.monotonic() + 30
        with self._cond:
            while not predicate(self.messages):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"timed out waiting for {what}; {len(self.messages)} messages"
                self._cond.wait(remaining)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def recorders() -> Iterator[Callable[..., Recorder]]:
    made: list[Recorder] = []

    def make(broker: Mosquitto, *filters: str) -> Recorder:
        made.append(Recorder(broker, *filters))
        return made[-1]

    yield make
    for recorder in made:
        recorder.close()


def _reported_models(recorder: Recorder, device: str) -> list[tuple[int | None, str | None]]:
    """(group generation, door-cam model) of every reported state `device` published."""
    seen = []
    for topic, payload, _ in recorder.messages:
        if topic == f"edge/{device}/reported" and payload:
            report = json.loads(payload)
            pipeline = report["pipelines"].get("door-cam") or {}
            seen.append((pipeline.get("generation"), pipeline.get("model")))
    return seen


def test_a_deploy_to_a_group_converges_and_publishes_the_documented_document(
    mosquitto: Mosquitto, sim: Simulator, tmp_path: Path
) -> None:
    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, "1.0")), "--group", GROUP, "--timeout", WAIT_S)
    assert code == 0, out
    assert out["status"] == "converged" and out["ok"] is True
    assert out["target"] == "group:lobby" and out["published"] == [1]
    assert out["summary"] == {
        "devices": DEVICES, "converged": DEVICES, "failed": 0, "rolled-back": 0, "offline": 0, "timed-out": 0,
    }  # fmt: skip
    assert sorted(out["devices"]) == sim.device_ids

    with _client(mosquitto) as client:
        document = client.current_document(("group", GROUP))
        records = client.collect(GROUP)
    assert document is not None
    assert document["schema_version"] == 1 and document["target"] == "group:lobby"
    assert document["generation"] == 1 and document["priority"] == 0
    assert document["health"] == {"window_s": 30}
    assert document["pipelines"] == {
        "door-cam": {
            "model": {"name": "mobilenet", "version": "1.0"},
            "source": {"type": "video", "uri": "rtsp://10.0.0.5/stream1"},
            "postprocess": {"type": "classification", "top_k": 3},
        }
    }  # the name is the key
    assert document["rollout"] == {"phase": "all", "baseline": {}}
    assert document["issued_at"].endswith("Z")
    assert [r.device for r in records] == sim.device_ids
    for record in records:
        pipeline = record.pipelines["door-cam"]
        assert (pipeline.phase, pipeline.model, pipeline.layer, pipeline.generation) == (
            "running", "mobilenet@1.0", "group:lobby", 1,
        )  # fmt: skip


def test_a_failing_version_is_reported_failed_and_exits_non_zero(
    mosquitto: Mosquitto, sim: Simulator, tmp_path: Path
) -> None:
    device = sim.device_ids[0]
    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, BAD)), "--device", device, "--timeout", WAIT_S)
    assert code == 4, out
    assert out["status"] == "failed" and list(out["devices"]) == [device]
    assert out["devices"][device]["outcome"] == "failed"
    assert f"mobilenet@{BAD} failed to start" in out["devices"][device]["reason"]

    # The group's document converges everywhere: on that device its door-cam is the device
    # document's (equal priority), so the group layer has nothing to run there.
    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, "1.0")), "--group", GROUP, "--timeout", WAIT_S)
    assert code == 0 and out["summary"]["converged"] == DEVICES, out

    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, BAD)), "--group", GROUP, "--timeout", WAIT_S)
    assert code == 4 and out["status"] == "failed", out
    assert out["summary"]["rolled-back"] == DEVICES - 1  # the health check put 1.0 back on each
    assert out["published"] == [2]  # no canary wave: nothing is rolled back by the controller
    models = _models(mosquitto)
    assert {models[d] for d in sim.device_ids[1:]} == {"mobilenet@1.0"}


def test_a_failing_canary_wave_stops_the_rollout_and_the_canaries_go_back(
    mosquitto: Mosquitto, sim: Simulator, tmp_path: Path, recorders: Callable[..., Recorder]
) -> None:
    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, "1.0")), "--group", GROUP, "--timeout", WAIT_S)
    assert code == 0, out
    recorder = recorders(mosquitto, "edge/+/reported", f"edge/groups/{GROUP}/desired")

    code, out = fleet(
        mosquitto,
        "deploy",
        str(_spec(tmp_path, BAD)),
        "--group",
        GROUP,
        "--canary",
        "20",
        "--timeout",
        WAIT_S,
    )
    canaries = {d for d in sim.device_ids if in_canary(d, f"{GROUP}-2", 20)}
    assert 0 < len(canaries) < DEVICES
    assert code == 5, out
    assert out["status"] == "rolled-back" and out["published"] == [2, 3]
    assert "rollout stopped" in out["message"]
    canary_wave, rollback_wave = out["waves"]
    assert canary_wave["phase"] == "canary" and set(canary_wave["outcomes"]) == canaries
    assert {o["outcome"] for o in canary_wave["outcomes"].values()} == {"rolled-back"}
    assert rollback_wave["phase"] == "rollback" and rollback_wave["counts"]["converged"] == DEVICES

    # The canary document carried the cohort's seed and the baseline; the rollback put the baseline back.
    documents = [json.loads(p) for t, p, _ in recorder.messages if t.endswith("/desired")]
    canary_doc = next(d for d in documents if d["generation"] == 2)
    assert canary_doc["rollout"]["phase"] == "canary" and canary_doc["rollout"]["seed"] == f"{GROUP}-2"
    assert canary_doc["rollout"]["canary_percent"] == 20
    assert canary_doc["rollout"]["baseline"]["door-cam"]["model"]["version"] == "1.0"

    assert set(_models(mosquitto).values()) == {"mobilenet@1.0"}
    recorder.wait_until(
        lambda _: all((3, "mobilenet@1.0") in _reported_models(recorder, d) for d in sim.device_ids),
        "every device's report on generation 3",
    )
    for device in sim.device_ids:
        models = {model for _, model in _reported_models(recorder, device)}
        if device in canaries:
            assert f"mobilenet@{BAD}" in models, device  # it did take the new version, then went back
        else:
            assert models == {"mobilenet@1.0"}, device  # never left the baseline


def test_rollback_puts_the_baseline_back(mosquitto: Mosquitto, sim: Simulator, tmp_path: Path) -> None:
    code, out = fleet(mosquitto, "rollback", "--group", GROUP)
    assert code == 1 and "nothing to roll back" in out["errors"][0], out

    for version in ("1.0", "2.0"):
        code, out = fleet(
            mosquitto, "deploy", str(_spec(tmp_path, version)), "--group", GROUP, "--timeout", WAIT_S
        )
        assert code == 0, out
    assert set(_models(mosquitto).values()) == {"mobilenet@2.0"}

    code, out = fleet(mosquitto, "rollback", "--group", GROUP, "--timeout", WAIT_S)
    assert code == 0, out
    assert out["published"] == [3] and out["summary"]["converged"] == DEVICES
    assert set(_models(mosquitto).values()) == {"mobilenet@1.0"}
    with _client(mosquitto) as client:
        document = client.current_document(("group", GROUP))
    assert document is not None and document["health"] == {"window_s": 30}  # kept from the document


def test_status_shows_every_device_then_offline(mosquitto: Mosquitto, sim: Simulator, tmp_path: Path) -> None:
    code, out = fleet(mosquitto, "deploy", str(_spec(tmp_path, "1.0")), "--group", GROUP, "--timeout", WAIT_S)
    assert code == 0, out

    code, out = fleet(mosquitto, "status", "--group", GROUP)
    assert code == 0, out
    assert out["summary"] == {
        "devices": DEVICES,
        "converged": DEVICES,
        "failed": 0,
        "in-flight": 0,
        "offline": 0,
    }
    assert [d["device"] for d in out["devices"]] == sim.device_ids
    device = out["devices"][0]
    assert device["online"] is True and device["condition"] == "converged" and device["groups"] == [GROUP]
    assert device["layers"]["group:lobby"]["desired_generation"] == 1
    assert device["layers"]["group:lobby"]["applied_generation"] == 1
    pipeline = device["pipelines"]["door-cam"]
    assert (pipeline["phase"], pipeline["model"], pipeline["backend"]) == (
        "running",
        "mobilenet@1.0",
        "sim/CPU",
    )
    assert device["last_seen"].endswith("Z")

    table = CliRunner().invoke(app, ["fleet", "status", "--broker", f"{mosquitto.host}:{mosquitto.port}"])
    assert table.exit_code == 0, table.output
    assert f"{DEVICES} devices: {DEVICES} converged, 0 failed, 0 in flight, 0 offline" in table.output

    sim.stop()  # each device says offline (retained) as it goes
    code, out = fleet(mosquitto, "status", "--group", GROUP)
    assert code == 7 and out["summary"]["offline"] == DEVICES, out


def test_cmd_ping_round_trips_with_correlation_data(
    mosquitto: Mosquitto, sim: Simulator, recorders: Callable[..., Recorder]
) -> None:
    device = sim.device_ids[1]
    recorder = recorders(mosquitto, f"edge/{device}/cmd/#")
    code, out = fleet(mosquitto, "cmd", device, "ping", "note=hello", "count=2")
    assert code == 0, out
    assert out["ok"] is True and out["result"]["pong"] is True and out["result"]["device"] == device

    recorder.wait_until(lambda msgs: len(msgs) >= 2, "the request and its reply")
    (request_topic, request, request_correlation), (reply_topic, reply, reply_correlation) = (
        recorder.messages[:2]
    )
    assert request_topic == f"edge/{device}/cmd/ping" and reply_topic == f"edge/{device}/cmd/ping/reply"
    assert request_correlation is not None and len(request_correlation) == 16
    assert reply_correlation == request_correlation
    assert json.loads(request)["args"] == {"note": "hello", "count": 2}
    assert json.loads(reply)["id"] == json.loads(request)["id"]

    code, out = fleet(mosquitto, "cmd", device, "reboot-now")
    assert code == 4 and out["ok"] is False and out["error"]["code"] == "unknown-command", out


def test_cmd_to_an_absent_device_times_out_with_a_clear_error(mosquitto: Mosquitto) -> None:
    code, out = fleet(mosquitto, "cmd", "no-such-box", "ping", "--timeout", "0.5")
    assert code == 6, out
    assert "no-such-box did not answer 'ping' within 0.5 s" in out["errors"][0]
    assert "never published a status" in out["errors"][0]


def test_an_invalid_spec_publishes_nothing(mosquitto: Mosquitto, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        """
pipelines:
  door-cam:
    model: {name: mobilenet, version: 2.0}
    source: {type: video}
    postprocess: {type: classification, top_kk: 3}
prority: 1
"""
    )
    # Against a port nothing listens on, the spec is refused all the same: it is checked first.
    offline = CliRunner().invoke(
        app,
        ["fleet", "deploy", str(spec), "--group", GROUP, "--json", "--broker", f"127.0.0.1:{free_port()}"],
    )
    assert offline.exit_code == 1 and "$.pipelines.door-cam" in offline.stdout
    code, out = fleet(mosquitto, "deploy", str(spec), "--group", GROUP)
    assert code == 1 and out["ok"] is False, out
    errors = "\n".join(out["errors"])
    # The devices' own check (agent/fleet/document.py), with what it would refuse on group:lobby.
    version = "$.pipelines.door-cam.model.version"
    assert f"{spec}: group:lobby: {version}: expected a string, got the number 2.0" in errors
    assert f"{spec}: group:lobby: $.pipelines.door-cam.source.uri: required key is missing" in errors
    assert "$.pipelines.door-cam.postprocess.top_kk: unknown key; did you mean 'top_k'?" in errors
    assert f"{spec}: $.prority: unknown key" in errors
    with _client(mosquitto) as client:
        assert client.current_document(("group", GROUP)) is None


def test_devices_that_trust_a_key_refuse_unsigned_documents_and_take_signed_ones(
    mosquitto: Mosquitto, tmp_path: Path, mqtt_subscriber_factory: SubscriberFactory
) -> None:
    kid, public = generate_key(tmp_path / "fleet.key")
    policy = TrustPolicy.from_config([TrustedKey(key=public, models=["mobilenet"])])
    spec = str(_spec(tmp_path, "1.0"))
    with Simulator(
        mosquitto.host, mosquitto.port, 5, groups=["secure"], id_prefix="safe", trust=policy
    ) as sim:
        code, out = fleet(mosquitto, "deploy", spec, "--group", "secure", "--timeout", WAIT_S)
        assert code == 4 and out["summary"]["failed"] == 5, out
        reason = out["devices"][sim.device_ids[0]]["reason"]
        assert "refused group:secure generation 1" in reason and "the document is unsigned" in reason

        signed = ["--sign", str(tmp_path / "fleet.key")]
        code, out = fleet(mosquitto, "deploy", spec, "--group", "secure", *signed, "--timeout", WAIT_S)
        assert code == 0 and out["signed_by"] == kid and out["published"] == [2], out

    retained = mqtt_subscriber_factory(mosquitto, "edge/groups/secure/desired").wait_for(1)[0]
    assert retained.retain
    document, signatures = open_envelope(json.loads(retained.payload), "test")
    assert policy.verify(document, signatures, ["mobilenet"], "the group document") == kid
    assert json.loads(document)["generation"] == 2


def test_broker_problems_are_clear(tmp_path: Path, pki: Pki, broker_with_auth: Mosquitto) -> None:
    result = CliRunner().invoke(app, ["fleet", "status", "--json", "--broker", f"127.0.0.1:{free_port()}"])
    out = json.loads(result.stdout)
    assert result.exit_code == 3 and "cannot connect to the MQTT broker 127.0.0.1:" in out["errors"][0]

    password = tmp_path / "password"
    password.write_text("wrong\n")
    common = ["fleet", "status", "--json", "--broker", f"{broker_with_auth.host}:{broker_with_auth.port}"]
    common += ["--ca-file", str(pki.ca), "--username", "operator"]
    result = CliRunner().invoke(app, [*common, "--password-file", str(password)])
    assert result.exit_code == 3, result.output
    assert "refused the connection" in json.loads(result.stdout)["errors"][0]

    password.write_text("fleet-pass\n")
    result = CliRunner().invoke(app, [*common, "--password-file", str(password)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["devices"] == 0


@pytest.fixture
def broker_with_auth(tmp_path: Path, pki: Pki) -> Iterator[Mosquitto]:
    """mosquitto with TLS (our test CA) and a password file (user operator / fleet-pass)."""
    passwd = tool("mosquitto_passwd", "mosquitto")
    password_file = tmp_path / "passwd"
    run_tool([passwd, "-b", "-c", str(password_file), "operator", "fleet-pass"], tmp_path)
    os.chmod(password_file, 0o600)
    lines = [f"cafile {pki.ca}", f"certfile {pki.server_cert}", f"keyfile {pki.server_key}"]
    lines.append(f"password_file {password_file}")
    broker = Mosquitto(tmp_path / "tls-broker", allow_anonymous=False, extra_config="\n".join(lines))
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
