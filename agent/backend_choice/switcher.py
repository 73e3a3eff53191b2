"""Runtime fallback along a decision's order while serving, and the proof of an unchecked decision
on a live frame (`DecisionSwitcher`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from agent.retry import backoff_delay
from providers import Backend, Decision, ModelArtifact, SelectionPolicy, Session, all_backends
from providers.select import CandidateReport, serving_options

log = logging.getLogger(__package__)  # the package's logger, as before it was split


Prover = Callable[[Mapping[str, np.ndarray]], Decision]


class DecisionSwitcher:
    """Runtime fallback along a decision's order (agent.stage.BackendSwitcher).

    A backend that keeps failing while serving (an accelerator unplugged, a driver error) is
    demoted and the next usable candidate takes over; the demoted one is retried later with
    backoff and taken back once it loads and runs again.
    """

    def __init__(
        self,
        decision: Decision,
        artifacts: Sequence[ModelArtifact],
        policy: SelectionPolicy,
        warm_up: Mapping[str, np.ndarray] | None = None,
        backends: Sequence[Backend] | None = None,
        retry_first_s: float = 60.0,
        retry_max_s: float = 3600.0,
        prove: Prover | None = None,
    ) -> None:
        self.decision = decision
        self.order = decision.order()
        self.artifacts = {a.sha256: a for a in artifacts}
        self.policy = policy
        self.warm_up_feeds = warm_up  # the pipeline's inputs for a first run (shapes, constants, state)
        self.backends = {b.name: b for b in (backends if backends is not None else all_backends())}
        self.retry_first_s, self.retry_max_s = retry_first_s, retry_max_s
        self._demoted: dict[str, tuple[int, float]] = {}  # backend -> (failures, retry at)
        # An unchecked decision (no sample at build time) is proven on the first frame offered.
        self._prove = prove
        self._proving = False
        self._upgrade: tuple[Session, Decision] | None = None
        self._upgrade_lock = threading.Lock()
        self._prover_thread: threading.Thread | None = None

    # --- proving an unchecked decision on a frame (agent.pipeline.Pipeline offers them) -----------

    @property
    def wants_sample(self) -> bool:
        return self._prove is not None and not self._proving

    def offer_sample(self, feeds: Mapping[str, np.ndarray], current: str) -> None:
        """Start proving the candidates on these inputs, in the background (trials take seconds)."""
        if not self.wants_sample:
            return
        self._proving = True
        copied = {name: np.array(value, copy=True) for name, value in feeds.items()}
        self._prover_thread = threading.Thread(
            target=self._prove_on, args=(copied, current), name="prove-backend", daemon=True
        )
        self._prover_thread.start()

    def join(self, timeout: float) -> None:
        """Wait (at most `timeout`) for a proof in the background: a runtime still loading a session
        when the process exits aborts it (its native threads are torn down under it)."""
        thread = self._prover_thread
        if thread is not None:
            thread.join(timeout)

    def _prove_on(self, feeds: Mapping[str, np.ndarray], current: str) -> None:
        assert self._prove is not None
        try:
            decision = self._prove(feeds)
        except Exception as exc:  # selection errors, a runtime's own: keep serving as we are
            log.warning("could not prove the candidates on a frame: %s; staying on %s", exc, current)
            self._prove = None
            return
        self._prove = None
        log.info("proved on a frame: %s", decision.explain())
        if decision.backend == current and decision.artifact_sha256 == self.decision.artifact_sha256:
            self.decision, self.order = decision, decision.order()
            return
        if self.warm_up_feeds is None:
            self.warm_up_feeds = feeds  # inputs the pipeline really makes
        session = self._load_report(decision.order()[0])
        if session is None:  # the proven one does not load here: serve on, along the proven order
            self.decision, self.order = decision, decision.order()
            return
        # The decision changes with the session it names, when the worker swaps it in: until then
        # what is shown (Stage.serving) is the decision the running session follows.
        with self._upgrade_lock:
            self._upgrade = (session, decision)

    def take_upgrade(self) -> Session | None:
        """A session on the candidate a frame proved, once it is loaded (the worker swaps it in)."""
        with self._upgrade_lock:
            upgrade, self._upgrade = self._upgrade, None
        if upgrade is None:
            return None
        session, decision = upgrade
        self.decision, self.order = decision, decision.order()
        return session

    def _load_report(self, report: CandidateReport) -> Session | None:
        backend, artifact = self.backends.get(report.backend), self.artifacts.get(report.sha256)
        if backend is None or artifact is None:
            return None
        try:
            session = backend.load(artifact, serving_options(self.policy, report))
            if self.warm_up_feeds is not None:
                session.run(self.warm_up_feeds)
            else:
                session.warm_up()
            return session
        except Exception as exc:  # a runtime's own errors too: this is a probe of health
            self._demote(report.backend)
            log.warning("backend %s still unusable: %s", report.backend, exc)
            return None

    def _demote(self, name: str) -> None:
        failures = self._demoted.get(name, (0, 0.0))[0] + 1
        delay = backoff_delay(failures, self.retry_first_s, self.retry_max_s)
        self._demoted[name] = (failures, time.monotonic() + delay)

    @staticmethod
    def _index(name: str, order: Sequence[CandidateReport]) -> int:
        return next((i for i, c in enumerate(order) if c.backend == name), len(order))

    # The worker asks these while a proof in the background may replace `order`: each walks the
    # order it started with.

    def fallback(self, failed: str) -> Session | None:
        self._demote(failed)
        for report in list(self.order):
            if report.backend in self._demoted:
                continue
            session = self._load_report(report)
            if session is not None:
                return session
        return None

    def retry_preferred(self, current: str) -> Session | None:
        now = time.monotonic()
        order = list(self.order)
        for report in order[: self._index(current, order)]:
            name = report.backend
            if name in self._demoted and self._demoted[name][1] > now:
                continue
            session = self._load_report(report)
            if session is not None:
                self._demoted.pop(name, None)
                return session
        return None
