"""A stage: everything a frame goes through after the source, built and warmed before it serves.

The model's session (and the decision that chose its backend), the feeder that turns frames into the
model's inputs, the postprocessor and the report rules, with the stage's own counters (the health
window judges a new version on them). A running pipeline (agent/pipeline.py) owns one stage at a
time and swaps in the next between two frames; `edge-agent infer` runs one frame through a stage.
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agent.config import PipelineConfig
from agent.errors import ModelError
from agent.processing import Geometry, build_postprocessor
from agent.processing.feed import Feeder, build_feeder
from agent.rules import ReportRules
from agent.status import Chosen, Serving, StageStatus
from providers import Decision, Session

log = logging.getLogger(__name__)

# How often a stage running on a fallback backend asks whether its better backend works again.
_RETRY_PREFERRED_EVERY_S = 30.0


class BackendSwitcher(Protocol):
    """What a stage asks of its backend choice (agent/backend_choice/ DecisionSwitcher): the
    decision it follows, other sessions for the same model when the current backend keeps failing,
    and the proof on a frame of a decision no sample proved yet."""

    @property
    def decision(self) -> Decision:
        """The decision the stage follows now (the proven one, once its session is swapped in)."""

    @property
    def wants_sample(self) -> bool:
        """Whether a frame's inputs would start a proof (offer_sample)."""

    def offer_sample(self, feeds: Mapping[str, np.ndarray], current: str) -> None:
        """Prove the candidates on these inputs, in the background (`current`: what serves now)."""

    def take_upgrade(self) -> Session | None:
        """A session on the candidate a proof chose, once loaded (the worker swaps it in)."""

    def join(self, timeout: float) -> None:
        """Wait (at most `timeout`) for a proof in the background."""

    def fallback(self, failed: str) -> Session | None:
        """Demote `failed`; load and return the next candidate (None when there is none)."""

    def retry_preferred(self, current: str) -> Session | None:
        """A better-ranked demoted backend that loads again (its backoff has passed), else None."""


class SecondModels(Protocol):
    """What a stage holds of its second models (agent/attribute_models.py AttributeSet, which builds on
    this module's LoadedModel): stages sharing them, the last one closes them."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def unhealthy(self, max_error_rate: float, min_reads: int) -> str | None:
        """Why they fail a health window (None: fine)."""
        ...


@dataclass
class LoadedModel:
    name: str
    version: str
    sha256: str
    session: Session
    decision: Decision | None = None  # how the backend was chosen (None: given, not selected)
    key: str = ""  # the decision's cache key (agent/backend_choice/): reselect-backend forgets it
    # Backend switches of this model's session ("a -> b: why", newest last): fallbacks and returns.
    switches: list[str] = field(default_factory=list, repr=False, compare=False)
    # Stages on this model (`Stage.with_config` shares it): the session closes with the last of them.
    _users: int = field(default=0, repr=False, compare=False)
    _users_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def acquire(self) -> None:
        with self._users_lock:
            self._users += 1

    def release(self) -> bool:
        """One stage less; True when it was the last (its caller closes the session)."""
        with self._users_lock:
            self._users -= 1
            return self._users <= 0


@dataclass
class FrameRun:
    """What one frame became in a stage: the model's inputs and outputs, the postprocessed output
    (a result's `output`), the time of each step, and how an image was fitted into the input."""

    feeds: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    output: dict[str, Any]
    preprocess_ms: float
    inference_ms: float
    postprocess_ms: float
    geometry: Geometry | None = None


class StageStats:
    """What one stage did since it was swapped in: the health window judges a new version on these."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.frames = 0  # frames it was given
        self.inferences = 0
        self.errors = 0
        self.nan_outputs = 0  # inferences whose outputs held NaN or infinity
        self.latency_sum_ms = 0.0
        self.recent_ms: collections.deque[float] = collections.deque(maxlen=200)  # the last inferences
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # wall clock (time.time()) of the last failed frame

    def mean_latency_ms(self) -> float | None:
        return self.latency_sum_ms / self.inferences if self.inferences else None

    def median_latency_ms(self) -> float | None:
        """Of the last inferences: a few slow frames (a busy box) do not move it, a slower model does."""
        return statistics.median(self.recent_ms) if self.recent_ms else None


class Stage:
    """Everything a frame goes through after the source: the model's session, the feeder that turns
    frames into its inputs, the postprocessor and the report rules. Built and warmed before it serves."""

    def __init__(
        self,
        config: PipelineConfig,
        model: LoadedModel,
        switcher: BackendSwitcher | None = None,
        feeder: Feeder | None = None,
        attributes: SecondModels | None = None,
    ):
        """`feeder`: one built already for this config and session (its warm-up inputs were needed
        first: the switcher's), else one is built. `attributes`: the second models of the config's
        `attributes:` (agent/attribute_models.py), shared with the stages `with_config` makes."""
        self.config = config
        self.model = model
        self.switcher = switcher
        self.attributes = attributes
        model.acquire()
        if attributes is not None:
            attributes.acquire()
        self._closed = False
        session = model.session
        self.feeder = feeder if feeder is not None else build_feeder(config, session.inputs, session.outputs)
        self.postprocess = build_postprocessor(config.postprocess, session.outputs)
        motion = config.motion_gate
        if motion is not None and motion.regions:  # (here, not in the steps: a swap builds those late)
            _check_regions(self.feeder)
        self.rules = ReportRules(config.report)
        self.stats = StageStats()
        # While on probation (a health window), outputs are checked for NaN and infinity each frame.
        self.watch_outputs = False
        self._next_preferred_retry = time.monotonic() + _RETRY_PREFERRED_EVERY_S

    @property
    def ref(self) -> str:
        return f"{self.model.name}@{self.model.version}"

    @property
    def chain(self) -> str:
        """The stage's models for people: `ref`, and its second models' (`det@4 (text: rec@2)`)."""
        second = [f"{a.name}: {a.model.name}@{a.model.version}" for a in self.config.attributes]
        return f"{self.ref} ({', '.join(second)})" if second else self.ref

    def decision(self) -> Decision | None:
        """The decision this stage follows now: its switcher's latest (after a proof on a frame),
        else the one it was built with (None: a session given, not chosen)."""
        return self.switcher.decision if self.switcher is not None else self.model.decision

    def serving(self) -> Serving:
        """What serves this stage now and why, read from the session it runs and the decision it
        follows (a switcher's latest: after a proof on a frame, or a fallback), never a copy made
        when the stage was built."""
        session = self.model.session
        decision = self.decision()
        if decision is None:  # a session given, not chosen (tests, tools)
            return Serving(session.backend, session.precision, None)
        why = decision.explain()
        if session.backend != decision.backend:
            why = f"running on {session.backend}, the fallback of the decision: {why}"
        chosen = Chosen(decision.artifact_on(session.backend), decision.checked)
        return Serving(session.backend, session.precision, why, chosen)

    def status(self) -> StageStatus:
        """What serves now, the last backend switches and what the report rules held back."""
        return StageStatus(
            self.ref, self.serving(), tuple(self.model.switches[-5:]), dict(self.rules.held_back)
        )

    @property
    def identity(self) -> dict[str, str]:
        """The model as a result names it."""
        return {"name": self.model.name, "version": self.model.version, "sha256": self.model.sha256}

    def warm_up(self) -> None:
        """Run the model once at its real input shape before it serves a live frame."""
        self.model.session.run(self.feeder.warm_up_feeds())

    # --- backend switching (the inference thread only: it is the session's one user) -------------

    def running_on(self) -> tuple[str, str]:
        """The backend and precision the model runs on now."""
        session = self.model.session
        return session.backend, session.precision

    def tend_backend(self) -> None:
        """Between two frames: take a session a proof on a frame chose, or go back to the preferred
        backend when it works again (at most every _RETRY_PREFERRED_EVERY_S)."""
        if self.switcher is None:
            return
        upgrade = self.switcher.take_upgrade()
        if upgrade is not None:
            self._switch(upgrade, "a frame from the source proved it the best candidate")
        if time.monotonic() < self._next_preferred_retry:
            return
        self._next_preferred_retry = time.monotonic() + _RETRY_PREFERRED_EVERY_S
        better = self.switcher.retry_preferred(self.model.session.backend)
        if better is not None:
            self._switch(better, "the preferred backend works again")

    def fall_back(self, why: str) -> None:
        """The backend keeps failing: serve on the next candidate, if there is one."""
        if self.switcher is None:
            return
        replacement = self.switcher.fallback(self.model.session.backend)
        if replacement is not None:
            self._switch(replacement, why, logging.WARNING)

    def _switch(self, session: Session, why: str, level: int = logging.INFO) -> None:
        """Serve on `session` from the next frame; logged at `level`: INFO for a better backend
        (proven on a frame, or the preferred one back), WARNING for a fallback from a failing one."""
        old = self.model.session
        self.model.session = session
        note = f"{old.backend} -> {session.backend}: {why}"
        self.model.switches.append(note)
        log.log(level, "pipeline %s: switched backend %s", self.config.name, note)
        old.close()

    def offer_sample(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Hand a frame's inputs to a switcher whose decision still needs proving (cheap otherwise)."""
        if self.switcher is not None and self.switcher.wants_sample:
            self.switcher.offer_sample(feeds, self.model.session.backend)

    def prepare(self, data: np.ndarray, gap: bool = False) -> tuple[dict[str, np.ndarray], Geometry | None]:
        """The model's inputs for one frame (an image, an audio window), and how an image was fitted."""
        return self.feeder.feeds(data, gap)

    def infer(
        self, feeds: Mapping[str, np.ndarray], offer: Callable[[Mapping[str, np.ndarray]], None] | None = None
    ) -> dict[str, np.ndarray]:
        """One run of the model; `offer` sees its inputs after the run (a switcher proving its decision
        on real frames), also when the run failed: a first choice that cannot run the model's real
        inputs is just what the proof must replace."""
        try:
            outputs = self.model.session.run(feeds)
        except Exception:
            if offer is not None:
                offer(feeds)
            raise
        # Counted as the model returns, before its outputs are looked at: postprocessing may refuse
        # NaN (the frame then fails), and a NaN inference is one of the inferences all the same.
        self.stats.inferences += 1
        if self.watch_outputs and not all(np.isfinite(v).all() for v in outputs.values()):
            self.stats.nan_outputs += 1
        if offer is not None:
            offer(feeds)
        self.feeder.seen(outputs)
        return outputs

    def run_frame(
        self,
        data: np.ndarray,
        gap: bool = False,
        offer: Callable[[Mapping[str, np.ndarray]], None] | None = None,
    ) -> FrameRun:
        """One frame through preprocess, the model and postprocess, one after the other (`edge-agent
        infer`); a running pipeline does the same three steps on three threads."""
        t0 = time.perf_counter()
        feeds, geometry = self.prepare(data, gap)
        t1 = time.perf_counter()
        outputs = self.infer(feeds, offer)
        t2 = time.perf_counter()
        output = self.postprocess(outputs, geometry)
        t3 = time.perf_counter()
        return FrameRun(
            feeds, outputs, output, (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000, geometry
        )

    def with_config(self, config: PipelineConfig) -> Stage:
        """A stage on this one's model and session, not reloaded, for a config that changes nothing
        the model sees (`changes_only_reporting`): new zones, lines, tracking or report rules apply
        between two frames. The session closes with the last stage on it."""
        return Stage(config, self.model, self.switcher, attributes=self.attributes)

    def with_attributes(self, config: PipelineConfig, attributes: SecondModels) -> Stage:
        """A stage on this one's model and session with new second models (`changes_only_attributes`):
        the primary model serves on untouched; a rollback goes back to this stage and its own."""
        return Stage(config, self.model, self.switcher, attributes=attributes)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.model.release():
            self.model.session.close()
        if self.attributes is not None:
            self.attributes.release()


def _check_regions(feeder: Feeder) -> None:
    """Motion regions cut a frame into crops of the model's input: a model on single images only (that
    the postprocess is a detection's, the config's validation says: agent/config/pipeline.py)."""
    if feeder.input_size is None or feeder.recurrent:
        raise ModelError(
            "motion.regions needs a model on single images (crops of a frame), not one with state"
        )


# Pipeline keys that need no new session: what is done with the model's outputs, and which frames
# reach it (the motion gate). A change to only these is taken by a stage on the same session.
REPORTING_KEYS = ("motion", "zones", "lines", "track", "filters", "report", "home_automation", "stall_s")


def changes_only_attributes(old: PipelineConfig, new: PipelineConfig) -> bool:
    """Whether `new` differs from `old` in its second models (`attributes:`) and at most what
    `changes_only_reporting` allows: the primary model's session can serve on."""
    return old.attributes != new.attributes and changes_only_reporting(
        old.model_copy(update={"attributes": new.attributes}), new
    )


def changes_only_reporting(old: PipelineConfig, new: PipelineConfig) -> bool:
    """Whether `new` differs from `old` only in what is done with the model's outputs (REPORTING_KEYS):
    same model, backend choice, source, preprocessing and postprocessing."""
    kept = old.model_copy(update={key: getattr(new, key) for key in REPORTING_KEYS})
    return kept == new
