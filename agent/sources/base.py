"""What every source has in common: its state and error, reconnects and outages, the stats the
pipeline status shows, and (for sources with a reader thread of their own) start and stop."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod

from agent.sources.frames import FrameQueue, LatestFrameSlot
from agent.status import SourceCounters, SourceState, SourceStatus
from agent.threads import named_thread


class SourceBase:
    """State: starting | streaming | retrying | finished | stopped. Once stopped, a source stays so.

    An outage starts when the source goes to retrying and is counted, with how long it lasted, when
    it streams again.
    """

    kind: str

    def __init__(self, name: str, slot: LatestFrameSlot | FrameQueue, display_uri: str) -> None:
        self.name = name
        self.slot = slot
        self.display_uri = display_uri
        self._lock = threading.Lock()
        self.state: SourceState = "starting"
        self.error: str | None = None
        self.reconnects = 0
        self.outages = 0  # times it streamed again after being unavailable
        self.last_outage_s: float | None = None  # how long the last one lasted
        self.outage_started: float | None = None  # time.time() when the current outage began
        # Logged under the concrete source's module (agent.sources.video, ...), as before.
        self._log = logging.getLogger(type(self).__module__)

    def stats(self) -> SourceStatus:
        with self._lock:
            return SourceStatus(
                self.display_uri,
                self.state,
                self.error,
                self._counters(),
                frames_dropped=self.slot.dropped,
                queued=len(self.slot),
                reconnects=self.reconnects,
                outages=self.outages,
                last_outage_s=self.last_outage_s,
            )

    def _counters(self) -> SourceCounters:
        """The source's own counters for `stats` (called holding the lock)."""
        return SourceCounters()

    def _set_state(self, state: SourceState, error: str | None = None) -> None:
        with self._lock:
            if self.state == "stopped" and state != "stopped":
                return
            if state == "retrying" and self.outage_started is None:
                self.outage_started = time.time()
            if state == "streaming" and self.outage_started is not None:
                self.outages += 1
                self.last_outage_s = round(time.time() - self.outage_started, 3)
                self.outage_started = None
                self._log.info("source %s: streaming again after %.1f s", self.name, self.last_outage_s)
            self.state, self.error = state, error

    def _fail(self, message: str) -> None:
        """The source is unavailable: say why (logged once per new reason) and retry."""
        if self.error != message:
            self._log.warning("source %s: %s; retrying with backoff", self.name, message)
        self._set_state("retrying", message)

    def _count_reconnect(self) -> None:
        with self._lock:
            self.reconnects += 1


class ThreadedSource(SourceBase, ABC):
    """A source read by a thread of its own (`_run`), which ends when asked to stop."""

    def __init__(self, name: str, slot: LatestFrameSlot | FrameQueue, display_uri: str) -> None:
        super().__init__(name, slot, display_uri)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # (named for the system too: its decoder's threads carry the name, agent/threads.py)
        self._thread = named_thread(self._run, f"source-{self.name}")
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the reader thread to end, without waiting for it."""
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.slot.close()

    @abstractmethod
    def _run(self) -> None: ...
