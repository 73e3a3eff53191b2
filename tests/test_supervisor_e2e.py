"""What a new user hit with the supervised pipelines, replayed with real agents (`edge-agent run`),
a real mosquitto, real models published to a file registry and a real video:

- a dead RTSP camera listed first neither holds up the working camera nor ends on an unchecked
  guess: it waits for its own frame beside the working one, then takes the decision the working one
  proved on the same model;
- sensor values published over MQTT while the pipeline is being built (backend trials on its own
  first window) all reach a result, in order, from the very first value;
- an MQTT sensor source that names no broker uses the agent's broker with its login (and TLS).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
import yaml
from onnx import TensorProto, helper

from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.config_cases import assert_both_accept
from tests.media_fixtures import demo_video_module
from tests.mosquitto import Mosquitto
from tests.pki import Pki, run_tool, tool
from tests.tls_fixtures import PASSWORD, USER, tls_listener
from tests.waits import free_port, wait_until

DEVICE = "newuser-box"
CLS, CLS_VERSION = "text-direction", "2.0"  # the real PP-OCR direction classifier
ECHO, ECHO_VERSION = "window-echo", "1"  # a real ONNX graph that gives back its window
WINDOW = 5  # sensor values per model run
TOPIC = "plant/line-3/vibration"
SAMPLE_TIMEOUT_S = 15
# Few, short trials: the tests check which backend is chosen and when, not how fast it runs.
QUICK_BENCHMARK = {"benchmark": True, "max_trials": 2, "runs": 3, "warmup": 1, "budget_s": 1.0}
START_TIMEOUT_S = 120.0  # a pull, trials and a warm-up on a busy 2-core machine


# --- models, registry, agent.yaml ----------------------------------------------------------------


def publish(registry: Path, model: Path, name: str, version: str) -> None:
    """Through the CLI, as a user publishes a version (no test data: samples come from the source)."""
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(model), "--name", name, "--version", version,
         "--registry", f"file://{registry}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def echo_model(path: Path) -> Path:
    """[1, WINDOW] -> "window" = x * 1: every result shows exactly which values its window held."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WINDOW])
    y = helper.make_tensor_value_info("window", TensorProto.FLOAT, [1, WINDOW])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    node = helper.make_node("Mul", ["x", "one"], ["window"])
    graph = helper.make_graph([node], "window-echo", [x], [y], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def registry(tmp_path: Path, cls_model_path: Path) -> Path:
    root = tmp_path / "registry"
    publish(root, cls_model_path, CLS, CLS_VERSION)
    publish(root, echo_model(tmp_path / "echo.onnx"), ECHO, ECHO_VERSION)
    return root


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media") / "signs.mp4"
    demo_video_module().make_orientation_video(path, fps=10, seconds_per_sign=1.0)
    return path


def camera_pipeline(name: str, uri: str, **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": CLS, "version": CLS_VERSION},
        "source": {"type": "video", "uri": uri, "fps": 2.0, **source},
        "preprocess": {
            "resize": {"width": 192, "height": 48},
            "color": "bgr",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
        },
        "postprocess": {"type": "classification", "softmax": False, "top_k": 2, "labels": ["up", "down"]},
    }


def sensor_pipeline(name: str) -> dict[str, Any]:
    """Values from TOPIC on the agent's own broker (no host: nothing about the broker is repeated)."""
    return {
        "name": name,
        "model": {"name": ECHO, "version": ECHO_VERSION},
        "source": {
            "type": "mqtt",
            "topic": TOPIC,
            "window": WINDOW,
            "reopen_min_s": 0.2,
            "reopen_max_s": 1.0,
        },
        "preprocess": {"type": "series"},
        "postprocess": {"type": "raw"},
    }


def agent_config(
    tmp_path: Path,
    broker: Mosquitto,
    registry: Path,
    pipelines: list[dict[str, Any]],
    backends: dict[str, Any] | None = None,
    **mqtt_settings: Any,
) -> Path:
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {
            "host": broker.host,
            "port": broker.port,
            "reconnect_min_s": 0.2,
            "reconnect_max_s": 1.0,
            **mqtt_settings,
        },
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False, "min_time_s": 0.0, **(backends or {})},
        "pipelines": pipelines,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_config_written_here_passes_the_validator_and_the_schema(tmp_path: Path) -> None:
    local = {
        "name": "cam",
        "model": {"path": str(tmp_path / "m.onnx")},
        "source": {"type": "video", "uri": str(tmp_path / "v.mp4"), "loop": True},
        "postprocess": {"type": "classification", "labels": ["upright", "upside-down"]},
    }
    broker = SimpleNamespace(host="127.0.0.1", port=1883)
    path = agent_config(tmp_path, broker, tmp_path / "registry", [local], username="box")
    assert_both_accept(path.read_text(), str(path))


# --- a broker client with the broker's login and TLS ----------------------------------------------


class BrokerClient:
    """A paho client (QoS 1) that publishes values and records the results its subscription gets."""

    def __init__(
        self,
        broker: Mosquitto,
        subscribe: str | None = None,
        *,
        username: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._cond = threading.Condition()
        self._payloads: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._subscribe = subscribe
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"newuser-test-{time.monotonic_ns()}"
        )
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(0)
        if ca is not None:
            self.client.tls_set(ca_certs=str(ca))
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_args: self._ready.set()
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()
        if not self._ready.wait(timeout_s):
            self.close()
            raise AssertionError(f"not connected (and subscribed) in {timeout_s} s:\n{broker.log_tail()}")

    def _on_connect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            return
        if self._subscribe is None:
            self._ready.set()
        else:
            client.subscribe(self._subscribe, qos=1)

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._payloads.append(json.loads(message.payload))
            self._cond.notify_all()

    def send(self, value: int) -> mqtt.MQTTMessageInfo:
        return self.client.publish(TOPIC, str(value), qos=1)

    def results(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._payloads)

    def wait_for(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._payloads) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{len(self._payloads)} of {count} results in {timeout} s")
                self._cond.wait(remaining)
            return list(self._payloads)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def clients() -> Iterator[Any]:
    made: list[BrokerClient] = []

    def make(broker: Mosquitto, subscribe: str | None = None, **login: Any) -> BrokerClient:
        client = BrokerClient(broker, subscribe, **login)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def windows_of(results: list[dict[str, Any]]) -> list[list[float]]:
    return [r["output"]["outputs"]["window"]["values"] for r in sorted(results, key=lambda r: r["seq"])]


def sensor_clients(broker: Mosquitto) -> list[str]:
    """The broker's log lines of MQTT sensor sources connecting (one client per pipeline source)."""
    log = broker.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if "New client connected" in line and "-sensor-" in line]


def steps(log: str) -> str:
    """The build steps in an agent's log (for failure messages: the whole log is mostly the camera's)."""
    return "\n".join(
        line for line in log.splitlines() if "agent.supervisor" in line or "agent.backend" in line
    )


def decision_record(tmp_path: Path, pipeline: str) -> dict[str, Any]:
    path = tmp_path / "state" / "decisions" / "pipelines" / f"{pipeline}.json"
    assert path.is_file(), f"no decision recorded for {pipeline} (edge-agent explain {pipeline} has none)"
    record: dict[str, Any] = json.loads(path.read_text())
    return record


# --- 1. a dead camera listed first ---------------------------------------------------------------


@pytest.mark.slow
def test_a_dead_camera_listed_first_neither_holds_up_the_live_one_nor_runs_on_a_guess(
    tmp_path: Path,
    mosquitto: Mosquitto,
    registry: Path,
    video: Path,
    clients: Any,
    start_agent: StartAgent,
) -> None:
    dead_url = f"rtsp://127.0.0.1:{free_port()}/stream"  # nothing listens there
    config = agent_config(
        tmp_path,
        mosquitto,
        registry,
        [
            camera_pipeline("dead", dead_url, reopen_min_s=0.2, reopen_max_s=1.0),
            camera_pipeline("live", str(video), loop=True),
        ],
        # Each pipeline waits for a sample before it serves (prove_in_background off): the dead one's
        # wait must not hold up the live one.
        backends={**QUICK_BENCHMARK, "sample_timeout_s": SAMPLE_TIMEOUT_S, "prove_in_background": False},
    )
    results = clients(mosquitto, f"edge/{DEVICE}/results/#")
    state_dir = tmp_path / "state"
    began = time.monotonic()
    agent = start_agent(config)

    wait_until(
        lambda: "pipeline live started" in agent.log() or agent.poll() is not None,
        "the live camera's pipeline to start",
        timeout=START_TIMEOUT_S,
        state=lambda: agent.log()[-3000:],
    )
    live_started_s = time.monotonic() - began
    gave_up = f"pipeline dead: no frame from its source within {SAMPLE_TIMEOUT_S} s"

    seen: dict[str, Any] = {}  # status.json while it ran (the agent rewrites it when it stops)

    def settled() -> bool:
        pipelines = seen["pipelines"] = read_status(state_dir).get("pipelines", {})
        dead, live = pipelines.get("dead", {}), pipelines.get("live", {})
        return (
            "pipeline dead started" in agent.log()
            and dead.get("state") == "source-unavailable"
            and live.get("state") == "running"
            and live.get("results", 0) >= 1
            and len(results.results()) >= 4
        )

    log = agent.run_until(
        settled, "the dead camera reported unavailable while the live one publishes", timeout=START_TIMEOUT_S
    )
    settled_s = time.monotonic() - began
    status = seen["pipelines"]

    # The live camera did not wait for the dead one's sample: the dead one was waiting for a frame
    # already when the live one started, and went on waiting after it.
    assert gave_up in log
    waiting = "pipeline dead: getting inputs to prove backends on"
    assert log.index(waiting) < log.index("pipeline live started") < log.index(gave_up), steps(log)

    # The live one proved the candidates on its own frame; the dead one took that proven decision.
    live_record, dead_record = decision_record(tmp_path, "live"), decision_record(tmp_path, "dead")
    live_decision = live_record["decision"]
    backend = live_decision["backend"]
    assert live_decision["checked"] is True
    assert live_decision["inputs"] == "a frame from the pipeline's source"
    assert sum(c["median_ms"] is not None for c in live_decision["candidates"]) == 2
    assert "pipeline live: choosing a backend for text-direction@2.0 (benchmarking" in log
    assert "pipeline dead: choosing a backend" not in log  # no unchecked guess by rank
    cached = f"pipeline dead: using the cached backend decision {live_record['key']}"
    assert cached in log and log.index(gave_up) < log.index(cached)
    assert dead_record["key"] == live_record["key"]
    assert dead_record["decision"]["checked"] is True and dead_record["decision"]["backend"] == backend
    assert f"pipeline live started: {CLS}@{CLS_VERSION} on {backend}" in log
    assert f"pipeline dead started: {CLS}@{CLS_VERSION} on {backend}" in log
    # Its log says so: not "serving on the full-precision CPU reference, outputs not checked".
    assert f"{gave_up}; another pipeline on this model proved a decision meanwhile: using it" in log
    assert "outputs not checked" not in log

    # status.json: the dead camera is reported unavailable, on the proven backend; live serves.
    assert status["dead"]["state"] == "source-unavailable" and status["dead"]["phase"] == "running"
    assert status["dead"]["backend"] == backend and status["dead"]["results"] == 0
    assert status["live"]["state"] == "running" and status["live"]["backend"] == backend
    assert status["live"]["results"] >= 1
    published = results.results()
    assert {r["pipeline"] for r in published} == {"live"} and {r["backend"] for r in published} == {backend}
    print(
        f"\nlive started {live_started_s:.1f} s after the agent; dead gave up on a frame after "
        f"{SAMPLE_TIMEOUT_S} s; settled after {settled_s:.1f} s; backend {backend}"
    )


# --- 2. sensor values published while the pipeline is built --------------------------------------


@pytest.mark.slow
def test_sensor_values_sent_while_the_pipeline_is_built_all_reach_a_result(
    tmp_path: Path, mosquitto: Mosquitto, registry: Path, clients: Any, start_agent: StartAgent
) -> None:
    config = agent_config(
        tmp_path,
        mosquitto,
        registry,
        [sensor_pipeline("vibration")],
        backends={**QUICK_BENCHMARK, "sample_timeout_s": 30},
    )
    results = clients(mosquitto, f"edge/{DEVICE}/results/#")
    sensor = clients(mosquitto)
    began = time.monotonic()
    agent = start_agent(config)
    # Values sent before the source has subscribed go nowhere (no session holds them yet).
    wait_until(
        lambda: "source vibration: subscribed to" in agent.log() or agent.poll() is not None,
        "the sensor source's subscription",
        timeout=START_TIMEOUT_S,
        state=lambda: agent.log()[-3000:],
    )
    assert "pipeline vibration started" not in agent.log()
    subscribed_s = time.monotonic() - began

    # Numbered values at a steady 25 per second, from before the pipeline starts (its backend trials
    # wait for the first window) until 40 values after it has started, in whole windows; bounded.
    period_s, most, after_start = 0.04, 1500, 40
    sent: list[int] = []
    infos = []
    sent_before_start: int | None = None
    next_at = time.monotonic()
    while len(sent) < most:
        if sent_before_start is None and "pipeline vibration started" in agent.log():
            sent_before_start = len(sent)
        enough = sent_before_start is not None and len(sent) >= sent_before_start + after_start
        if enough and len(sent) % WINDOW == 0:
            break
        value = len(sent) + 1
        infos.append(sensor.send(value))
        sent.append(value)
        next_at += period_s
        time.sleep(max(0.0, next_at - time.monotonic()))  # the sensor's pace, not a wait
    assert sent_before_start is not None, f"not started after {len(sent)} values:\n{agent.log()[-3000:]}"
    for info in infos:
        info.wait_for_publish(timeout=30)
    expected = len(sent) // WINDOW

    # Every value is out: the results follow within seconds (a lost window never comes).
    log = agent.run_until(lambda: len(results.results()) >= expected, f"{expected} results", timeout=60)
    got = results.results()
    assert len(got) == expected, (len(got), expected)
    ordered = sorted(got, key=lambda r: r["seq"])
    # Every window from the first value on, in order, none lost or repeated, none dropped.
    assert [r["source"]["frame"] for r in ordered] == list(range(1, expected + 1))
    assert np.array_equal(np.concatenate(windows_of(got)), np.array(sent, dtype=np.float32))
    assert all(r["source"]["frames_dropped"] == 0 for r in got)
    # The build really overlapped the stream: the sample window and more came before the start.
    assert sent_before_start > WINDOW, sent_before_start

    # The backend sample was the pipeline's own first window, from its own (only) subscription.
    decision = decision_record(tmp_path, "vibration")["decision"]
    assert decision["checked"] is True and decision["inputs"] == "a frame from the pipeline's source"
    connected = sensor_clients(mosquitto)
    assert len(connected) == 1 and f"as edge-agent-{DEVICE}-sensor-vibration " in connected[0], connected
    source = read_status(tmp_path / "state")["pipelines"]["vibration"]["source"]
    assert source["messages"] == len(sent) and source["bad_messages"] == 0
    assert "bad message" not in log
    print(
        f"\nsubscribed {subscribed_s:.1f} s after the agent; {sent_before_start} of {len(sent)} values "
        f"sent before 'pipeline vibration started'; {expected} windows, none lost"
    )


# --- 3. the agent's broker, login and TLS by default ----------------------------------------------


@pytest.fixture(params=["login", "login+tls"])
def login_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Mosquitto, Pki | None]]:
    """A mosquitto that refuses anonymous clients (password file), with TLS in the second case."""
    password_file = tmp_path / "passwd"
    run_tool(
        [tool("mosquitto_passwd", "mosquitto"), "-b", "-c", str(password_file), USER, PASSWORD], tmp_path
    )
    os.chmod(password_file, 0o600)
    pki: Pki | None = request.getfixturevalue("pki") if request.param == "login+tls" else None
    extra = f"password_file {password_file}" + (f"\n{tls_listener(pki)}" if pki else "")
    with Mosquitto(tmp_path / "mosquitto", allow_anonymous=False, extra_config=extra) as broker:
        yield broker, pki


def test_a_sensor_source_without_a_host_uses_the_agents_broker_login_and_tls(
    tmp_path: Path,
    login_broker: tuple[Mosquitto, Pki | None],
    registry: Path,
    clients: Any,
    start_agent: StartAgent,
) -> None:
    broker, pki = login_broker
    login: dict[str, Any] = {"username": USER, "password": PASSWORD}
    tls = {"tls": {"ca_file": str(pki.ca)}} if pki else {}
    config = agent_config(tmp_path, broker, registry, [sensor_pipeline("vibration")], **login, **tls)
    ca = {"ca": pki.ca} if pki else {}
    results = clients(broker, f"edge/{DEVICE}/results/#", **login, **ca)
    sensor = clients(broker, **login, **ca)
    state_dir = tmp_path / "state"
    began = time.monotonic()
    agent = start_agent(config)

    def streaming() -> bool:
        state = read_status(state_dir).get("pipelines", {}).get("vibration", {})
        return state.get("state") == "running" and state.get("source", {}).get("state") == "streaming"

    wait_until(  # a source the broker refuses logs an error: no need to wait out the timeout
        lambda: streaming() or agent.poll() is not None or "WARNING agent.sources" in agent.log(),
        "the sensor pipeline streaming in status.json",
        timeout=START_TIMEOUT_S,
        state=lambda: agent.log()[-3000:],
    )
    assert streaming(), agent.log()[-3000:]
    streaming_s = time.monotonic() - began
    values = list(range(1, 3 * WINDOW + 1))
    for info in [sensor.send(v) for v in values]:
        info.wait_for_publish(timeout=30)
    log = agent.run_until(
        lambda: len(results.results()) >= 3, "3 results through the login broker", timeout=60
    )

    assert windows_of(results.results()) == [values[i : i + WINDOW] for i in range(0, len(values), WINDOW)]
    source = read_status(state_dir)["pipelines"]["vibration"]["source"]
    assert source["outages"] == 0 and source["error"] is None, source
    assert "refused" not in log and "not authori" not in log.lower()
    # The source logged in as the agent does (the broker names the user), over TLS when it has one.
    connected = sensor_clients(broker)
    assert len(connected) == 1 and f"u'{USER}'" in connected[0], connected
    assert source["uri"] == f"mqtt://{broker.host}:{broker.port}/{TOPIC}"
    print(f"\n{'with TLS: ' if pki else ''}streaming {streaming_s:.1f} s after the agent")
