"""One pipeline: source -> stage (preprocess -> inference -> postprocess -> report rules) -> sink.

The source decodes in its own thread into a newest-frame slot. Three threads here overlap the rest,
so that only inference sets the pace: one prepares frame N+1 (resize, normalise) while another runs
the model on frame N and a third postprocesses frame N-1, applies the report rules and hands its
`Result` to a `ResultSink` (the daemon's: agent/results.py, to the outbox). Between them are
one-place hand-overs, so a slow model still drops frames at the source instead of queueing them. A
recurrent model (state links) prepares each frame on the inference thread, after the run before it.
Pipelines know nothing about MQTT.

The source outlives the stage: a new model version (or a changed pipeline) is built and warmed as a
new `Stage` off the worker thread and swapped in between two frames (`swap_in`); the old stage stays
warm until the new one is committed, so a rollback is one more swap and the camera is never reopened.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from agent.clock import iso_utc
from agent.config import HealthWindowConfig, PipelineConfig
from agent.pipeline_tracking import PipelineTracking, TrackingSink, keeps_pixels
from agent.processing import Geometry, Postprocessor, Preprocessor
from agent.processing.feed import Feeder, ImageFeeder
from agent.results import Result
from agent.rules import ReportRules
from agent.sources import Frame, Slot, Source, open_source
from agent.stage import BackendSwitcher, LoadedModel, Stage, StageStats
from providers import BackendError, Session

log = logging.getLogger(__name__)

# How many failed frames in a row before the pipeline reports itself degraded.
_DEGRADED_AFTER_ERRORS = 10
# Backend failures in a row before the next candidate backend takes over.
_SWITCH_AFTER_ERRORS = 5
# How often a pipeline running on a fallback asks whether its better backend works again.
_RETRY_PREFERRED_EVERY_S = 30.0
_RECENT_FRAMES = 512  # inferences kept for the live rate and latency percentiles
_RATE_WINDOW_S = 10.0  # the live rate is over the last this many seconds
# How long a clean run clears the last error, when no health window is given (fleet.health's default).
_DEFAULT_HEALTH = HealthWindowConfig()


class ResultSink(TrackingSink, Protocol):
    """Where a pipeline's results and events go (the daemon's: agent/results.py ResultWriter, to the
    outbox); what tracking needs of it: agent/pipeline_tracking.py."""

    def submit(self, result: Result) -> None: ...


@dataclass
class _Job:
    """A frame on its way through the pipeline's threads."""

    frame: Frame
    stage: Stage | None = None  # the stage whose feeder prepared it (None: not prepared yet)
    feeds: dict[str, np.ndarray] | None = None
    geometry: Geometry | None = None
    preprocess_ms: float = 0.0
    error: Exception | None = None  # preparing it failed: counted when its turn comes


@dataclass
class _Inferred:
    """A frame the model ran on, waiting for postprocessing and its result."""

    job: _Job
    stage: Stage
    outputs: dict[str, np.ndarray]
    inference_ms: float
    backend: str  # as it was at the run: a backend switch may follow before the result is made
    precision: str


_NO_PIXELS = np.empty(0, np.uint8)  # a frame past inference: its pixels are not needed any more
_END = object()  # down the hand-overs after the last frame: the next thread finishes too


class Pipeline:
    def __init__(
        self,
        config: PipelineConfig,
        model: LoadedModel | Stage,
        sink: ResultSink,
        switcher: BackendSwitcher | None = None,
        source: tuple[Source, Slot] | None = None,
    ) -> None:
        """`model`: a loaded model (a stage is made of it) or a built stage; `source`: one already
        started (early, so nothing is lost while the stage was built), else the config's is opened."""
        self.stage = model if isinstance(model, Stage) else Stage(config, model, switcher)
        self.source_config = config.source
        self.backend_switches: list[str] = []  # "a -> b: why", newest last
        self._next_preferred_retry = time.monotonic() + _RETRY_PREFERRED_EVERY_S
        self.name = config.name
        self.sink = sink
        self.source, self.slot = source if source is not None else open_source(config.source, config.name)
        self._source_started = source is not None  # a source handed in is already started
        # Swapping stages (worker thread only swaps; others ask and wait).
        self._pending_stage: Stage | None = None
        self._previous_stage: Stage | None = None
        self._swapped = threading.Condition()
        self.stage_swaps = 0
        self.last_frame: Frame | None = None  # the newest frame processed: a sample for a new stage
        # prepare -> infer -> report, each on its own thread (see the module docstring). One place
        # between prepare and infer keeps the frame the model gets recent; two after infer let a slow
        # outbox write overlap the next run without queueing results in memory.
        self._prepared: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._inferred: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None  # the inference thread: it swaps stages
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.results = 0  # published (handed to the sink)
        self.inferences = 0  # frames the model ran on, published or held back by the report rules
        self.errors = 0
        self._errors_in_row = 0
        # The last failed frame: what went wrong, when (wall clock, for status; monotonic, to tell a
        # clean run since), through which model, and how many good frames there were then. It is
        # cleared once the pipeline has run a health window's length cleanly (`status`).
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_error_model: str | None = None
        self._last_error_mono = 0.0
        self._inferences_at_error = 0
        self._latency_sum_ms = 0.0
        # The last inferences: (when done, monotonic; inference ms; capture to result ms), for the
        # live rate and latency percentiles in the status.
        self._recent: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=_RECENT_FRAMES)
        # Tracking: the pipeline's, not a stage's, so a changed zone or a new model version keeps every
        # track. Used by the report thread only (and `stop` after it).
        self.tracking = PipelineTracking(self.name, sink)
        self._done = threading.Event()
        self._busy_since: float | None = None  # in a run of the model since
        self._reporting_since: float | None = None  # in postprocessing / handing over a result since

    # The current stage's parts, by the names the pipeline had before stages could be swapped.
    @property
    def config(self) -> PipelineConfig:
        return self.stage.config

    @property
    def model(self) -> LoadedModel:
        return self.stage.model

    @property
    def feeder(self) -> Feeder:
        return self.stage.feeder

    @property
    def postprocess(self) -> Postprocessor:
        return self.stage.postprocess

    @property
    def rules(self) -> ReportRules:
        return self.stage.rules

    @property
    def switcher(self) -> BackendSwitcher | None:
        return self.stage.switcher

    @switcher.setter
    def switcher(self, switcher: BackendSwitcher | None) -> None:
        self.stage.switcher = switcher

    @property
    def preprocess(self) -> Preprocessor | None:
        """The image preprocessing (None for audio pipelines)."""
        return self.feeder.preprocess if isinstance(self.feeder, ImageFeeder) else None

    def warm_up(self) -> None:
        """Run the model once at its real input shape before it serves a live frame."""
        self.stage.warm_up()

    def start(self) -> None:
        self.tracking.start(self.stage.config)
        self._thread = threading.Thread(target=self._infer_loop, name=f"pipeline-{self.name}", daemon=True)
        self._threads = [
            threading.Thread(target=self._prepare_loop, name=f"pipeline-{self.name}-prepare", daemon=True),
            self._thread,
            threading.Thread(target=self._report_loop, name=f"pipeline-{self.name}-report", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        if not self._source_started:
            self.source.start()

    # --- stage swaps (any thread asks; the worker swaps between two frames) -----------------------

    def swap_in(self, stage: Stage, timeout: float) -> bool:
        """Make `stage` the one frames go through, between two frames; the current one is kept (warm)
        as `previous_stage` until `commit` or `roll_back`. False if the worker did not swap in time
        (stopped, or stuck in a frame): then nothing changed."""
        with self._swapped:
            if self._thread is None or self.finished:
                return False
            self._pending_stage = stage
            self._swapped.wait_for(lambda: self._pending_stage is None, timeout)
            if self._pending_stage is stage:  # not taken in time: withdraw it
                self._pending_stage = None
            return self.stage is stage

    @property
    def previous_stage(self) -> Stage | None:
        return self._previous_stage

    def keep_previous(self, stage: Stage) -> None:
        """A new pipeline replacing one on another source keeps the old one's stage warm (rollback)."""
        self._previous_stage = stage

    def commit(self) -> None:
        """The new stage proved itself: close the previous one."""
        previous, self._previous_stage = self._previous_stage, None
        if previous is not None and previous is not self.stage:
            previous.close()

    def roll_back(self, timeout: float) -> bool:
        """Swap the previous stage back in and close the failed one; False when there is none or the
        worker did not swap in time."""
        previous, failed = self._previous_stage, self.stage
        if previous is None or not self.swap_in(previous, timeout):
            return False
        self._previous_stage = None
        failed.close()
        return True

    def _take_pending_stage(self) -> None:
        with self._swapped:
            stage = self._pending_stage
            if stage is None:
                return
            old, self.stage = self.stage, stage
            unproven = None
            if stage is self._previous_stage:
                pass  # a roll_back: it closes the failed one itself
            elif self._previous_stage is not None:
                unproven = old  # never committed: the last good stays the one to go back to
            else:
                self._previous_stage = old
            self._pending_stage = None
            stage.stats = StageStats()
            self.stage_swaps += 1
            self._swapped.notify_all()
        if unproven is not None:
            unproven.close()
        log.info(
            "pipeline %s: now on %s (%s), was %s", self.name, stage.ref, stage.model.session.backend, old.ref
        )

    def request_stop(self) -> None:
        """Ask the source to end; the worker finishes the frame in flight and exits."""
        self.source.request_stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the source, finish the frame in flight, end the open tracks, then return (waits at most
        ~timeout)."""
        deadline = time.monotonic() + timeout
        self.source.stop(timeout)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(t.is_alive() for t in self._threads):
            self.tracking.stop(time.time())

    def busy_for_s(self) -> float:
        """How long the pipeline has been in one model run or one result (0 when idle): a stuck driver,
        or an outbox that cannot write, shows here."""
        started = [t for t in (self._busy_since, self._reporting_since) if t is not None]
        return time.monotonic() - min(started) if started else 0.0

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def status(self, health: HealthWindowConfig | None = None) -> dict[str, Any]:
        """Counters, rates and state. `health`: the window a clean run must last for the last error
        to be cleared (window_s without a failed frame and min_frames good ones since); None: the
        default health window (fleet.health's defaults)."""
        stage = self.stage  # once: a swap between two reads would pair one version with another's backend
        with self._lock:
            self._clear_resolved_error(health or _DEFAULT_HEALTH)
            results, errors, last_error = self.results, self.errors, self.last_error
            last_error_at, last_error_model = self.last_error_at, self.last_error_model
            inferences, held_back = self.inferences, dict(self.rules.held_back)
            mean_latency = self._latency_sum_ms / inferences if inferences else None
            degraded = self._errors_in_row >= _DEGRADED_AFTER_ERRORS
            recent = list(self._recent)
        source = self.source.stats()
        if self.finished:
            state = "finished" if source["state"] == "finished" else "stopped"
        elif degraded:
            state = "degraded"
        elif source["state"] == "retrying":
            state = "source-unavailable"
        else:
            state = "running"
        return {
            "state": state,
            "error": last_error if degraded else source["error"],
            "model": stage.ref,
            **stage.serving(),
            "stage_swaps": self.stage_swaps,
            "backend_switches": list(self.backend_switches[-5:]),
            "results": results,
            "inferences": inferences,
            "held_back": held_back,
            "errors": errors,
            "last_error": last_error,
            "last_error_at": None if last_error_at is None else iso_utc(last_error_at),
            "last_error_model": last_error_model,
            "mean_inference_ms": round(mean_latency, 3) if mean_latency is not None else None,
            **_live_rates(recent, time.monotonic()),
            "source": source,
            **({"tracking": summary} if (summary := self.tracking.summary) is not None else {}),
        }

    def _clear_resolved_error(self, health: HealthWindowConfig) -> None:
        """Forget the last error once the pipeline ran cleanly for the health window since it: no
        failed frame for window_s and at least min_frames good ones (holds the lock). A pipeline
        that gets no frames keeps it: nothing proved the problem gone."""
        if self.last_error is None:
            return
        clean_s = time.monotonic() - self._last_error_mono
        if clean_s >= health.window_s and self.inferences - self._inferences_at_error >= health.min_frames:
            log.info(
                "pipeline %s: clean for %.0f s since its last error (%s); cleared",
                self.name,
                clean_s,
                self.last_error,
            )
            self.last_error = self.last_error_at = self.last_error_model = None

    # --- the three threads ------------------------------------------------------------

    def _hand_over(self, to: queue.Queue[Any], item: Any, taker: threading.Thread | None) -> bool:
        """Put `item` in the next thread's hand-over, waiting for room; False when that thread is gone
        (it failed: nothing would ever take it)."""
        while True:
            try:
                to.put(item, timeout=0.5)
                return True
            except queue.Full:
                if taker is not None and not taker.is_alive():
                    return False

    def _prepare_loop(self) -> None:
        try:
            while True:
                frame = self.slot.get(timeout=0.5)
                if frame is None:
                    if self.slot.closed:
                        return  # source ended or stopped
                    continue
                job = _Job(frame)
                stage = self.stage
                if not stage.feeder.recurrent and self._pending_stage is None:
                    self._prepare(job, stage)
                if not self._hand_over(self._prepared, job, self._thread):
                    return
        finally:
            self._hand_over(self._prepared, _END, self._thread)

    def _prepare(self, job: _Job, stage: Stage) -> None:
        t0 = time.perf_counter()
        job.stage, job.feeds, job.error = stage, None, None
        try:
            job.feeds, job.geometry = stage.prepare(job.frame.data, job.frame.gap)
        except Exception as exc:  # counted when the inference thread gets to the frame
            job.error = exc
        job.preprocess_ms = (time.perf_counter() - t0) * 1000

    def _infer_loop(self) -> None:
        report = self._threads[-1] if self._threads else None
        try:
            while True:
                try:
                    job = self._prepared.get(timeout=0.5)
                except queue.Empty:
                    job = None
                self._take_pending_stage()
                self._maybe_return_to_preferred()
                self._maybe_take_upgrade()
                if job is _END:
                    return  # the last frame is done
                if job is not None:
                    inferred = self._infer(job)
                    if inferred is not None and not self._hand_over(self._inferred, inferred, report):
                        return
        finally:
            self._hand_over(self._inferred, _END, report)

    def _infer(self, job: _Job) -> _Inferred | None:
        self._busy_since = time.monotonic()
        self.last_frame = job.frame
        stage = self.stage
        stage.stats.frames += 1
        try:
            if job.stage is not stage:  # not prepared yet (recurrent), or for a stage swapped out since
                self._prepare(job, stage)
            if job.error is not None:
                raise job.error
            assert job.feeds is not None
            t0 = time.perf_counter()
            outputs = stage.infer(job.feeds, offer=self._offer_sample)
            inference_ms = (time.perf_counter() - t0) * 1000
        except Exception as exc:  # one bad frame must not stop the pipeline
            self._failed(job.frame, "inference failed", exc, stage)
            if isinstance(exc, BackendError) and self._errors_in_row >= _SWITCH_AFTER_ERRORS:
                self._switch_to_fallback(str(exc))
            return None
        finally:
            self._busy_since = None
        with self._lock:  # the stage's latencies, of every inference it counted (Stage.infer)
            stage.stats.latency_sum_ms += inference_ms
            stage.stats.recent_ms.append(inference_ms)
        session = stage.model.session
        # The report needs the frame's number and times, not its pixels or the model's inputs: up to
        # three frames wait for it, and their memory goes back to the source now (last_frame keeps one).
        # Snapshots need the pixels: the report takes its pictures from them.
        keep = keeps_pixels(stage.config)
        job.frame, job.feeds = (job.frame if keep else replace(job.frame, data=_NO_PIXELS)), None
        return _Inferred(job, stage, outputs, inference_ms, session.backend, session.precision)

    def _report_loop(self) -> None:
        try:
            while True:
                try:
                    item = self._inferred.get(timeout=0.5)
                except queue.Empty:
                    if self._thread is not None and not self._thread.is_alive() and self._inferred.empty():
                        return  # the inference thread failed without a word
                    continue
                if item is _END:
                    return
                self._reporting_since = time.monotonic()
                try:
                    self._report(item)
                finally:
                    self._reporting_since = None
        finally:
            self._done.set()
            with self._swapped:
                self._swapped.notify_all()

    # --- backend switching (worker thread only: it is the session's one user) ----------------

    def _swap(self, session: Session, why: str, level: int = logging.INFO) -> None:
        """Serve on `session` from the next frame; logged at `level`: INFO for a better backend
        (proven on a frame, or the preferred one back), WARNING for a fallback from a failing one."""
        old = self.model.session
        self.model.session = session
        note = f"{old.backend} -> {session.backend}: {why}"
        self.backend_switches.append(note)
        with self._lock:
            self._errors_in_row = 0
        log.log(level, "pipeline %s: switched backend %s", self.name, note)
        old.close()

    def _switch_to_fallback(self, error: str) -> None:
        if self.switcher is None:
            return
        replacement = self.switcher.fallback(self.model.session.backend)
        if replacement is not None:
            self._swap(replacement, f"{_SWITCH_AFTER_ERRORS} failures in a row ({error})", logging.WARNING)

    def _maybe_return_to_preferred(self) -> None:
        if self.switcher is None or time.monotonic() < self._next_preferred_retry:
            return
        self._next_preferred_retry = time.monotonic() + _RETRY_PREFERRED_EVERY_S
        better = self.switcher.retry_preferred(self.model.session.backend)
        if better is not None:
            self._swap(better, "the preferred backend works again")

    def _offer_sample(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Hand a frame's inputs to a switcher whose decision still needs proving (cheap otherwise)."""
        if self.switcher is not None and self.switcher.wants_sample:
            self.switcher.offer_sample(feeds, self.model.session.backend)

    def _maybe_take_upgrade(self) -> None:
        session = self.switcher.take_upgrade() if self.switcher is not None else None
        if session is not None:
            self._swap(session, "a frame from the source proved it the best candidate")

    def _failed(self, frame: Frame, what: str, exc: Exception, stage: Stage) -> None:
        """Count a failed frame (against the stage it went through); log the first failure and every
        100th (not a line per frame)."""
        with self._lock:
            self.errors += 1
            self._errors_in_row += 1
            self.last_error = f"{what}: {exc}"
            self.last_error_at, self._last_error_mono = time.time(), time.monotonic()
            self.last_error_model = stage.ref
            self._inferences_at_error = self.inferences
            errors = self.errors
            stage.stats.errors += 1
            stage.stats.last_error = self.last_error
            stage.stats.last_error_at = self.last_error_at
        if errors == 1 or errors % 100 == 0:
            log.error(
                "pipeline %s: frame %d: %s (%d failed frames so far): %s",
                self.name,
                frame.index,
                what,
                errors,
                exc,
            )

    def _report(self, item: _Inferred) -> None:
        """Postprocess, judge by the report rules and hand the result to the sink (report thread)."""
        job, stage, frame = item.job, item.stage, item.job.frame
        t0 = time.perf_counter()
        try:
            output = stage.postprocess(item.outputs, job.geometry)
        except Exception as exc:  # one bad frame must not stop the pipeline
            self._failed(frame, "inference failed", exc, stage)
            return
        try:
            events = self.tracking.frame(stage.config, output, frame, job.geometry)
        except Exception as exc:  # a tracking bug costs the frame's events, not the pipeline
            self._failed(frame, "tracking failed", exc, stage)
            events = []
        postprocess_ms = (time.perf_counter() - t0) * 1000
        inference_ms = item.inference_ms
        capture_to_result_ms = (time.time() - frame.captured_at) * 1000
        with self._lock:
            self._recent.append((time.monotonic(), inference_ms, capture_to_result_ms))
            self.inferences += 1
            self._latency_sum_ms += inference_ms
            publish = stage.config.report.results and stage.rules.check(output, frame.captured_at) is None
            if not publish and not events:
                self._errors_in_row = 0  # a good frame, only not worth publishing (counted by its rule)
                return
            held_back = stage.rules.take_held_count() if publish else 0
        model = stage.model
        result = Result(
            pipeline=self.name,
            captured_at=frame.captured_at,
            model={"name": model.name, "version": model.version, "sha256": model.sha256},
            backend=item.backend,
            precision=item.precision,
            latency_ms={
                "preprocess": round(job.preprocess_ms, 3),
                "inference": round(inference_ms, 3),
                "postprocess": round(postprocess_ms, 3),
                "capture_to_result": round(capture_to_result_ms, 3),
            },
            source={
                "uri": self.source.display_uri,
                "frame": frame.index,
                "position_s": None if frame.position_s is None else round(frame.position_s, 3),
                "frames_dropped": self.slot.dropped,
                "outages": self.source.outages,
                "last_outage_s": self.source.last_outage_s,
            },
            output=output,
            held_back=held_back,
            events=events,
            publish=publish,
            scene=self.tracking.summary if events else None,
        )
        try:
            self.sink.submit(result)
        except Exception as exc:  # e.g. the outbox's disk is full: count it, keep the pipeline alive
            self._failed(frame, "cannot store the result", exc, stage)
            return
        with self._lock:
            self.results += 1 if publish else 0
            self._errors_in_row = 0


def _live_rates(recent: list[tuple[float, float, float]], now: float) -> dict[str, Any]:
    """`fps` over the last _RATE_WINDOW_S and latency percentiles over the last inferences (at most
    _RECENT_FRAMES): what `edge-agent status` shows. None where there is nothing to measure yet."""
    in_window = [r for r in recent if now - r[0] <= _RATE_WINDOW_S]
    fps: float | None = None
    if in_window:
        # Over the whole window, unless every frame we know of is in it (a start, a fast
        # pipeline filling the record): then over the time they cover.
        covered = _RATE_WINDOW_S if len(in_window) < len(recent) else now - recent[0][0]
        fps = round(len(in_window) / max(covered, 1.0), 2)  # (one frame alone: not 1000 fps)
    elif recent:
        fps = 0.0  # frames once, none lately

    def percentiles(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        p50, p95 = np.percentile(values, [50, 95])
        return {"p50": round(float(p50), 3), "p95": round(float(p95), 3)}

    return {
        "fps": fps,
        "latency_ms": {
            "inference": percentiles([r[1] for r in recent]),
            "capture_to_result": percentiles([r[2] for r in recent]),
        },
    }
