"""What the daemon's main loop ticks, besides the parts that tick themselves (the supervisor, the
self-updater, the reconciler's reported state): agent/daemon.py builds the list of `Tickable`s once
and ticks it in order every half second.

- `Every`: an action every n seconds (status.json, telemetry), the interval read on every tick so a
  reload that changes it counts from then;
- `Contained`: a part whose failing tick is logged, never raised (the state topics);
- `StateChanges`: a pipeline's new state, or a new step while it is built, goes out in the MQTT
  status at once;
- `OutageSummary`: when the broker is back after the outbox dropped results, one line says what the
  outage cost, per pipeline;
- `Watchdog`: systemd's watchdog pinged while everything makes progress (a hung pipeline or MQTT
  thread stops the pings: systemd then restarts the daemon).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from agent.mqtt import MqttConnection, Outbox
from agent.sd_notify import notify, watchdog_interval_s
from agent.status import Phase, PipelineStatus, RunState

log = logging.getLogger("agent.daemon")  # the daemon's logger: these were its methods


class Tickable(Protocol):
    """Ticked by the daemon's main loop, on its thread, every half second."""

    def tick(self) -> None: ...


class Every:
    """Calls `action` every `interval_s()` seconds (0: never). `at_start`: the first call on the first
    tick, else one interval after it; a changed interval (a reload) counts from the tick that sees it."""

    def __init__(
        self, interval_s: Callable[[], float], action: Callable[[], object], at_start: bool = False
    ) -> None:
        self._interval_s = interval_s
        self._action = action
        self._at_start = at_start
        self._every = 0.0
        self._next: float | None = None  # monotonic; None: not ticked yet

    def tick(self) -> None:
        now = time.monotonic()
        every = self._interval_s()
        if self._next is None:
            self._every, self._next = every, now if self._at_start else now + every
        elif every != self._every:
            self._every, self._next = every, now + every
        if every and now >= self._next:
            self._action()
            self._next = now + every


class Contained:
    """A part whose tick must never take the daemon down: a failure is logged (`what`: tick failed)."""

    def __init__(self, part: Tickable, what: str) -> None:
        self._part = part
        self._what = what

    def tick(self) -> None:
        try:
            self._part.tick()
        except Exception:
            log.exception("%s: tick failed", self._what)


class StateChanges:
    """A pipeline's new state, or a new step while it is built, goes out in the MQTT status (`publish`)
    and in systemd's STATUS (`summary`)."""

    def __init__(
        self,
        states: Callable[[], Mapping[str, PipelineStatus]],
        summary: Callable[[], str],
        publish: Callable[[], object],
    ) -> None:
        self._states = states
        self._summary = summary
        self._publish = publish
        self._last: dict[str, tuple[RunState, Phase, str]] = {}

    def tick(self) -> None:
        states = {name: (s.state, s.phase, _step(s)) for name, s in self._states().items()}
        if states != self._last:
            self._last = states
            notify(f"STATUS={self._summary()}")
            self._publish()


def _step(status: PipelineStatus) -> str:
    """What an in-flight phase does now (its text: not how long it has taken)."""
    return "" if status.change.step is None else status.change.step.text


class OutageSummary:
    """When the link comes back after drops, one line says what the outage cost, per pipeline."""

    def __init__(self, mqtt: MqttConnection, outbox: Outbox, when_full: Callable[[], str]) -> None:
        self._mqtt = mqtt
        self._outbox = outbox
        self._when_full = when_full
        self._mark: tuple[int, dict[str, int]] = (0, outbox.dropped_by_stream())

    def tick(self) -> None:
        connects = int(self._mqtt.stats()["connects"])
        if connects == self._mark[0]:
            return
        dropped = self._outbox.dropped_by_stream()
        before = self._mark[1]
        lost = {s: n - before.get(s, 0) for s, n in dropped.items() if n > before.get(s, 0)}
        if lost:
            log.warning(
                "broker reachable again; while it was away the outbox (when_full: %s) dropped %d "
                "result(s): %s",
                self._when_full(),
                sum(lost.values()),
                ", ".join(f"{s.removeprefix('results/')}: {n}" for s, n in sorted(lost.items())),
            )
        self._mark = (connects, dropped)


class Watchdog:
    """Pings systemd's watchdog while `stall()` is None; what stops the pings (a hung pipeline or MQTT
    thread: systemd then restarts the daemon) is logged when it starts and when it clears, and kept
    in `stall` (the status shows it)."""

    def __init__(self, stall: Callable[[], str | None]) -> None:
        self._stall_of = stall
        self.interval_s = watchdog_interval_s()  # None: not under systemd's watchdog
        self.stall: str | None = None  # why the pings stopped (None: they go on)

    def tick(self) -> None:
        stall = self._stall_of()
        if stall != self.stall:
            if stall is not None:
                log.error("%s: watchdog pings stopped (under systemd the daemon is restarted)", stall)
            else:
                log.warning("progress again (%s): watchdog pings resumed", self.stall)
            self.stall = stall
        if self.interval_s is not None and stall is None:
            notify("WATCHDOG=1")
