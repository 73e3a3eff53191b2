"""The controller side of the fleet protocol (docs/fleet.md): what `edge-agent fleet ...` runs on an
operator's laptop or in a CI job. A library: it raises typed errors (agent/fleetctl/connection.py)
and returns results (agent/fleetctl/results.py); the CLI (agent/cli/fleet.py) turns them into output
and exit codes.

`FleetClient` is one short-lived MQTT 5 connection (agent/fleetctl/connection.py):

- `collect()` reads the fleet's retained reported state, status and desired documents: one
  subscription per topic filter, every payload kept as bytes and parsed only when a record is
  asked for, so 10,000 devices cost one pass of JSON parsing.
- `deploy()` publishes the next generation of a group's or device's document (retained, QoS 1,
  optionally signed), waits for the devices to converge, and runs canary waves with automatic
  rollback.
- `rollback()` publishes the next generation with the current document's baseline.
- `command()` is MQTT 5 request/response with a device.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.clock import iso_utc
from agent.fleet.protocol import encode, in_canary, sign_envelope
from agent.fleetctl.connection import POLL_S, BrokerConnection, BrokerError, FleetError, FleetTimeout
from agent.fleetctl.records import (
    IN_FLIGHT,
    TIMED_OUT,
    DeviceRecord,
    parse_status,
    read_document,
    with_desired,
)
from agent.fleetctl.results import CommandReply, DeployResult, Phase, Progress, Wave, describe, final_status
from agent.fleetctl.spec import (
    DeploySpec,
    Pipelines,
    build_document,
    check_document,
    check_spec,
    lifetime_s,
    load_spec,
)
from agent.fleetctl.status import DeviceStatus, device_status
from agent.fleetctl.targets import ResolvedTarget, Target
from agent.mqtt.router import REPLY_SUFFIX
from agent.mqtt.topics import GROUPS_LEVEL, command_topic, reported_topic, status_topic
from agent.registry.signing import key_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SETTLE_S = 0.25  # quiet time after the retained snapshot before a collect returns
_PROGRESS_EVERY_S = 1.0


class FleetClient(BrokerConnection):
    """The fleet controller over one MQTT 5 connection (module docstring). Use as a context manager."""

    # -- reading the fleet --------------------------------------------------------------------

    def _members(self, target: ResolvedTarget) -> list[str]:
        """The devices the target covers now (`ResolvedTarget.covers`)."""
        if target.kind == "device":
            return [target.name]
        reported, status, _ = self._snapshot()
        return sorted(d for d, p in reported.items() if target.covers(self._record(d, p, status.get(d))))

    def _state_filters(self, target: ResolvedTarget | None = None) -> list[str]:
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
        return self._current(ResolvedTarget.of(target, self._prefix), time.monotonic() + timeout_s)

    def _current(self, target: ResolvedTarget, deadline: float) -> dict[str, Any] | None:
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
        t = ResolvedTarget.of(target, self._prefix)
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
            result.status = final_status(wave)
            result.message = describe(result, wave)
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
                result.message = f"rollout stopped: {why}; {describe(result, result.waves[-1])}"
                return result
            if phase == "canary":
                rollout = {"phase": "all", "baseline": baseline}
                self._publish_document(
                    t, result.generation + 1, spec.pipelines, rollout, settings, sign_key, result
                )
        result.status = final_status(result.waves[-1])
        result.message = describe(result, result.waves[-1])
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
        t = ResolvedTarget.of(target, self._prefix)
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
        result.status = final_status(wave)
        result.message = describe(result, wave)
        return result

    def _roll_back(
        self,
        t: ResolvedTarget,
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
        t: ResolvedTarget,
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
        t: ResolvedTarget,
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
                    self._cond.wait(min(POLL_S, max(0.0, deadline - now)))
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
