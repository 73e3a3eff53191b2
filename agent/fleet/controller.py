"""The controller side of the fleet protocol (docs/fleet.md): what `edge-agent fleet ...` runs on an
operator's laptop or in a CI job. A library: it raises typed errors and returns results; the CLI
(agent/cli_fleet.py) turns them into output and exit codes.

`FleetClient` is one short-lived MQTT 5 connection:

- `collect()` reads the fleet's retained reported state, status and desired documents: one
  subscription per topic filter, every payload kept as bytes and parsed only when a record is
  asked for, so 10,000 devices cost one pass of JSON parsing.
- `deploy()` publishes the next generation of a group's or device's document (retained, QoS 1,
  optionally signed), waits for the devices to converge, and runs canary waves with automatic
  rollback.
- `rollback()` publishes the next generation with the current document's baseline.
- `command()` is MQTT 5 request/response with a device.

Retained state is read with QoS 0 subscriptions followed by a barrier: a second SUBSCRIBE (that
asks for no retained messages) whose SUBACK comes after every retained message of the first. A
broker sends QoS 0 messages as it queues them, so once that SUBACK is in, the snapshot is
complete, with no guessing how long a broker takes (mosquitto delivers 10,000 retained messages
in about 0.4 s). QoS 1 would not do: brokers hold QoS 1 messages beyond a small in-flight window
(mosquitto: 20) in a queue the SUBACK overtakes, and drop those beyond `max_queued_messages`
(mosquitto: 1000). A short quiet period after the barrier covers brokers that order differently.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from agent.clock import iso_utc
from agent.config import check_name
from agent.errors import EdgeAgentError
from agent.fleet.protocol import (
    IN_FLIGHT_PHASES,
    device_layer,
    encode,
    group_layer,
    in_canary,
    sign_envelope,
)
from agent.fleet.records import (
    BAD_OUTCOMES,
    CONVERGED,
    FAILED,
    IN_FLIGHT,
    OFFLINE,
    ROLLED_BACK,
    TIMED_OUT,
    DeviceRecord,
    parse_device,
    parse_status,
    read_document,
    with_desired,
)
from agent.fleet.spec import (
    DeploySpec,
    Pipelines,
    build_document,
    check_document,
    check_spec,
    lifetime_s,
    load_spec,
)
from agent.mqtt.router import REPLY_SUFFIX
from agent.mqtt.topics import (
    GROUPS_LEVEL,
    command_topic,
    desired_topic,
    group_desired_topic,
    reported_topic,
    status_topic,
)
from agent.registry.signing import key_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DEFAULT_PREFIX = "edge"
SETTLE_S = 0.25  # quiet time after the retained snapshot before a collect returns
_POLL_S = 0.1  # how often waits re-check the state (data messages do not wake waiters one by one)
_PROGRESS_EVERY_S = 1.0


class ExitCode(IntEnum):
    """Exit statuses of `edge-agent fleet ...` (documented in its help)."""

    OK = 0  # every target device converged; a command answered ok
    ERROR = 1  # invalid spec, key or option files: nothing was published
    USAGE = 2  # command-line usage (Typer's own)
    BROKER = 3  # the broker cannot be reached, refused us, or the connection was lost
    FAILED = 4  # a target device refused the document, or a pipeline failed or rolled back
    ROLLED_BACK = 5  # the rollout was stopped and the target rolled back to the baseline
    TIMED_OUT = 6  # devices still in flight at the timeout; a command got no answer
    OFFLINE = 7  # every online target converged, but some are offline


class FleetError(EdgeAgentError):
    """Something the operator must fix; `exit_code` says which kind."""

    exit_code: ExitCode = ExitCode.ERROR


class BrokerError(FleetError):
    exit_code = ExitCode.BROKER


class FleetTimeout(FleetError):
    exit_code = ExitCode.TIMED_OUT


@dataclass(frozen=True)
class BrokerOptions:
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None  # TLS with this CA bundle
    prefix: str = DEFAULT_PREFIX
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        try:
            check_name(self.prefix)  # the rule of the agents' mqtt.topic_prefix: one topic level
        except ValueError as exc:
            raise FleetError(f"topic prefix: {exc}") from None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


TargetKind = Literal["group", "device"]
Phase = Literal["canary", "all", "rollback"]
Target = tuple[TargetKind, str]  # ("group", "lobby") or ("device", "cam-01")


@dataclass(frozen=True)
class _Target:
    kind: TargetKind
    name: str
    layer: str  # "group:lobby" / "device:cam-01", the document's target
    topic: str

    @classmethod
    def of(cls, target: Target, prefix: str) -> _Target:
        kind, name = target
        try:
            if kind == "group":
                return cls(kind, name, group_layer(name), group_desired_topic(prefix, name))
            if kind == "device":
                return cls(kind, name, device_layer(name), desired_topic(prefix, name))
        except ValueError as exc:  # a name that cannot be a topic level
            raise FleetError(str(exc)) from None
        raise FleetError(f"a target is ('group', name) or ('device', id), not {target!r}")

    def covers(self, record: DeviceRecord) -> bool:
        """Whether a device is a target member: the device itself, or a device whose retained
        reported state lists the group (docs/fleet.md: `device.groups` is the agent's to say)."""
        return record.device == self.name if self.kind == "device" else self.name in record.groups


def target_layer(target: Target) -> str:
    """The document target of a target: "group:<name>" or "device:<id>"; FleetError if not one."""
    return _Target.of(target, DEFAULT_PREFIX).layer


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wave:
    """One published generation and where each device it was waited for ended."""

    phase: Phase
    generation: int
    outcomes: Mapping[str, tuple[str, str | None]]  # device -> (outcome, reason)
    seconds: float

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys((CONVERGED, FAILED, ROLLED_BACK, OFFLINE, TIMED_OUT), 0)
        for outcome, _ in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    @property
    def failed_pct(self) -> float:
        """Bad outcomes (failed, rolled back, timed out) per 100 devices that are not offline; 100
        when every device is offline: nothing proved the generation works."""
        considered = [o for o, _ in self.outcomes.values() if o != OFFLINE]
        if not self.outcomes:
            return 0.0
        if not considered:
            return 100.0
        return 100.0 * sum(o in BAD_OUTCOMES for o in considered) / len(considered)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "generation": self.generation,
            "devices": len(self.outcomes),
            "counts": self.counts(),
            "failed_pct": round(self.failed_pct, 2),
            "seconds": round(self.seconds, 3),
            "outcomes": {d: {"outcome": o, "reason": r} for d, (o, r) in sorted(self.outcomes.items())},
        }


@dataclass
class DeployResult:
    """What a deploy or rollback did. `status`: published (not waited for), converged, failed,
    rolled-back (the controller rolled the target back), timed-out or offline."""

    target: str
    topic: str
    published: list[int] = field(default_factory=list)
    waves: list[Wave] = field(default_factory=list)
    status: str = "published"
    message: str = ""
    signed_by: str | None = None

    @property
    def generation(self) -> int:
        return self.published[-1] if self.published else 0

    @property
    def outcomes(self) -> Mapping[str, tuple[str, str | None]]:
        """Each device's outcome in the last wave it was waited for."""
        merged: dict[str, tuple[str, str | None]] = {}
        for wave in self.waves:
            merged.update(wave.outcomes)
        return merged

    @property
    def exit_code(self) -> ExitCode:
        return {
            "failed": ExitCode.FAILED,
            "rolled-back": ExitCode.ROLLED_BACK,
            "timed-out": ExitCode.TIMED_OUT,
            "offline": ExitCode.OFFLINE,
        }.get(self.status, ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        outcomes = self.outcomes
        summary = dict.fromkeys((CONVERGED, FAILED, ROLLED_BACK, OFFLINE, TIMED_OUT), 0)
        for outcome, _ in outcomes.values():
            summary[outcome] += 1
        return {
            "ok": self.exit_code == ExitCode.OK,
            "status": self.status,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "target": self.target,
            "topic": self.topic,
            "generation": self.generation,
            "published": self.published,
            "signed_by": self.signed_by,
            "summary": {"devices": len(outcomes), **summary},
            "waves": [w.to_dict() for w in self.waves],
            "devices": {d: {"outcome": o, "reason": r} for d, (o, r) in sorted(outcomes.items())},
        }


def _final_status(wave: Wave) -> str:
    outcomes = {o for o, _ in wave.outcomes.values()}
    for status in (FAILED, ROLLED_BACK, TIMED_OUT, OFFLINE):
        if status in outcomes:
            return FAILED if status == ROLLED_BACK else status
    return CONVERGED


@dataclass(frozen=True)
class CommandReply:
    device: str
    name: str
    ok: bool
    result: Any
    error: Mapping[str, Any] | None
    seconds: float
    correlation_data: bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "command": self.name,
            "ok": self.ok,
            "result": self.result,
            "error": self.error,
            "seconds": round(self.seconds, 3),
        }


Progress = Callable[[str, int, Mapping[str, int], int], None]  # phase, generation, counts, devices


# --- the client ---------------------------------------------------------------------------------


class FleetClient:
    """One MQTT 5 connection to the fleet's broker (module docstring). Use as a context manager."""

    def __init__(self, options: BrokerOptions | None = None) -> None:
        self.options = options or BrokerOptions()
        self._prefix = self.options.prefix
        self._cond = threading.Condition()
        self._client: mqtt.Client | None = None
        self._connack: ReasonCode | None = None
        self._lost: str | None = None
        self._subacks: dict[int, list[ReasonCode]] = {}
        self._pubacks: dict[int, ReasonCode | None] = {}
        self._watched: set[str] = set()
        # Latest retained payloads (bytes, parsed on demand), and replies by correlation data.
        self._reported: dict[str, bytes] = {}
        self._status: dict[str, bytes] = {}
        self._desired: dict[str, bytes] = {}  # layer -> payload
        self._replies: dict[bytes, bytes] = {}
        self._changed: set[str] = set()  # devices whose reported state or status changed (waves)
        self._last_message = time.monotonic()
        # Parsed records, reused while the payloads are the same objects (only the caller's thread).
        self._records: dict[str, tuple[bytes | None, bytes | None, DeviceRecord]] = {}
        self._generations: dict[str, tuple[bytes, int | None]] = {}
        self._onlines: dict[str, tuple[bytes | None, bool | None]] = {}

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> FleetClient:
        opts = self.options
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"edge-agent-fleet-{uuid.uuid4().hex[:12]}",
            protocol=mqtt.MQTTv5,
        )
        client.connect_timeout = opts.connect_timeout_s
        if opts.username is not None:
            client.username_pw_set(opts.username, opts.password)
        if opts.ca_file is not None:
            try:
                client.tls_set(ca_certs=str(opts.ca_file))
            except (OSError, ValueError) as exc:
                raise FleetError(f"cannot load the CA file {opts.ca_file}: {exc}") from None
        client.on_socket_open = _no_delay
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        try:
            client.connect(opts.host, opts.port, keepalive=30, clean_start=True)
        except OSError as exc:  # refused, unreachable, unresolvable, TLS handshake, timeout
            raise BrokerError(
                f"cannot connect to the MQTT broker {opts.address}: {exc.strerror or exc}",
                hint="check --broker (or EDGE_AGENT_FLEET_BROKER) and that the broker is running",
            ) from None
        self._client = client
        client.loop_start()
        deadline = time.monotonic() + opts.connect_timeout_s
        with self._cond:
            while self._connack is None and self._lost is None:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
        if self._connack is None or self._connack.is_failure:
            reason = self._connack or self._lost or f"no CONNACK within {opts.connect_timeout_s:g} s"
            self.close()
            raise BrokerError(
                f"the MQTT broker {opts.address} refused the connection: {reason}",
                hint="check --username/--password-file (and the broker's ACLs)",
            )
        return self

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def __enter__(self) -> FleetClient:
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def _mqtt(self) -> mqtt.Client:
        if self._client is None:
            raise FleetError("the fleet client is not connected (use it in a `with` block)")
        return self._client

    # -- paho callbacks (paho's network thread) -----------------------------------------------

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self._connack = reason
            self._cond.notify_all()

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        with self._cond:
            self._lost = str(reason)
            self._cond.notify_all()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._cond:
            self._subacks[mid] = list(codes)
            self._cond.notify_all()

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        with self._cond:
            self._pubacks[mid] = reason if isinstance(reason, ReasonCode) else None
            self._cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        parts = message.topic.split("/")
        payload = bytes(message.payload)  # the same object when paho gives bytes
        with self._cond:
            self._last_message = time.monotonic()
            if len(parts) == 3 and parts[0] == self._prefix:
                store = {"reported": self._reported, "status": self._status}.get(parts[2])
                if store is not None:
                    _keep(store, parts[1], payload)
                    self._changed.add(parts[1])
                elif parts[2] == "desired":
                    _keep(self._desired, device_layer(parts[1]), payload)
            elif len(parts) == 4 and parts[1] == GROUPS_LEVEL and parts[3] == "desired":
                _keep(self._desired, group_layer(parts[2]), payload)
            elif message.topic.endswith(REPLY_SUFFIX):
                correlation = getattr(message.properties, "CorrelationData", None)
                if correlation is not None:
                    self._replies[bytes(correlation)] = payload
                    self._cond.notify_all()

    # -- subscriptions and publishing ---------------------------------------------------------

    def _wait(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Wait (holding nothing) until `done()` under the lock; BrokerError if the connection is
        lost, FleetTimeout naming `what` at the deadline."""
        with self._cond:
            while not done():
                if self._lost is not None:
                    raise BrokerError(
                        f"lost the connection to the MQTT broker {self.options.address}: {self._lost}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FleetTimeout(f"{what}: no answer from the broker {self.options.address}")
                self._cond.wait(min(remaining, _POLL_S))

    def _subscribe(self, filters: Sequence[str], qos: int, deadline: float, retained: bool = True) -> None:
        options = SubscribeOptions(qos=qos, retainHandling=0 if retained else 2)
        result, mid = self._mqtt.subscribe([(f, options) for f in filters])
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise BrokerError(f"could not subscribe to {', '.join(filters)}: {mqtt.error_string(result)}")
        self._wait(lambda: mid in self._subacks, deadline, f"subscribing to {', '.join(filters)}")
        with self._cond:
            codes = self._subacks.pop(mid)
        refused = [f"{f} ({c})" for f, c in zip(filters, codes, strict=False) if c.is_failure]
        if refused:
            raise BrokerError(
                f"the broker refused the subscription to {', '.join(refused)}",
                hint="the broker's ACLs must let the controller read the fleet's topics",
            )

    def _watch(self, filters: Iterable[str], deadline: float) -> None:
        """Subscribe (QoS 0) to the filters not yet watched and wait until the broker has sent
        every retained message for them (the barrier in the module docstring)."""
        new = [f for f in dict.fromkeys(filters) if f not in self._watched]
        if not new:
            return
        self._subscribe(new, 0, deadline)
        self._subscribe(new[:1], 0, deadline, retained=False)  # the barrier
        self._watched.update(new)

    def _settle(self, settle_s: float, deadline: float) -> None:
        """Wait until no message came for `settle_s`, for at most 10 x settle_s (later messages are
        live updates, not the snapshot) or the deadline."""
        until = min(deadline, time.monotonic() + 10 * settle_s)
        with self._cond:
            while True:
                now = time.monotonic()
                quiet_at = self._last_message + settle_s
                if now >= quiet_at or now >= until:
                    return
                self._cond.wait(min(quiet_at, until) - now)

    def _publish(
        self, topic: str, payload: bytes, deadline: float, retain: bool, properties: Properties | None = None
    ) -> None:
        """Publish at QoS 1 and wait for the PUBACK; BrokerError when the broker refuses it."""
        info = self._mqtt.publish(topic, payload, qos=1, retain=retain, properties=properties)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise BrokerError(f"could not publish on {topic}: {mqtt.error_string(info.rc)}")
        self._wait(lambda: info.mid in self._pubacks, deadline, f"publishing on {topic}")
        with self._cond:
            reason = self._pubacks.pop(info.mid)
        if reason is not None and reason.is_failure:
            raise BrokerError(
                f"the broker refused the message on {topic}: {reason}",
                hint="the broker's ACLs must let the controller publish there",
            )

    # -- records ------------------------------------------------------------------------------

    def _snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
        with self._cond:
            return dict(self._reported), dict(self._status), dict(self._desired)

    def _record(self, device: str, reported: bytes | None, status: bytes | None) -> DeviceRecord:
        cached = self._records.get(device)
        if cached is not None and cached[0] is reported and cached[1] is status:
            return cached[2]
        record = parse_device(device, reported, self._online(device, status))
        self._records[device] = (reported, status, record)
        return record

    def _online(self, device: str, status: bytes | None) -> bool | None:
        """parse_status, once per status payload (reported states change far more often)."""
        cached = self._onlines.get(device)
        if cached is None or cached[0] is not status:
            cached = (status, parse_status(status))
            self._onlines[device] = cached
        return cached[1]

    def _desired_generation(self, layer: str, payload: bytes) -> int | None:
        cached = self._generations.get(layer)
        if cached is None or cached[0] is not payload:
            try:
                generation: int | None = read_document(payload, layer)["generation"]
            except ValueError:
                generation = None
            cached = (payload, generation)
            self._generations[layer] = cached
        return cached[1]

    def _members(self, target: _Target) -> list[str]:
        """The devices the target covers now (`_Target.covers`)."""
        if target.kind == "device":
            return [target.name]
        reported, status, _ = self._snapshot()
        return sorted(d for d, p in reported.items() if target.covers(self._record(d, p, status.get(d))))

    def _state_filters(self, target: _Target | None = None) -> list[str]:
        if target is not None and target.kind == "device":
            return [reported_topic(self._prefix, target.name), status_topic(self._prefix, target.name)]
        return [f"{self._prefix}/+/reported", f"{self._prefix}/+/status"]

    def collect(
        self, group: str | None = None, settle_s: float = SETTLE_S, timeout_s: float = 30.0
    ) -> list[DeviceRecord]:
        """Every device the broker holds retained state for (only members of `group` when given),
        sorted by id, with the desired generation of each layer that concerns it."""
        return [record for record, _, _ in self._collect(group, settle_s, timeout_s)]

    def collect_status(
        self, group: str | None = None, settle_s: float = SETTLE_S, timeout_s: float = 30.0
    ) -> list[DeviceStatus]:
        """`collect`, each device with what `edge-agent fleet status` shows: per pipeline what
        serves, what is desired and what became of it, judged against the device's presence (an
        offline device, or one that restarted and has not reported since, runs nothing we know)."""
        return [
            device_status(record, reported, status)
            for record, reported, status in self._collect(group, settle_s, timeout_s)
        ]

    def _collect(
        self, group: str | None, settle_s: float, timeout_s: float
    ) -> list[tuple[DeviceRecord, bytes | None, bytes | None]]:
        """(record, retained reported payload, retained status payload) of each device."""
        deadline = time.monotonic() + timeout_s
        filters = [
            *self._state_filters(),
            f"{self._prefix}/+/desired",
            f"{self._prefix}/{GROUPS_LEVEL}/+/desired",
        ]
        self._watch(filters, deadline)
        self._settle(settle_s, deadline)
        reported, status, desired = self._snapshot()
        generations = {
            layer: g for layer, p in desired.items() if (g := self._desired_generation(layer, p)) is not None
        }
        records = []
        for device in sorted(reported.keys() | status.keys()):
            record = self._record(device, reported.get(device), status.get(device))
            if group is None or group in record.groups:
                records.append((with_desired(record, generations), reported.get(device), status.get(device)))
        return records

    # -- deploy and rollback ------------------------------------------------------------------

    def current_document(self, target: Target, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """The retained document on the target's topic (a signed envelope unwrapped), or None."""
        return self._current(_Target.of(target, self._prefix), time.monotonic() + timeout_s)

    def _current(self, target: _Target, deadline: float) -> dict[str, Any] | None:
        self._watch([target.topic], deadline)
        with self._cond:
            payload = self._desired.get(target.layer)
        if payload is None:
            return None
        try:
            return read_document(payload, target.topic)
        except ValueError as exc:
            raise FleetError(
                f"the retained document on {target.topic} is unreadable: {exc}",
                hint="withdraw it (publish an empty retained message there), then deploy again",
            ) from None

    def deploy(
        self,
        spec: DeploySpec | Path,
        target: Target,
        *,
        sign_key: Ed25519PrivateKey | None = None,
        canary_pct: float | None = None,
        max_failed_pct: float = 0.0,
        wait: bool = True,
        timeout_s: float = 600.0,
        progress: Progress | None = None,
    ) -> DeployResult:
        """Publish the spec as the target's next generation (docs/fleet.md) and, with `wait`, wait
        until every target device converged or failed, each wave for at most `timeout_s`.

        With `canary_pct` (groups only) the first generation goes to a canary cohort; when more
        than `max_failed_pct` of the canaries fail, the next generation puts the baseline back
        and the rollout stops; otherwise the next generation goes to all, and is rolled back the
        same way if more than `max_failed_pct` of all fail. Without canaries nothing is rolled
        back automatically: failures are reported (status "failed")."""
        if not isinstance(spec, DeploySpec):
            spec = load_spec(spec)
        t = _Target.of(target, self._prefix)
        check_spec(spec, t.layer)
        if canary_pct is not None:
            if t.kind != "group":
                raise FleetError("--canary needs a group target: a device is all or nothing")
            if not 0 < canary_pct < 100:
                raise FleetError(f"the canary share is a percentage between 0 and 100, not {canary_pct:g}")
            if not wait:
                raise FleetError("a canary rollout waits for each wave: --canary cannot go with --no-wait")
        if not 0 <= max_failed_pct <= 100:
            raise FleetError(f"--max-failed is a percentage from 0 to 100, not {max_failed_pct:g}")
        deadline = time.monotonic() + self.options.connect_timeout_s
        current = self._current(t, deadline)
        generation = (current["generation"] if current else 0) + 1
        baseline = _baseline(current)
        settings = {
            "priority": spec.priority,
            "health": spec.health,
            "expires_in_s": spec.expires_in_s,
            "agent": spec.agent,
        }
        result = DeployResult(t.layer, t.topic, signed_by=_key_id(sign_key))
        if wait:
            self._watch(self._state_filters(t), deadline)

        if canary_pct is None:
            rollout: dict[str, Any] = {"phase": "all", "baseline": baseline}
            self._publish_document(t, generation, spec.pipelines, rollout, settings, sign_key, result)
            if not wait:
                result.message = f"published {t.layer} generation {generation}"
                return result
            wave = self._wave("all", t, generation, timeout_s, progress)
            result.waves.append(wave)
            result.status = _final_status(wave)
            result.message = _describe(result, wave)
            return result

        group = t.name
        seed = f"{group}-{generation}"
        pct = canary_pct

        def canary(device: str) -> bool:
            return in_canary(device, seed, pct)

        known = self._members(t)
        if not any(canary(d) for d in known):
            raise FleetError(
                f"no device of group {group} falls in a {canary_pct:g}% canary cohort "
                f"({len(known)} member(s) report the group); nothing was published",
                hint="raise --canary, or deploy without it",
            )
        rollout = {"phase": "canary", "canary_percent": pct, "seed": seed, "baseline": baseline}
        self._publish_document(t, generation, spec.pipelines, rollout, settings, sign_key, result)
        waves: list[tuple[Phase, Callable[[str], bool] | None]] = [("canary", canary), ("all", None)]
        for phase, cohort in waves:
            wave = self._wave(phase, t, result.generation, timeout_s, progress, cohort)
            result.waves.append(wave)
            if wave.failed_pct > max_failed_pct:
                why = (
                    f"{wave.failed_pct:.1f}% of the {phase} wave ({len(wave.outcomes)} device(s)) failed, "
                    f"more than the {max_failed_pct:g}% allowed"
                )
                self._roll_back(t, baseline, settings, sign_key, result, timeout_s, progress)
                result.status = "rolled-back"
                result.message = f"rollout stopped: {why}; {_describe(result, result.waves[-1])}"
                return result
            if phase == "canary":
                rollout = {"phase": "all", "baseline": baseline}
                self._publish_document(
                    t, result.generation + 1, spec.pipelines, rollout, settings, sign_key, result
                )
        result.status = _final_status(result.waves[-1])
        result.message = _describe(result, result.waves[-1])
        return result

    def rollback(
        self,
        target: Target,
        *,
        sign_key: Ed25519PrivateKey | None = None,
        wait: bool = True,
        timeout_s: float = 600.0,
        progress: Progress | None = None,
    ) -> DeployResult:
        """Publish the next generation with the current document's `rollout.baseline` as its
        pipelines (priority, health and lifetime kept), and with `wait` wait for it."""
        t = _Target.of(target, self._prefix)
        deadline = time.monotonic() + self.options.connect_timeout_s
        current = self._current(t, deadline)
        if current is None:
            raise FleetError(f"nothing to roll back: no document is retained on {t.topic}")
        rollout = current.get("rollout")
        baseline = rollout.get("baseline") if isinstance(rollout, dict) else None
        if not isinstance(baseline, dict):
            raise FleetError(
                f"the document on {t.topic} (generation {current['generation']}) has no rollout.baseline "
                "to go back to",
                hint="deploy the pipelines you want instead",
            )
        settings = {
            "priority": current.get("priority", 0),
            "health": current.get("health"),
            "expires_in_s": lifetime_s(current),
        }
        result = DeployResult(t.layer, t.topic, signed_by=_key_id(sign_key))
        if wait:
            self._watch(self._state_filters(t), deadline)
        rollout = {"phase": "all", "baseline": baseline}
        generation = current["generation"] + 1
        self._publish_document(t, generation, baseline, rollout, settings, sign_key, result)
        if not wait:
            result.message = f"published {t.layer} generation {result.generation} (the baseline)"
            return result
        wave = self._wave("rollback", t, result.generation, timeout_s, progress)
        result.waves.append(wave)
        result.status = _final_status(wave)
        result.message = _describe(result, wave)
        return result

    def _roll_back(
        self,
        t: _Target,
        baseline: Pipelines,
        settings: Mapping[str, Any],
        sign_key: Ed25519PrivateKey | None,
        result: DeployResult,
        timeout_s: float,
        progress: Progress | None,
    ) -> None:
        rollout = {"phase": "all", "baseline": baseline}
        self._publish_document(t, result.generation + 1, baseline, rollout, settings, sign_key, result)
        result.waves.append(self._wave("rollback", t, result.generation, timeout_s, progress))

    def _publish_document(
        self,
        t: _Target,
        generation: int,
        pipelines: Mapping[str, Any],
        rollout: Mapping[str, Any],
        settings: Mapping[str, Any],
        sign_key: Ed25519PrivateKey | None,
        result: DeployResult,
    ) -> None:
        document = build_document(t.layer, generation, pipelines, rollout=rollout, **settings)
        data = encode(document)
        payload = sign_envelope(data, sign_key) if sign_key is not None else data
        check_document(payload, t.layer)  # what a device would refuse is not published
        self._publish(t.topic, payload, time.monotonic() + self.options.connect_timeout_s, retain=True)
        result.published.append(generation)

    def _wave(
        self,
        phase: Phase,
        t: _Target,
        generation: int,
        timeout_s: float,
        progress: Progress | None,
        cohort: Callable[[str], bool] | None = None,
    ) -> Wave:
        """Wait until every member of the target (within `cohort`, when given) is done with
        `generation` (converged, failed, rolled back or offline) or `timeout_s` passed (the rest:
        timed out). Only devices whose reported state or status changed are looked at again, so
        a wave over 10,000 devices costs one parse per message, not one per device per poll."""
        started = time.monotonic()
        deadline = started + timeout_s
        next_progress = started + _PROGRESS_EVERY_S
        outcomes: dict[str, tuple[str, str | None]] = {}
        in_flight: set[str] = set()

        def look_at(payloads: Mapping[str, tuple[bytes | None, bytes | None]]) -> None:
            for device, (reported, status) in payloads.items():
                record = self._record(device, reported, status)
                if not t.covers(record) or (cohort is not None and not cohort(device)):
                    outcomes.pop(device, None)
                    in_flight.discard(device)
                    continue
                outcomes[device] = record.outcome(t.layer, generation)
                (in_flight.add if outcomes[device][0] == IN_FLIGHT else in_flight.discard)(device)

        with self._cond:
            self._changed.clear()
            devices = (
                self._reported.keys() | self._status.keys() | ({t.name} if t.kind == "device" else set())
            )
            payloads = {d: (self._reported.get(d), self._status.get(d)) for d in devices}
        look_at(payloads)
        while True:
            now = time.monotonic()
            done = not in_flight
            if not done and now >= deadline:
                late = f"still in flight after {timeout_s:g} s"
                for device in in_flight:
                    outcomes[device] = (TIMED_OUT, f"{late}: {outcomes[device][1]}")
                done = True
            if progress is not None and (done or now >= next_progress):
                next_progress = now + _PROGRESS_EVERY_S
                counts = Wave(phase, generation, outcomes, now - started).counts()
                counts[IN_FLIGHT] = 0 if done else len(in_flight)
                progress(phase, generation, counts, len(outcomes))
            if done:
                return Wave(phase, generation, outcomes, now - started)
            with self._cond:
                if self._lost is not None:
                    raise BrokerError(
                        f"lost the connection to the MQTT broker {self.options.address}: {self._lost}"
                    )
                if not self._changed:  # data messages do not wake waiters one by one: poll
                    self._cond.wait(min(_POLL_S, max(0.0, deadline - now)))
                changed, self._changed = self._changed, set()
                payloads = {d: (self._reported.get(d), self._status.get(d)) for d in changed}
            look_at(payloads)

    # -- commands -----------------------------------------------------------------------------

    def command(
        self, device: str, name: str, args: Mapping[str, Any] | None = None, timeout_s: float = 10.0
    ) -> CommandReply:
        """Send command `name` to `device` and wait for its answer (MQTT 5 request/response: the
        reply comes on `<prefix>/<device>/cmd/<name>/reply` with our correlation data)."""
        try:
            topic = command_topic(self._prefix, device, name)
        except ValueError as exc:
            raise FleetError(str(exc)) from None
        reply_topic = topic + REPLY_SUFFIX
        started = time.monotonic()
        deadline = started + timeout_s
        self._subscribe([reply_topic], 1, deadline)
        self._watch([status_topic(self._prefix, device)], deadline)
        correlation = os.urandom(16)
        request_id = uuid.uuid4().hex
        request = {"id": request_id, "args": dict(args or {}), "deadline": iso_utc(time.time() + timeout_s)}
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = reply_topic
        properties.CorrelationData = correlation
        properties.MessageExpiryInterval = max(1, math.ceil(timeout_s))
        properties.ContentType = "application/json"
        self._publish(topic, json.dumps(request).encode(), deadline, retain=False, properties=properties)
        try:
            self._wait(lambda: correlation in self._replies, deadline, "")
        except FleetTimeout:
            raise FleetTimeout(
                f"{device} did not answer {name!r} within {timeout_s:g} s ({self._presence(device)})",
                hint=f"requests go to {topic}; `edge-agent fleet status` shows which devices are online",
            ) from None
        with self._cond:
            payload = self._replies.pop(correlation)
        try:
            reply = json.loads(payload)
            if not isinstance(reply, dict) or reply.get("id") not in (request_id, None):
                raise ValueError("not a reply to this request")
        except ValueError as exc:
            raise FleetError(f"{device} answered {name!r} with an unreadable reply: {exc}") from None
        error = reply.get("error")
        return CommandReply(
            device,
            name,
            reply.get("ok") is True,
            reply.get("result"),
            error if isinstance(error, dict) else None,
            time.monotonic() - started,
            correlation,
        )

    def _presence(self, device: str) -> str:
        with self._cond:
            status = self._status.get(device)
        online = parse_status(status)
        if online is None:
            return "it never published a status: is the device id right?"
        return "its status is online" if online else "its status is offline"


# --- what `fleet status` shows --------------------------------------------------------------------

# Where one pipeline of a device stands, as `fleet status` judges it (the device-level conditions are
# records.py's: converged, failed, in-flight, offline).
PIPELINE_RUNNING = "running"
PIPELINE_FAILED = "failed"  # the desired version never got to serve (what serves is the one before, if any)
PIPELINE_ROLLED_BACK = "rolled-back"  # the desired version failed its health window; the one before serves
PIPELINE_IN_FLIGHT = "in-flight"
PIPELINE_OFFLINE = "offline"  # the device's status is offline: its last report is history
PIPELINE_STALE = "stale"  # the agent restarted and has not reported since
PIPELINE_UNKNOWN = "unknown"


@dataclass(frozen=True)
class Presence:
    """A device's retained status message (`<prefix>/<device>/status`): its birth (online) or its
    last will / goodbye (offline), with the message's timestamp and, online, when the agent started."""

    online: bool | None  # None: no (readable) status message
    at: str | None = None
    started_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        state = {True: "online", False: "offline", None: None}[self.online]
        return {"status": state, "at": self.at, "started_at": self.started_at}


def parse_presence(payload: bytes | None) -> Presence:
    """The status message: online/offline as `parse_status` reads it, and its times when it is the
    agent's JSON ({"status", "timestamp", "started_at", ...})."""
    online = parse_status(payload)
    if online is None or not payload:
        return Presence(online)
    try:
        data = json.loads(payload)
    except ValueError:  # a bare "online"/"offline"
        return Presence(online)
    if not isinstance(data, dict):
        return Presence(online)
    return Presence(online, _text(data.get("timestamp")), _text(data.get("started_at")))


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline of a device as `fleet status` shows it: what serves (the model@version frames go
    through), what is desired, what became of the desired one, and the last error with its time."""

    name: str
    condition: str  # PIPELINE_* above
    serving: str | None  # None: nothing serves, or nothing known (offline, stale)
    desired: str | None
    text: str  # e.g. "serving faces@3; desired faces@4 failed: <reason>"
    last_error: str | None = None
    last_error_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "serving": self.serving,
            "desired": self.desired,
            "text": self.text,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


@dataclass(frozen=True)
class DeviceStatus:
    """A device's record (records.py) with its presence and what each of its pipelines serves."""

    record: DeviceRecord
    presence: Presence
    pipelines: Mapping[str, PipelineStatus]
    stale: str | None = None  # why the reported state does not describe the running agent (None: it does)

    @property
    def device(self) -> str:
        return self.record.device

    def condition(self) -> tuple[str, str | None]:
        """The record's condition, except that an online device whose reported state predates its
        start is in flight: what it runs now is not reported yet."""
        if self.stale is not None and self.record.online is not False:
            return IN_FLIGHT, self.stale
        return self.record.condition()

    def to_dict(self) -> dict[str, Any]:
        data = self.record.to_dict()
        data["condition"], data["why"] = self.condition()
        data["presence"] = self.presence.to_dict()
        data["stale"] = self.stale
        for name, pipeline in self.pipelines.items():
            data["pipelines"].setdefault(name, {}).update(pipeline.to_dict())
        return data


def device_status(record: DeviceRecord, reported: bytes | None, status: bytes | None) -> DeviceStatus:
    """`record` with its presence (the retained status) and each pipeline's serving/desired view,
    read from the retained reported payload it was parsed from."""
    presence = parse_presence(status)
    stale = None
    if presence.online and presence.started_at and record.last_seen:
        started, reported_at = _epoch(presence.started_at), _epoch(record.last_seen)
        if started is not None and reported_at is not None and reported_at < started:
            stale = (
                f"not reported since the agent started at {presence.started_at} "
                f"(last report {record.last_seen})"
            )
    raw: dict[str, Any] = {}
    if reported and not record.problem:
        with contextlib.suppress(ValueError):
            data = json.loads(reported)
            if isinstance(data, dict) and isinstance(data.get("pipelines"), dict):
                raw = data["pipelines"]
    pipelines = {
        name: _pipeline_status(name, fields, record.online, stale, record.last_seen)
        for name, fields in raw.items()
        if isinstance(fields, dict) and name in record.pipelines
    }
    return DeviceStatus(record, presence, pipelines, stale)


def _pipeline_status(
    name: str, fields: Mapping[str, Any], online: bool | None, stale: str | None, last_seen: str | None
) -> PipelineStatus:
    phase, reason = _text(fields.get("phase")), _text(fields.get("reason"))
    model, desired = _text(fields.get("model")), _text(fields.get("desired_model"))
    if "running_model" in fields:
        serving = _text(fields.get("running_model"))
    else:  # an agent from before `running_model`: `model` names what serves, except on a failed
        serving = None if phase == "failed" and desired is None else model  # first start
    desired = desired or model
    runtime = _text(fields.get("state"))  # the running pipeline's own: running, degraded, ...
    serving_text = f"serving {serving}" + (f" ({runtime})" if runtime not in (None, "running") else "")
    if phase in ("failed", "rolled-back"):
        condition = PIPELINE_FAILED if phase == "failed" else PIPELINE_ROLLED_BACK
        what = "failed" if phase == "failed" else "rolled back"
        why = f": {reason}" if reason else ""
        head = serving_text if serving else "nothing serving"
        text = f"{head}; desired {desired} {what}{why}" if desired != serving else f"{head}; {what}{why}"
    elif phase in IN_FLIGHT_PHASES:
        condition = PIPELINE_IN_FLIGHT
        if serving and desired and serving != desired:
            text = f"{serving_text}; desired {desired} {phase}"
        else:
            text = f"{phase} {desired or serving or '?'}"
    elif phase == "running":
        condition = PIPELINE_RUNNING
        text = f"running {serving or desired or '?'}" + (
            f" ({runtime})" if runtime not in (None, "running") else ""
        )
    else:
        condition, text = PIPELINE_UNKNOWN, phase or "no phase reported"
    if online is False:
        when = f" at {last_seen}" if last_seen else ""
        condition, serving, text = PIPELINE_OFFLINE, None, f"offline; last reported{when}: {text}"
    elif stale is not None:
        condition, serving, text = PIPELINE_STALE, None, f"{stale}; it reported: {text}"
    return PipelineStatus(
        name,
        condition,
        serving,
        desired,
        text,
        _text(fields.get("last_error")),
        _text(fields.get("last_error_at")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Send small packets at once: paho leaves Nagle's algorithm on, which holds a request or a
    SUBSCRIBE until the previous packet's ACK (up to 40 ms each on Linux)."""
    with contextlib.suppress(OSError, AttributeError):  # a TLS or websocket wrapper may refuse
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _keep(store: dict[str, bytes], key: str, payload: bytes) -> None:
    if payload:
        store[key] = payload
    else:  # an empty retained message deletes the retained one
        store.pop(key, None)


def _baseline(current: Mapping[str, Any] | None) -> Pipelines:
    """What a new deploy goes back to on failure: the pipelines the target's devices run now. That
    is the current document's pipelines, except during a canary wave, where most devices run its
    baseline."""
    if current is None:
        return {}
    rollout = current.get("rollout")
    if (
        isinstance(rollout, dict)
        and rollout.get("phase") == "canary"
        and isinstance(rollout.get("baseline"), dict)
    ):
        return dict(rollout["baseline"])
    pipelines = current.get("pipelines")
    return dict(pipelines) if isinstance(pipelines, dict) else {}


def _key_id(key: Ed25519PrivateKey | None) -> str | None:
    return key_id(key.public_key()) if key is not None else None


def _describe(result: DeployResult, wave: Wave) -> str:
    counts = ", ".join(f"{n} {o}" for o, n in wave.counts().items() if n)
    if not wave.outcomes:
        return f"{result.target} generation {wave.generation}: no device reports the target yet"
    where = f"{result.target} generation {wave.generation} ({wave.phase})"
    return f"{where}: {len(wave.outcomes)} device(s): {counts}"
