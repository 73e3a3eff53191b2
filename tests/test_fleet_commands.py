"""Commands (docs/fleet.md, Commands) at a real agent (`edge-agent run`) over a real mosquitto. The
operator's CLI (`edge-agent fleet cmd DEVICE NAME k=v --json`, a subprocess) sends what it can; a
plain paho requester sends what it cannot: malformed payloads, a past deadline, a repeated id, a
response topic outside the device's prefix, MQTT 3.1.1, a request queued while the agent is down."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent import __version__
from agent.clock import iso_utc
from agent.config_loader import load_config
from agent.daemon import Agent
from agent.registry.file_registry import FileRegistry
from tests.agent_process import EDGE_AGENT, AgentProcess, StartAgent
from tests.broker_fixtures import Client, ClientFactory, prop, request_properties
from tests.broker_fixtures import clients as clients  # a fixture
from tests.fleet_fixtures import GOOD, MODEL, Reported, agent_config, pipeline_body, pipeline_in
from tests.mosquitto import Mosquitto
from tests.mqtt_fixtures import SubscriberFactory
from tests.waits import wait_until

DEVICE = "cmd-box"
FPS = 5.0
CLI_TIMEOUT_S = 20.0  # the CLI's --timeout: how long it waits for the answer
RESTART_NOTE = "pipeline cam: restarting (asked by a command)"
CACHED_NOTE = "pipeline cam: using the cached backend decision"
CHOSEN_NOTE = "pipeline cam: choosing a backend for"
# A line of the agent's log (agent/logfmt.py setup_logging, outside journald): time, level, logger: message.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


@pytest.fixture
def registry(tmp_path: Path, cls_model_path: Path) -> Path:
    root = tmp_path / "registry"
    FileRegistry(root).publish(cls_model_path, MODEL, GOOD)
    return root


def fleet_cmd(broker: Mosquitto, device: str, name: str, *args: str) -> tuple[int, dict[str, Any]]:
    """`edge-agent fleet cmd DEVICE NAME ARGS --json` against `broker`: (exit code, its JSON)."""
    done = subprocess.run(
        [EDGE_AGENT, "fleet", "cmd", device, name, *args, "--json", "--timeout", str(CLI_TIMEOUT_S),
         "--broker", f"{broker.host}:{broker.port}"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S + 60,
    )  # fmt: skip
    try:
        answer: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        output = f"{done.stdout}\n{done.stderr}"
        raise AssertionError(
            f"`fleet cmd {device} {name}` exited {done.returncode} without JSON:\n{output}"
        ) from None
    return done.returncode, answer


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _running_since(moment: float) -> Any:
    """Reported state: cam running GOOD, in that phase since `moment` or later (a rebuild after it)."""
    return lambda r: (
        (p := pipeline_in(r, "cam")).get("phase") == "running"
        and p.get("model") == f"{MODEL}@{GOOD}"
        and _seconds(p["since"]) >= moment
    )


def _start_cam_agent(
    tmp_path: Path, broker: Mosquitto, registry: Path, video_path: Path, start_agent: StartAgent
) -> tuple[AgentProcess, Reported, Path]:
    """The agent running pipeline cam on the video, once its reported state says cam runs."""
    cam = {"cam": pipeline_body(GOOD, video_path, FPS)}
    config = agent_config(tmp_path, DEVICE, broker.port, registry, cam)
    reported = Reported(broker, DEVICE)
    agent = start_agent(config)
    reported.wait(_running_since(0), "cam running from agent.yaml")
    return agent, reported, config


@pytest.mark.slow
def test_the_operator_cli_runs_each_command_on_a_live_agent(
    tmp_path: Path,
    mosquitto: Mosquitto,
    mqtt_subscriber_factory: SubscriberFactory,
    registry: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    results = mqtt_subscriber_factory(mosquitto, f"edge/{DEVICE}/results/cam")
    agent, reported, _ = _start_cam_agent(tmp_path, mosquitto, registry, video[0], start_agent)
    results.wait_for(3, timeout=60)
    state_dir = tmp_path / DEVICE / "state"

    code, answer = fleet_cmd(mosquitto, DEVICE, "ping")
    assert code == 0 and answer["ok"] and answer["error"] is None, answer
    assert (answer["device"], answer["command"]) == (DEVICE, "ping")
    ping = answer["result"]
    assert (ping["pong"], ping["device"], ping["agent_version"]) == (True, DEVICE, __version__), ping
    assert 0 < ping["uptime_s"] < 600, ping

    code, answer = fleet_cmd(mosquitto, DEVICE, "status")
    assert code == 0 and answer["ok"], answer
    cam = answer["result"]["pipelines"]["cam"]
    assert answer["result"]["device"] == DEVICE
    assert (cam["state"], cam["model"]) == ("running", f"{MODEL}@{GOOD}"), cam

    code, answer = fleet_cmd(mosquitto, DEVICE, "logs", "lines=5")
    assert code == 0 and answer["ok"], answer
    lines = answer["result"]["lines"]
    assert len(lines) == 5, lines
    log = agent.log()
    for line in lines:  # lines of the agent's own log (its stderr has no time under journald)
        assert LOG_LINE.match(line) and line.split(" ", 2)[2] in log, line

    code, answer = fleet_cmd(mosquitto, DEVICE, "benchmark", "pipeline=cam", "runs=5")
    assert code == 0 and answer["ok"], answer
    bench = answer["result"]
    assert (bench["pipeline"], bench["model"], bench["runs"]) == ("cam", f"{MODEL}@{GOOD}", 5), bench
    assert 0 < bench["median_ms"] <= bench["p90_ms"], bench
    assert bench["backend"] == cam["backend"] and "/" in bench["backend"], (bench, cam)

    # restart-pipeline: built again (on the cached backend decision), reported running, results resume.
    asked = time.time()
    code, answer = fleet_cmd(mosquitto, DEVICE, "restart-pipeline", "pipeline=cam")
    assert code == 0 and answer["result"] == {"pipeline": "cam", "restarting": True}, answer
    reported.wait(_running_since(asked), "cam running again after restart-pipeline", since=asked)
    before = len(results.messages)
    results.wait_for(before + 3, timeout=60)
    log = agent.log()
    assert (log.count(RESTART_NOTE), log.count(CACHED_NOTE), log.count(CHOSEN_NOTE)) == (1, 1, 1), log[-3000:]

    # reselect-backend: the cached decision is deleted, so the restart decides again and caches anew.
    key = json.loads((state_dir / "decisions" / "pipelines" / "cam.json").read_text())["key"]
    cached = state_dir / "decisions" / f"{key}.json"
    decided_at = json.loads(cached.read_text())["decided_at"]
    asked = time.time()
    code, answer = fleet_cmd(mosquitto, DEVICE, "reselect-backend", "pipeline=cam")
    assert code == 0, answer
    assert answer["result"] == {"pipeline": "cam", "forgot_cached_decision": True, "restarting": True}, answer
    reported.wait(_running_since(asked), "cam running again after reselect-backend", since=asked)
    assert json.loads(cached.read_text())["decided_at"] > decided_at  # written again, by a new decision
    log = agent.log()
    assert (log.count(RESTART_NOTE), log.count(CACHED_NOTE), log.count(CHOSEN_NOTE)) == (2, 1, 2), log[-3000:]

    # Errors: an answer with a code and a message; the CLI exits 4 (a device answered an error).
    for args, error, message in [
        (("restart-pipeline", "pipeline=nope"), "failed", "no pipeline 'nope' (known: cam)"),
        (("benchmark", "pipeline=nope"), "failed", "no running pipeline 'nope' (running: cam)"),
        (("benchmark",), "malformed", '"pipeline" (the pipeline\'s name) is required'),
        (("reboot",), "unknown-command", "unknown command 'reboot'; known: benchmark, diagnostics, logs,"),
    ]:
        code, answer = fleet_cmd(mosquitto, DEVICE, *args)
        assert code == 4 and answer["ok"] is False and answer["result"] is None, answer
        assert answer["error"]["code"] == error and message in answer["error"]["message"], (args, answer)
    assert agent.log().count(RESTART_NOTE) == 2
    agent.stop()


def _request(
    client: Client,
    name: str,
    payload: bytes | dict[str, Any],
    correlation: bytes = b"",
    response_topic: str | None = None,
    device: str = DEVICE,
) -> Any:
    """Publish a request on edge/<device>/cmd/<name>, MQTT 5 with `response_topic` (the documented
    <request topic>/reply unless given), `correlation` and a 120 s message expiry; the PUBACK reason."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    topic = f"edge/{device}/cmd/{name}"
    props = request_properties(response_topic or f"{topic}/reply", correlation) if client.v5 else None
    return client.publish(topic, data, properties=props)


def _reply(client: Client, correlation: bytes, timeout: float = 30.0) -> tuple[str, dict[str, Any]]:
    """The reply carrying `correlation`: (the topic it came on, its JSON)."""

    def found() -> Any:
        return next(
            (g for g in client.received if prop(g.properties, "CorrelationData") == correlation), None
        )

    wait_until(
        lambda: found() is not None,
        f"the reply with correlation data {correlation!r}",
        timeout=timeout,
        state=lambda: [(g.topic, g.payload[:100]) for g in client.received[-5:]],
    )
    got = found()
    return got.topic, json.loads(got.payload)


@pytest.mark.slow
def test_requests_the_cli_cannot_send_get_the_documented_answers(
    tmp_path: Path,
    mosquitto: Mosquitto,
    registry: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
    clients: ClientFactory,
) -> None:
    agent, reported, config = _start_cam_agent(tmp_path, mosquitto, registry, video[0], start_agent)
    requester = clients(mosquitto, "controller")
    requester.subscribe(f"edge/{DEVICE}/cmd/+/reply", "elsewhere/#")
    ping_reply = f"edge/{DEVICE}/cmd/ping/reply"

    # Malformed: answered "malformed" saying why (no id to echo), with the request's correlation data.
    for n, (payload, why) in enumerate(
        [
            (b"{not json", "the request is not JSON"),
            (b"[1, 2]", "the request must be a JSON object"),
            ({"id": "m-3", "colour": "blue"}, "unknown key(s) colour (allowed: id, args, deadline)"),
            ({"args": {}}, '"id" must be a string of 1 to 128 characters'),
            ({"id": "m-5", "args": [1]}, '"args" must be an object'),
            ({"id": "m-6", "deadline": "tomorrow"}, '"deadline" must be an RFC 3339 time with a zone'),
        ]
    ):
        correlation = f"malformed-{n}".encode()
        _request(requester, "ping", payload, correlation)
        topic, answer = _reply(requester, correlation)
        assert topic == ping_reply and answer["id"] is None and answer["ok"] is False, answer
        assert answer["error"]["code"] == "malformed" and why in answer["error"]["message"], (why, answer)

    _request(requester, "ping", {"id": "late", "deadline": "2001-01-01T00:00:00Z"}, b"late")
    expired = {"code": "expired", "message": "the request's deadline has passed"}
    assert _reply(requester, b"late")[1] == {"id": "late", "ok": False, "error": expired}

    # The same id twice: the identical reply (to each request's correlation data); it ran once.
    asked = time.time()
    once = {"id": "restart-once", "args": {"pipeline": "cam"}}
    _request(requester, "restart-pipeline", once, b"first")
    _, first = _reply(requester, b"first")
    assert first == {"id": "restart-once", "ok": True, "result": {"pipeline": "cam", "restarting": True}}
    _request(requester, "restart-pipeline", once, b"second")
    assert _reply(requester, b"second")[1] == first
    reported.wait(_running_since(asked), "cam running again after the restart", since=asked)
    assert agent.log().count(RESTART_NOTE) == 1, agent.log()[-3000:]

    # MQTT 3.1.1 has no response topic: the answer goes to <request topic>/reply.
    old = clients(mosquitto, "controller", protocol="3.1.1")
    old.subscribe(ping_reply)
    _request(old, "ping", {"id": "from-3.1.1"})
    answer = json.loads(old.wait_for(ping_reply).payload)
    assert (answer["id"], answer["ok"], answer["result"]["device"]) == ("from-3.1.1", True, DEVICE), answer

    # A response topic outside edge/<device>/ (the broker's ACL lets a device write only there): the
    # answer comes on <request topic>/reply instead, and the agent logs why.
    _request(requester, "ping", {"id": "foreign"}, b"foreign", response_topic="elsewhere/answers")
    topic, answer = _reply(requester, b"foreign")
    assert (topic, answer["id"], answer["ok"]) == (ping_reply, "foreign", True), (topic, answer)
    assert "elsewhere/answers" not in requester.topics()
    assert (
        f"command on edge/{DEVICE}/cmd/ping asks for the reply on elsewhere/answers, outside edge/{DEVICE}/; "
        f"answering on {ping_reply}"
    ) in agent.log()

    # Published while the agent is down (QoS 1, 120 s message expiry): the agent's MQTT session
    # (mqtt.session_expiry_s, a day by default) holds it, and the agent answers it once it is back.
    agent.stop()
    request = {"id": "while-down", "deadline": iso_utc(time.time() + 120)}
    reason = _request(requester, "ping", request, b"while-down")
    assert reason.value == 0x00, f"{reason}: no session of the stopped agent subscribes to its commands"
    restarted = time.time()
    agent = start_agent(config)
    _, answer = _reply(requester, b"while-down", timeout=120)
    assert answer["id"] == "while-down" and answer["ok"], answer
    assert answer["result"]["uptime_s"] <= time.time() - restarted, answer  # the new run answered
    agent.stop()


@pytest.mark.slow
def test_the_fleet_commands_settings_refuse_and_limit_requests(
    tmp_path: Path, mosquitto: Mosquitto, start_agent: StartAgent
) -> None:
    """`fleet: {commands: ...}` in agent.yaml: a denied command and one not allowed are answered
    "disallowed", the others run; past max_per_minute requests in a minute get "busy"."""
    (tmp_path / "registry").mkdir()  # no pipelines: nothing is pulled
    settings = {
        "deny-box": {"deny": ["benchmark"]},
        "allow-box": {"allow": ["ping"]},
        "rate-box": {"max_per_minute": 3},
    }
    started = time.time()
    watchers = {device: Reported(mosquitto, device) for device in settings}
    registry = tmp_path / "registry"
    agents = [
        start_agent(agent_config(tmp_path, device, mosquitto.port, registry, fleet={"commands": commands}))
        for device, commands in settings.items()
    ]
    # Each reports once connected; its SUBSCRIBEs go out in the same instant, long before a CLI is up.
    for device, reported in watchers.items():
        reported.wait(lambda r: True, f"{device} reporting", since=started)
        reported.close()

    def disallowed(device: str, name: str, *args: str) -> None:
        code, answer = fleet_cmd(mosquitto, device, name, *args)
        assert code == 4 and answer["error"] == {
            "code": "disallowed",
            "message": f"command {name!r} is not allowed on this device (fleet.commands)",
        }, answer

    disallowed("deny-box", "benchmark", "pipeline=cam")
    assert fleet_cmd(mosquitto, "deny-box", "ping")[0] == 0
    assert fleet_cmd(mosquitto, "allow-box", "ping")[0] == 0
    disallowed("allow-box", "status")
    disallowed("allow-box", "logs", "lines=1")

    first = time.monotonic()
    for _ in range(3):
        code, answer = fleet_cmd(mosquitto, "rate-box", "ping")
        assert code == 0 and answer["ok"], answer
    code, answer = fleet_cmd(mosquitto, "rate-box", "ping")
    assert time.monotonic() - first < 60, "the four requests took over a minute: the limit did not apply"
    assert code == 4 and answer["error"] == {
        "code": "busy", "message": "over 3 requests a minute (fleet.commands.max_per_minute)"
    }, answer  # fmt: skip
    for agent in agents:
        agent.stop()


def test_a_request_queued_in_the_session_is_answered_however_soon_the_broker_delivers_it(
    tmp_path: Path, mosquitto: Mosquitto, clients: ClientFactory
) -> None:
    """Right after the CONNACK the broker delivers what it queued in the agent's session. The daemon
    routes its handlers (commands, desired state) before it connects, so such a request finds its
    handler however soon it comes. It used to connect first: on loopback the CONNACK came ~4 ms
    after the routes were in place, and a request that beat them was dropped without a reply. Here
    (in process) the connection's start returns only once the queued request was handled, as with a
    broker that answers faster than the agent starts up."""
    (tmp_path / "registry").mkdir()
    config = load_config(agent_config(tmp_path, "queued-box", mosquitto.port, tmp_path / "registry"))
    cmd_filter = "edge/queued-box/cmd/+"

    def run(agent: Agent) -> tuple[threading.Thread, threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), name="agent-run", daemon=True)
        thread.start()
        return thread, stop

    first = Agent(config)  # makes the session: subscribed to its commands, then stopped
    thread, stop = run(first)
    wait_until(
        lambda: first.mqtt.stats()["subscriptions"].get(cmd_filter) == "active",
        "the first run subscribed to its commands",
        state=first.mqtt.stats,
    )
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()

    requester = clients(mosquitto, "controller")
    requester.subscribe("edge/queued-box/cmd/+/reply")
    reason = _request(requester, "ping", {"id": "queued"}, b"queued", device="queued-box")
    assert reason.value == 0x00, reason  # queued in the stopped agent's session

    second = Agent(config)
    connect = second.mqtt.start

    def connect_and_deliver() -> None:
        connect()
        with contextlib.suppress(AssertionError):  # bounded: without its route it never comes
            wait_until(lambda: second.router.stats().get(cmd_filter, {}).get("messages", 0) >= 1, timeout=10)

    second.mqtt.start = connect_and_deliver  # type: ignore[method-assign]
    thread, stop = run(second)
    try:
        _, answer = _reply(requester, b"queued", timeout=20)
        assert answer["id"] == "queued" and answer["ok"], answer
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()


def test_a_request_queued_before_the_devices_groups_changed_is_answered(
    tmp_path: Path, mosquitto: Mosquitto, start_agent: StartAgent, clients: ClientFactory
) -> None:
    """The agent numbers its MQTT 5 subscriptions (identifiers) in the order it routes them: its
    desired state, each group's, then its commands. A request queued in its session carries the
    identifier of the run that subscribed; after agent.yaml gained a group, that number belongs to
    the new group's desired state. The request still reaches the command handler (the topic must
    match the filter), rather than being refused as that group's document and never answered."""
    (tmp_path / "registry").mkdir()
    device, started = "regrouped-box", time.time()
    reported = Reported(mosquitto, device)
    agent = start_agent(
        agent_config(tmp_path, device, mosquitto.port, tmp_path / "registry", groups=("lobby",))
    )
    reported.wait(lambda r: True, "the first run reporting (subscribed)", since=started)
    agent.stop()

    requester = clients(mosquitto, "controller")
    requester.subscribe(f"edge/{device}/cmd/+/reply")
    request = {"id": "before-regroup", "deadline": iso_utc(time.time() + 120)}
    assert _request(requester, "ping", request, b"regroup", device=device).value == 0x00

    config = agent_config(tmp_path, device, mosquitto.port, tmp_path / "registry", groups=("lobby", "north"))
    agent = start_agent(config)
    _, answer = _reply(requester, b"regroup", timeout=30)
    assert answer["id"] == "before-regroup" and answer["ok"], answer
    log = agent.stop()
    assert "desired state refused" not in log, log
    reported.close()
