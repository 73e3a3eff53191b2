#!/usr/bin/env python3
"""Simulated fleet devices: the device side of docs/fleet.md without real pipelines, for testing and
benchmarking the controller (`edge-agent fleet ...`) against thousands of devices on one broker.

Each simulated device:
- publishes a retained `online` status (and has an `offline` last will), and a retained reported
  state at connect and on every transition;
- subscribes to its own desired topic, its groups' desired topics and its command topics;
- checks each document with the agent's own code (agent/fleet/document.py: parse_document, with
  signatures checked against --trusted-key when given) and its replay rule, reports refusals, and
  layers what it accepted with the agent's layer_pipelines (canary or baseline included);
- "runs" each pipeline that changed: pending -> pulling -> health-check -> running, each step
  after --delay-s (with jitter). A pipeline whose model version is in --fail-versions ends
  `rolled-back` (the previous model runs again) when one ran before, else `failed`;
- answers the `ping` command (MQTT 5 response topic and correlation data; ids are idempotent;
  expired deadlines are refused); other commands get `unknown-command`.

Scale: every device has its own MQTT connection (own client id, last will, subscriptions), as real
agents do, so the broker's fan-out and retained-message load are the real ones. One thread drives
them all: paho clients in manual-loop mode (`loop_read`/`loop_write`/`loop_misc`) over one epoll
selector, with the open-file limit raised to its hard limit. No thread per device (10,000 threads
would not fit a small box), and no shared connection acting for many devices (it could not have
a last will per device). Pipelines are not validated or run: the controller validates specs, and
the timing is --delay-s.

    .venv/bin/python scripts/fleet_sim.py --count 1000 --group lobby --broker 127.0.0.1:1883
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import logging
import random
import resource
import selectors
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.clock import iso_utc  # noqa: E402
from agent.config import HealthWindowConfig, PipelineConfig, TrustedKey  # noqa: E402
from agent.errors import DesiredStateError  # noqa: E402
from agent.fleet.desired import admit_after, layer_pipelines  # noqa: E402
from agent.fleet.document import DesiredDocument, parse_document  # noqa: E402
from agent.fleet.protocol import MAX_DOCUMENT_BYTES, SCHEMA_VERSION, device_layer, group_layer  # noqa: E402
from agent.fleetctl.records import read_document  # noqa: E402
from agent.mqtt.router import REPLY_SUFFIX  # noqa: E402
from agent.mqtt.topics import (  # noqa: E402
    command_topic,
    desired_topic,
    group_desired_topic,
    reported_topic,
    status_topic,
)
from agent.registry.signing import TrustPolicy  # noqa: E402

log = logging.getLogger("fleet_sim")

AGENT_VERSION = "fleet-sim"
BACKEND = "sim/CPU"
_STEPS = ("pending", "pulling", "health-check")  # then running, failed or rolled-back
_CONNECTING_AT_ONCE = 200  # CONNECTs without a CONNACK yet: keeps the broker's accept backlog short
_MISC_EVERY_S = 1.0  # keepalive pings (loop_misc) for every client
_REPLIES_KEPT = 64  # per device, for idempotent command ids
_REFUSALS_KEPT = 10


@dataclass
class _Pipeline:
    config: PipelineConfig | None
    phase: str
    layer: str
    generation: int
    model: str | None
    since: str
    good_model: str | None = None  # the last model that ran: what a failed health check goes back to
    reason: str | None = None
    epoch: int = 0  # bumped for every new target; a stale step timer sees it and does nothing


@dataclass
class _Device:
    id: str
    groups: tuple[str, ...]
    client: mqtt.Client
    accepted: dict[str, DesiredDocument] = field(default_factory=dict)  # layer -> document
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    pipelines: dict[str, _Pipeline] = field(default_factory=dict)
    refused: list[dict[str, Any]] = field(default_factory=list)
    replies: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    connected: bool = False
    ready: bool = False  # its first reported state was acknowledged by the broker
    first_report_mid: int | None = None
    reconnect_delay_s: float = 1.0


# A refused document: every problem, and its generation when that much could be read.
_Refusal = tuple[list[str], int | None]


class Simulator:
    """`count` simulated devices `<id_prefix>-00000`... in `groups` on one broker (module docstring).

    `start()` returns once every device is connected and its first reported state is retained on
    the broker; `stop()` says offline for each (retained) and disconnects. Thread-safe to start
    and stop from another thread; everything else runs on the simulator's own thread."""

    def __init__(
        self,
        host: str,
        port: int,
        count: int,
        groups: Iterable[str] = ("sim",),
        prefix: str = "edge",
        fail_versions: Iterable[str] = (),
        delay_s: float = 0.05,
        id_prefix: str = "sim",
        keepalive_s: int = 60,
        seed: int = 0,
        trust: TrustPolicy | None = None,
    ) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.groups = tuple(groups)
        self.fail_versions = frozenset(fail_versions)
        self.delay_s = delay_s
        # No trusted keys: unsigned documents are accepted and signatures not checked, as on an agent.
        self.trust = trust or TrustPolicy()
        self.keepalive_s = keepalive_s
        width = max(5, len(str(count - 1)))
        self.device_ids = [f"{id_prefix}-{i:0{width}d}" for i in range(count)]
        self._random = random.Random(seed)
        self._devices: dict[str, _Device] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._dirty: set[str] = set()
        self._documents: dict[str, tuple[bytes, DesiredDocument | _Refusal]] = {}  # by layer
        self._health = HealthWindowConfig()
        self._cond = threading.Condition()
        self._ready = 0
        self._connecting = 0  # first connections without a CONNACK yet
        self._failure: BaseException | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def ready(self) -> int:
        with self._cond:
            return self._ready

    def start(self, timeout_s: float = 300.0) -> Simulator:
        _raise_fd_limit(len(self.device_ids) + 256)
        self._thread = threading.Thread(target=self._run, name="fleet-sim", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._ready < len(self.device_ids) and self._failure is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    ready = self._ready
                    break
                self._cond.wait(remaining)
            else:
                ready = self._ready
        if self._failure is not None:
            self.stop()
            raise RuntimeError(f"the simulator failed: {self._failure}") from self._failure
        if ready < len(self.device_ids):
            self.stop()
            raise TimeoutError(
                f"only {ready} of {len(self.device_ids)} simulated devices ready in {timeout_s} s"
            )
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._wake()
        thread.join(timeout_s)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop -----------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed, or full: a wake-up is pending anyway
            self._wake_w.send(b"x")

    def _run(self) -> None:
        try:
            self._selector.register(self._wake_r, selectors.EVENT_READ, None)
            pending = list(reversed(self.device_ids))
            next_misc = time.monotonic() + _MISC_EVERY_S
            while not self._stopping.is_set():
                while pending and self._connecting < _CONNECTING_AT_ONCE:
                    self._connect(pending.pop())
                self._pump(self._next_timeout())
                now = time.monotonic()
                if now >= next_misc:
                    next_misc = now + _MISC_EVERY_S
                    for device in self._devices.values():
                        device.client.loop_misc()
            self._shutdown()
        except BaseException as exc:  # surfaced by start(); a simulator bug must not hang a test
            log.exception("the simulator loop failed")
            with self._cond:
                self._failure = exc
                self._cond.notify_all()

    def _next_timeout(self) -> float:
        if self._dirty:
            return 0.0
        if self._timers:
            return max(0.0, min(_MISC_EVERY_S, self._timers[0][0] - time.monotonic()))
        return _MISC_EVERY_S

    def _pump(self, timeout: float) -> None:
        """One round: socket events, due timers, then one reported publish per changed device."""
        for key, mask in self._selector.select(timeout):
            client = key.data
            if client is None:
                with contextlib.suppress(BlockingIOError):
                    self._wake_r.recv(4096)
                continue
            if mask & selectors.EVENT_READ:
                client.loop_read()
            if mask & selectors.EVENT_WRITE:
                client.loop_write()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, action = heapq.heappop(self._timers)
            action()
        dirty, self._dirty = self._dirty, set()
        for device_id in dirty:
            self._publish_reported(self._devices[device_id])

    def _after(self, delay_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._sequence), action))

    def _shutdown(self) -> None:
        """Offline status (retained) and a clean disconnect for every device, bounded in time."""
        for device in self._devices.values():
            if device.connected:
                device.client.publish(
                    status_topic(self.prefix, device.id), self._status("offline", device), qos=1, retain=True
                )
                device.client.disconnect()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(
            d.client.socket() is not None for d in self._devices.values()
        ):
            self._pump(0.05)

    # -- connections --------------------------------------------------------------------------

    def _connect(self, device_id: str) -> None:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"fleet-sim-{device_id}", protocol=mqtt.MQTTv5
        )
        device = _Device(device_id, self.groups, client)
        self._devices[device_id] = device
        client.user_data_set(device)
        client.will_set(
            status_topic(self.prefix, device_id), self._status("offline", device), qos=1, retain=True
        )
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        self._connecting += 1
        client.connect(self.host, self.port, keepalive=self.keepalive_s)

    def _reconnect(self, device: _Device) -> None:
        if self._stopping.is_set() or device.connected:
            return
        try:
            device.client.reconnect()
        except OSError as exc:
            device.reconnect_delay_s = min(device.reconnect_delay_s * 2, 10.0)
            log.warning(
                "%s: reconnecting failed (%s); again in %.0f s", device.id, exc, device.reconnect_delay_s
            )
            self._after(device.reconnect_delay_s, lambda: self._reconnect(device))

    def _on_socket_open(self, client: mqtt.Client, device: _Device, sock: Any) -> None:
        _no_delay(sock)
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _on_socket_close(self, client: mqtt.Client, device: _Device, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):  # never registered, or the selector closed
            self._selector.unregister(sock)

    def _on_register_write(self, client: mqtt.Client, device: _Device, sock: Any) -> None:
        self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)

    def _on_unregister_write(self, client: mqtt.Client, device: _Device, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):  # already closed
            self._selector.modify(sock, selectors.EVENT_READ, client)

    def _on_connect(self, client: mqtt.Client, device: _Device, flags: Any, reason: Any, props: Any) -> None:
        if device.first_report_mid is None:
            self._connecting -= 1
        if reason.is_failure:
            log.warning("%s: the broker refused the connection: %s", device.id, reason)
            return
        device.connected = True
        device.reconnect_delay_s = 1.0
        topics = [
            desired_topic(self.prefix, device.id),
            *(group_desired_topic(self.prefix, g) for g in device.groups),
            command_topic(self.prefix, device.id, "any").rsplit("/", 1)[0] + "/+",  # every command
        ]
        client.subscribe([(t, 1) for t in topics])
        client.publish(
            status_topic(self.prefix, device.id), self._status("online", device), qos=1, retain=True
        )
        if device.first_report_mid is None:
            device.first_report_mid = self._publish_reported(device)
        else:
            self._dirty.add(device.id)

    def _on_disconnect(
        self, client: mqtt.Client, device: _Device, flags: Any, reason: Any, props: Any
    ) -> None:
        device.connected = False
        if not self._stopping.is_set():
            log.warning("%s: disconnected (%s); reconnecting", device.id, reason)
            self._after(device.reconnect_delay_s, lambda: self._reconnect(device))

    def _on_publish(self, client: mqtt.Client, device: _Device, mid: int, reason: Any, props: Any) -> None:
        if mid == device.first_report_mid and not device.ready:
            device.ready = True
            with self._cond:
                self._ready += 1
                self._cond.notify_all()

    def _status(self, state: str, device: _Device) -> bytes:
        payload = {"status": state, "device": device.id, "agent_version": AGENT_VERSION, "timestamp": _now()}
        return json.dumps(payload, separators=(",", ":")).encode()

    # -- desired state ------------------------------------------------------------------------

    def _on_message(self, client: mqtt.Client, device: _Device, message: mqtt.MQTTMessage) -> None:
        topic = message.topic
        if topic.endswith("/desired"):
            parts = topic.split("/")
            layer = group_layer(parts[2]) if len(parts) == 4 else device_layer(device.id)
            self._on_document(device, layer, bytes(message.payload))
        elif "/cmd/" in topic:
            self._on_command(device, message)

    def _document(self, layer: str, payload: bytes) -> DesiredDocument | _Refusal:
        """The device side's own check of `payload` (agent/fleet/document.py), done once per payload
        for all the devices that share the topic (a group's 10,000 members)."""
        cached = self._documents.get(layer)
        if cached is not None and cached[0] == payload:
            return cached[1]
        result: DesiredDocument | _Refusal
        try:
            result = parse_document(payload, layer, self.trust, MAX_DOCUMENT_BYTES, time.time())
        except DesiredStateError as exc:
            try:  # the generation the refusal is about, for the controller, when it can be read
                generation: int | None = read_document(payload, layer)["generation"]
            except ValueError:
                generation = None
            result = (exc.problems, generation)
        self._documents[layer] = (payload, result)
        return result

    def _on_document(self, device: _Device, layer: str, payload: bytes) -> None:
        if not payload:  # withdrawn: the layer goes
            device.accepted.pop(layer, None)
            device.documents.pop(layer, None)
            self._converge(device)
            return
        document = self._document(layer, payload)
        if not isinstance(document, DesiredDocument):
            self._refuse(device, layer, document[1], "; ".join(document[0]))
            return
        applied = device.accepted.get(layer)
        try:  # the agent's replay rule
            if admit_after(document, *((applied.generation, applied.raw) if applied else (None, None))):
                return  # the same document again: a reconnect re-delivers retained messages
        except DesiredStateError as exc:
            self._refuse(device, layer, document.generation, "; ".join(exc.problems))
            return
        device.accepted[layer] = document
        device.documents[layer] = {
            "observed_generation": document.generation,
            "applied_generation": document.generation,
            "state": "applied",
            "reason": None,
        }
        self._converge(device)

    def _refuse(self, device: _Device, layer: str, generation: int | None, reason: str) -> None:
        applied = device.accepted.get(layer)
        device.documents[layer] = {
            "observed_generation": generation,
            "applied_generation": applied.generation if applied else None,
            "state": "refused",
            "reason": reason,
        }
        device.refused = [
            *device.refused[-(_REFUSALS_KEPT - 1) :],
            {"layer": layer, "generation": generation, "reason": reason, "at": _now()},
        ]
        self._dirty.add(device.id)

    def _converge(self, device: _Device) -> None:
        """Layer the accepted documents as the agent does (agent/fleet/desired.py, layer_pipelines)
        and start every pipeline whose configuration changed; one no layer names any more is
        removed (reported under its old layer, at that layer's current generation)."""
        layered = layer_pipelines([], list(device.accepted.values()), device.id, self._health)
        for name in layered.keys() | device.pipelines.keys():
            current = device.pipelines.get(name)
            target = layered.get(name)
            if target is None:
                if current is not None and current.phase != "removed":
                    document = device.accepted.get(current.layer)
                    current.epoch += 1
                    current.config, current.phase, current.model, current.reason = None, "removed", None, None
                    current.generation = document.generation if document else current.generation
                    current.since = _now()
                continue
            generation = target.generation or 0
            restart = (
                current is None
                or current.phase == "removed"
                or current.config != target.config
                or (current.phase in ("failed", "rolled-back") and current.generation != generation)
            )
            if current is None:
                current = device.pipelines[name] = _Pipeline(
                    None, "pending", target.layer, generation, None, _now()
                )
            current.layer, current.generation = target.layer, generation
            if restart:
                self._start(device, name, current, target.config)
        self._dirty.add(device.id)

    def _start(self, device: _Device, name: str, pipeline: _Pipeline, config: PipelineConfig) -> None:
        pipeline.config = config
        pipeline.epoch += 1
        pipeline.phase, pipeline.reason, pipeline.since = _STEPS[0], None, _now()
        pipeline.model = f"{config.model.name}@{config.model.version}"
        self._schedule_step(device, name, pipeline.epoch, 1)

    def _schedule_step(self, device: _Device, name: str, epoch: int, step: int) -> None:
        delay = self.delay_s * self._random.uniform(0.5, 1.5)
        self._after(delay, lambda: self._step(device, name, epoch, step))

    def _step(self, device: _Device, name: str, epoch: int, step: int) -> None:
        pipeline = device.pipelines.get(name)
        if pipeline is None or pipeline.epoch != epoch:
            return  # a newer document changed this pipeline meanwhile
        pipeline.since = _now()
        self._dirty.add(device.id)
        if step < len(_STEPS):
            pipeline.phase = _STEPS[step]
            self._schedule_step(device, name, epoch, step + 1)
            return
        version = pipeline.config.model.version if pipeline.config else None
        if version not in self.fail_versions:
            pipeline.phase, pipeline.good_model = "running", pipeline.model
        elif pipeline.good_model is not None:
            pipeline.reason = (
                f"{pipeline.model} failed its health check (simulated); {pipeline.good_model} runs again"
            )
            pipeline.phase, pipeline.model = "rolled-back", pipeline.good_model
        else:
            pipeline.phase, pipeline.reason = "failed", f"{pipeline.model} failed to start (simulated)"

    def _publish_reported(self, device: _Device) -> int | None:
        if not device.connected:
            return None
        report = {
            "schema_version": SCHEMA_VERSION,
            "device": device.id,
            "groups": list(device.groups),
            "agent_version": AGENT_VERSION,
            "updated_at": _now(),
            "documents": device.documents,
            "pipelines": {
                name: {
                    "phase": p.phase,
                    "since": p.since,
                    "reason": p.reason,
                    "layer": p.layer,
                    "generation": p.generation,
                    "model": p.model,
                    "backend": BACKEND if p.phase == "running" or p.phase == "rolled-back" else None,
                    "backend_why": "simulated",
                    "last_error": p.reason,
                }
                for name, p in device.pipelines.items()
            },
            "refused": device.refused,
        }
        payload = json.dumps(report, separators=(",", ":")).encode()
        info = device.client.publish(reported_topic(self.prefix, device.id), payload, qos=1, retain=True)
        return info.mid

    # -- commands -----------------------------------------------------------------------------

    def _on_command(self, device: _Device, message: mqtt.MQTTMessage) -> None:
        name = message.topic.rsplit("/", 1)[-1]
        properties = message.properties
        response_topic = getattr(properties, "ResponseTopic", None) or message.topic + REPLY_SUFFIX
        correlation = getattr(properties, "CorrelationData", None)
        try:
            request = json.loads(message.payload)
            request_id = request["id"]
            if not isinstance(request_id, str):
                raise TypeError("id")
        except (ValueError, KeyError, TypeError):
            self._reply(
                device, response_topic, correlation, _error(None, "malformed", "not a command request")
            )
            return
        cached = device.replies.get(request_id)
        if cached is not None:  # idempotent: the first answer again, nothing runs twice
            self._reply(device, response_topic, correlation, cached)
            return
        deadline = request.get("deadline")
        if isinstance(deadline, str) and deadline < _now():
            answer = _error(request_id, "expired", f"the deadline {deadline} has passed")
        elif name == "ping":
            result = {"pong": True, "device": device.id, "agent_version": AGENT_VERSION, "time": _now()}
            answer = json.dumps({"id": request_id, "ok": True, "result": result}).encode()
        else:
            answer = _error(request_id, "unknown-command", f"the simulator answers ping only, not {name!r}")
        device.replies[request_id] = answer
        while len(device.replies) > _REPLIES_KEPT:
            device.replies.popitem(last=False)
        self._reply(device, response_topic, correlation, answer)

    def _reply(self, device: _Device, topic: str, correlation: bytes | None, payload: bytes) -> None:
        properties = Properties(PacketTypes.PUBLISH)
        if correlation is not None:
            properties.CorrelationData = correlation
        properties.ContentType = "application/json"
        device.client.publish(topic, payload, qos=1, properties=properties)


def _no_delay(sock: Any) -> None:
    """Small MQTT packets go out at once (paho leaves Nagle on: a reply would wait for an ACK)."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _error(request_id: str | None, code: str, message: str) -> bytes:
    return json.dumps({"id": request_id, "ok": False, "error": {"code": code, "message": message}}).encode()


def _now() -> str:
    return iso_utc(time.time())


def _raise_fd_limit(needed: int) -> None:
    """One socket per device: raise the soft open-file limit (up to the hard one) when needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise RuntimeError(f"{needed} open files needed, the hard limit is {hard} (ulimit -Hn)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="Simulated devices (default 100).")
    parser.add_argument("--group", default="sim", help="Their group(s), comma-separated (default sim).")
    parser.add_argument("--prefix", default="edge", help="Topic prefix (default edge).")
    parser.add_argument("--broker", default="127.0.0.1:1883", help="host:port (default 127.0.0.1:1883).")
    parser.add_argument("--fail-versions", default="", help="Model versions that fail, comma-separated.")
    parser.add_argument("--delay-s", type=float, default=0.05, help="Seconds per pipeline step (jittered).")
    parser.add_argument("--id-prefix", default="sim", help="Device ids are <id-prefix>-00000, ...")
    parser.add_argument(
        "--trusted-key", type=Path, default=None, help="Refuse documents not signed by this public key."
    )
    parser.add_argument("--duration", type=float, default=None, help="Stop after this many seconds.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.broker.rpartition(":")
    simulator = Simulator(
        host,
        int(port),
        args.count,
        groups=[g for g in args.group.split(",") if g],
        prefix=args.prefix,
        fail_versions=[v for v in args.fail_versions.split(",") if v],
        delay_s=args.delay_s,
        id_prefix=args.id_prefix,
        trust=TrustPolicy.from_config([TrustedKey(key=args.trusted_key)]) if args.trusted_key else None,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    started = time.monotonic()
    simulator.start()
    seconds = time.monotonic() - started
    log.info("%d simulated devices ready in %.1f s", args.count, seconds)
    print(json.dumps({"ready": args.count, "seconds": round(seconds, 3)}), flush=True)  # for scripts
    stop.wait(args.duration)
    simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
