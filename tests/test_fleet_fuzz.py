"""10,000 generated desired-state and command payloads at a live agent (`edge-agent run`, real
mosquitto, a real model on a real video): it stays up, its pipeline keeps running and publishing,
every desired-state message ends accepted, unchanged or refused (counted in reported state), and
every command request gets a reply (ok, or an error with a code).

The generator is seeded (reproducible): random JSON of every shape, and valid documents and
requests with one or more parts broken (types, keys, sizes, nesting, encodings, signatures,
generations, deadlines). Messages go out in batches, each waiting for the agent to take the last
one in: a broker queues only so much for a slow client, and a lost message would prove nothing.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import (
    GOOD,
    Reported,
    agent_config,
    document,
    pipeline_body,
    pipeline_in,
    publish_fleet_versions,
)
from tests.mosquitto import Mosquitto
from tests.waits import wait_until

DEVICE = "fuzz-box"
DESIRED_PAYLOADS = 5_000
COMMAND_PAYLOADS = 5_000
BATCH = 250
SEED = 20261123


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 6 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**70), 2**70)
    if kind == 3:
        return rng.choice([0.5, -1e308, 1e-320, 3.0, float(rng.random())])
    if kind == 4:
        return "".join(rng.choice("ab/+#\u00e9\u0000\U0001f600 \n$.[]") for _ in range(rng.randrange(12)))
    if kind in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["schema_version", "target", "generation", "pipelines", "priority", "health", "rollout",
            "expires_at", "issued_at", "id", "args", "deadline", "x"]  # fmt: skip
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def broken(rng: random.Random, valid: dict[str, Any]) -> Any:
    """A valid document or request with some parts replaced, removed or added."""
    data: Any = json.loads(json.dumps(valid))
    for _ in range(rng.randint(1, 3)):
        node = data
        while isinstance(node, dict) and node and rng.random() < 0.6:
            key = rng.choice(list(node))
            if not isinstance(node[key], dict):
                break
            node = node[key]
        if not isinstance(node, dict) or not node:
            continue
        key = rng.choice(list(node))
        action = rng.randrange(4)
        if action == 0:
            del node[key]
        elif action == 1:
            node[key] = random_json(rng)
        elif action == 2:
            node[key + rng.choice(["_", "s", "X"])] = random_json(rng)
        else:
            node[key] = rng.choice([0, -1, "", [], {}, "x" * 300, 2**63, 1.5])
    return data


def encoded(rng: random.Random, data: Any) -> bytes:
    choice = rng.randrange(20)
    text = json.dumps(data)
    if choice == 0:
        return text[: rng.randrange(len(text) + 1)].encode()  # cut off
    if choice == 1:
        return b"\xff" + text.encode()  # not UTF-8
    if choice == 2:
        return b"[" * 3000 + b"]" * 3000  # nesting
    if choice == 3:
        return b'{"x": "' + b"y" * 70_000 + b'"}'  # over the size limit
    if choice == 4:
        return json.dumps({"schema_version": 1, "document": text, "signatures": [
            {"algorithm": "ed25519", "key_id": "0" * 16, "signature": "A" * 88}]}).encode()  # fmt: skip
    return text.encode()


def desired_payloads(rng: random.Random, valid: dict[str, Any], count: int) -> list[bytes]:
    payloads = []
    for i in range(count):
        if i % 3 == 0:
            payloads.append(encoded(rng, random_json(rng)))
        else:
            mutated = broken(rng, valid)
            if isinstance(mutated, dict) and mutated.get("generation") == valid["generation"]:
                mutated["generation"] = rng.choice([1, 2, 0, -5])  # at or below the applied one
            payloads.append(encoded(rng, mutated))
    return payloads


def command_payloads(rng: random.Random, count: int) -> list[tuple[str, bytes]]:
    # Not restart-pipeline or reselect-backend: they restart the pipeline on purpose (tested on their own).
    names = ["ping", "status", "logs", "benchmark", "nope", "diagnostics", "x" * 40]
    requests = []
    for i in range(count):
        valid = {"id": f"fuzz-{i}", "args": {"lines": 5, "pipeline": "cam", "runs": 2},
                 "deadline": "2099-01-01T00:00:00Z"}  # fmt: skip
        data = random_json(rng) if i % 4 == 0 else broken(rng, valid)
        requests.append((rng.choice(names), encoded(rng, data)))
    return requests


class Controller:
    """An MQTT 5 client that publishes requests with a response topic and counts the replies."""

    def __init__(self, broker: Mosquitto) -> None:
        self.replies: dict[bytes, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"fuzzer-{uuid.uuid4().hex[:8]}",
                                  protocol=mqtt.MQTTv5)  # fmt: skip
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_args: subscribed.set()
        self.client.subscribe(f"edge/{DEVICE}/cmd/+/reply", qos=1)
        assert subscribed.wait(30)

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        correlation = getattr(message.properties, "CorrelationData", None)
        with self.lock:
            self.replies[bytes(correlation or b"")] = json.loads(message.payload)

    def request(self, name: str, payload: bytes, correlation: bytes) -> None:
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = f"edge/{DEVICE}/cmd/{name}/reply"
        properties.CorrelationData = correlation
        self.client.publish(f"edge/{DEVICE}/cmd/{name}", payload, qos=1, properties=properties)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(30)

    def answered(self) -> int:
        with self.lock:
            return len(self.replies)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.slow
def test_ten_thousand_generated_payloads_each_get_an_answer_and_the_pipeline_runs_on(
    tmp_path: Path,
    mosquitto: Mosquitto,
    cls_model_path: Path,
    monkeypatch: Any,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    registry = publish_fleet_versions(tmp_path / "registry", cls_model_path, monkeypatch)
    body = pipeline_body(GOOD, video[0], fps=2.0)
    # Many requests a minute are allowed: the rate limit would answer most with "busy" otherwise.
    config = agent_config(tmp_path, DEVICE, mosquitto.port, registry, {"cam": body},
                          fleet={"commands": {"max_per_minute": 100_000}})  # fmt: skip
    reported = Reported(mosquitto, DEVICE)
    agent = start_agent(config)
    reported.wait(lambda r: pipeline_in(r, "cam").get("phase") == "running", "cam running")
    controller = Controller(mosquitto)
    topic = f"edge/{DEVICE}/desired"
    valid = document(f"device:{DEVICE}", 3, {"cam": body})
    controller.publish(topic, json.dumps(valid).encode())
    reported.wait(lambda r: r["messages"]["accepted"] == 1, "the valid document accepted")

    rng = random.Random(SEED)
    desired = desired_payloads(rng, valid, DESIRED_PAYLOADS)
    commands = command_payloads(rng, COMMAND_PAYLOADS)
    started = time.monotonic()
    for start in range(0, max(len(desired), len(commands)), BATCH):
        for payload in desired[start : start + BATCH]:
            controller.publish(topic, payload)
        for i, (name, payload) in enumerate(commands[start : start + BATCH], start=start):
            controller.request(name, payload, f"c{i}".encode())
        sent_desired = min(start + BATCH, len(desired)) + 1  # the valid one too
        sent_commands = min(start + BATCH, len(commands))
        reported.wait(
            lambda r, n=sent_desired: r["messages"]["received"] >= n, f"{sent_desired} documents taken"
        )
        wait_until(
            lambda n=sent_commands: controller.answered() >= n, f"{sent_commands} replies", timeout=120
        )
    took = time.monotonic() - started

    assert agent.poll() is None, agent.log()[-3000:]
    state = reported.latest()
    counts = state["messages"]
    assert counts["received"] == DESIRED_PAYLOADS + 1, counts
    assert (
        counts["accepted"] + counts["unchanged"] + counts["refused"] + counts["withdrawn"]
        == counts["received"]
    )
    assert counts["refused"] >= DESIRED_PAYLOADS * 0.9, counts  # nearly all are broken by construction
    with controller.lock:
        replies = dict(controller.replies)
    assert set(replies) == {f"c{i}".encode() for i in range(COMMAND_PAYLOADS)}
    codes = [r["error"]["code"] if not r["ok"] else "ok" for r in replies.values()]
    assert all(r.get("ok") in (True, False) for r in replies.values())
    assert {"malformed", "unknown-command"} <= set(codes), set(codes)
    print(f"{len(desired)} documents + {len(commands)} requests in {took:.1f} s; reported {counts}; "
          f"reply codes {sorted((c, codes.count(c)) for c in set(codes))}")  # fmt: skip

    # The pipeline ran through it all and still publishes.
    cam = pipeline_in(state, "cam")
    assert cam["phase"] == "running" and cam["state"] == "running", cam
    before = read_status(tmp_path / DEVICE / "state")["pipelines"]["cam"]["results"]
    wait_until(
        lambda: read_status(tmp_path / DEVICE / "state")["pipelines"]["cam"]["results"] > before,
        "more results after the flood",
        timeout=60,
    )
    controller.close()
    agent.stop()
