"""One pipeline: a source, and the steps each of its frames walks (agent/steps/), on three threads.

The source decodes in its own thread into a newest-frame slot. Three threads here overlap the steps,
so that only inference sets the pace: the prepare thread runs the steps ahead of the model on frame
N+1 (resize, normalise) while the inference thread runs the model on frame N and the report thread
runs the steps after it on frame N-1 (postprocess, tracking, report rules, the result to the sink).
Between them are one-place hand-overs, so a slow model still drops frames at the source instead of
queueing them. Each frame is one `FrameRecord`, pixels included while a step needs them: a result's
snapshot or image is always its own frame. Pipelines know nothing about MQTT.

The source outlives the stage (agent/stage.py): a new model version (or a changed pipeline) is built
and warmed as a new `Stage` off the worker thread and swapped in between two frames (`swap_in`); the
old stage stays warm until the new one is committed, so a rollback is one more swap and the camera is
never reopened.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.config import HealthWindowConfig, PipelineConfig
from agent.filter_counts import Drops
from agent.live_view import LiveView
from agent.pipeline_attributes import PipelineAttributes
from agent.pipeline_stats import PipelineStats
from agent.pipeline_tracking import PipelineTracking
from agent.side_by_side import SideBySide
from agent.sources import Frame, Slot, Source, open_source
from agent.stage import BackendSwitcher, LoadedModel, Stage
from agent.stage_swap import StageSwap
from agent.status import RunStatus, run_status
from agent.steps import FrameRecord, PipelineMotion, PipelineParts, Plan, ResultSink, Thread, plan_for
from agent.threads import named_thread

log = logging.getLogger(__name__)

# How long a clean run clears the last error, when no health window is given (fleet.health's default).
_DEFAULT_HEALTH = HealthWindowConfig()
_END = object()  # down the hand-overs after the last frame: the next thread finishes too


@dataclass
class _Job:
    """A frame on its way through the pipeline's threads."""

    record: FrameRecord
    frame: Frame | None  # the source's frame, until the model ran (a sample for a new stage)
    plan: Plan | None = None  # the plan whose prepare-thread steps ran on it (None: not yet)
    failure: str | None = None  # a step failed: `<step> failed: <error>`, counted at its turn
    ended: bool = False  # a gate before the model ended it (no motion): nothing more to do


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
        self.name = config.name
        self.sink = sink
        self.source, self.slot = source if source is not None else open_source(config.source, config.name)
        self._source_started = source is not None  # a source handed in is already started
        self.source_config = config.source
        # Tracking is the pipeline's, not a stage's: a changed zone or a new model version keeps tracks.
        self.tracking = PipelineTracking(self.name, sink)
        self.motion = PipelineMotion()  # the motion gate's background too: a new version keeps it
        self.drops = Drops()  # what the object filters dropped: counted on by a new version
        self.readings = PipelineAttributes()  # which object a second model read when: kept by a new stage
        self.live_view = LiveView(self.name)  # its latest drawn frame while watched (agent/live_view.py)
        self.stats = PipelineStats(self.name)
        self.kept = PipelineParts(
            sink, self._source_info, self.tracking, self.motion, self.drops, self.readings, self.live_view
        )  # what every stage's steps share (agent/steps: plan_for)
        first = model if isinstance(model, Stage) else Stage(config, model, switcher)
        self.stages = StageSwap(self.name, self._plan_of(first), self._plan_of)
        # During a health window: the previous stage beside the current one (agent/side_by_side.py).
        self.side_by_side: SideBySide | None = None
        self._beside: tuple[SideBySide, np.ndarray, bool] | None = None
        self.last_frame: Frame | None = None  # the newest frame the model ran on: a sample for a new stage
        # One place between prepare and infer keeps the frame the model gets recent; two after infer
        # let a slow outbox write overlap the next run without queueing results in memory.
        self._prepared: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._inferred: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None  # the inference thread: it swaps stages
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()
        self._busy_since: float | None = None  # in a run of the model since
        self._reporting_since: float | None = None  # in the report thread's steps since

    @property
    def stage(self) -> Stage:
        return self.stages.plan.stage

    @property
    def config(self) -> PipelineConfig:
        return self.stage.config

    def _plan_of(self, stage: Stage) -> Plan:
        return plan_for(stage, self.kept)

    def _source_info(self) -> dict[str, Any]:
        return {
            "uri": self.source.display_uri,
            "frames_dropped": self.slot.dropped,
            "outages": self.source.outages,
            "last_outage_s": self.source.last_outage_s,
        }

    def warm_up(self) -> None:
        """Run the model once at its real input shape before it serves a live frame."""
        self.stage.warm_up()

    def start(self) -> None:
        self.tracking.start(self.stage.config)
        self._thread = named_thread(self._infer_loop, f"pipeline-{self.name}")
        self._threads = [
            named_thread(self._prepare_loop, f"pipeline-{self.name}-prepare"),
            self._thread,
            named_thread(self._report_loop, f"pipeline-{self.name}-report"),
        ]
        self.stages.open(True)
        for thread in self._threads:
            thread.start()
        if not self._source_started:
            self.source.start()

    def compare_with(self, previous: Stage | None) -> SideBySide | None:
        """During a health window, run `previous` beside the current stage on a share of the same
        frames (agent/side_by_side.py); None ends it. None returned where there is nothing to compare
        (no previous stage, or one on the same session)."""
        side = None
        if previous is not None and previous.model.session is not self.stage.model.session:
            side = SideBySide(previous, self.stage)
        self.side_by_side = side
        return side

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
        self.live_view.close(max(0.0, deadline - time.monotonic()))

    def busy_for_s(self) -> float:
        """How long the pipeline has been in one model run or one result (0 when idle): a stuck driver,
        or an outbox that cannot write, shows here."""
        started = [t for t in (self._busy_since, self._reporting_since) if t is not None]
        return time.monotonic() - min(started) if started else 0.0

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def status(self, health: HealthWindowConfig | None = None) -> RunStatus:
        """Counters, rates and state. `health`: the window a clean run must last for the last error
        to be cleared; None: the default health window (fleet.health's defaults)."""
        counts = self.stats.read(health or _DEFAULT_HEALTH)
        # The stage once: a swap between two reads would pair one version with another's backend.
        plan = self.stages.plan
        stage, source = plan.stage.status(), self.source.stats()
        steps = {
            step.name: shown
            for thread in plan.steps.values()
            for step in thread
            if (shown := step.status()) is not None
        }
        return run_status(
            stage, counts, source, self.stages.swaps, self.finished, self.tracking.summary, steps
        )

    # --- the three threads ------------------------------------------------------------------------

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

    def _walk(self, job: _Job, thread: Thread) -> bool:
        """Run `thread`'s steps of the job's plan on its record; False when the frame ended (a gate,
        or a failing step: `job.failure`)."""
        assert job.plan is not None
        record = job.record
        for step in job.plan.steps[thread]:
            t0 = time.perf_counter()
            try:
                go_on = step.run(record)
            except Exception as exc:  # one bad frame must not stop the pipeline
                record.timings_ms[step.name] = ms = (time.perf_counter() - t0) * 1000
                step.stats.count(ms, failed=True)
                if step.failure_ends_frame:
                    job.failure = f"{step.failure}: {exc}"
                    return False
                self.stats.failed(record.index, f"{step.failure}: {exc}", job.plan.stage)
                continue
            record.timings_ms[step.name] = ms = (time.perf_counter() - t0) * 1000
            step.stats.count(ms, ended=not go_on)
            if not go_on:
                return False
        return True

    def _prepare(self, job: _Job, plan: Plan) -> None:
        job.plan, job.failure = plan, None
        job.ended = not self._walk(job, "prepare") and job.failure is None

    def _prepare_loop(self) -> None:
        try:
            while True:
                frame = self.slot.get(timeout=0.5)
                if frame is None:
                    if self.slot.closed:
                        return  # source ended or stopped
                    continue
                job = _Job(FrameRecord.of(frame), frame)
                if not self.stages.pending:  # (else the new stage prepares it)
                    self._prepare(job, self.stages.plan)
                    if job.ended:
                        continue  # the model never sees it
                if not self._hand_over(self._prepared, job, self._thread):
                    return
        finally:
            self._hand_over(self._prepared, _END, self._thread)

    def _infer_loop(self) -> None:
        report = self._threads[-1] if self._threads else None
        try:
            while True:
                try:
                    job = self._prepared.get(timeout=0.5)
                except queue.Empty:
                    job = None
                self.stages.take_pending()
                self.stages.plan.stage.tend_backend()
                if job is _END:
                    return  # the last frame is done
                if job is not None and self._infer(job) and not self._hand_over(self._inferred, job, report):
                    return
                beside, self._beside = self._beside, None
                if beside is not None:  # both versions again on the same frame, its result already gone
                    beside[0].run(*beside[1:])
        finally:
            self._hand_over(self._inferred, _END, report)

    def _infer(self, job: _Job) -> bool:
        """The inference thread's steps on a job; True when it goes on to the report thread."""
        plan, record = self.stages.plan, job.record
        stage = plan.stage
        self._busy_since = time.monotonic()
        self.last_frame, job.frame = job.frame, None
        stage.stats.frames += 1
        try:
            if job.plan is not plan:  # prepared for a stage swapped out since, or not yet
                self._prepare(job, plan)
            if job.ended:
                return False
            if job.failure is None:
                self._walk(job, "inference")
        finally:
            self._busy_since = None
        if job.failure is not None:
            self.stats.failed(record.index, job.failure, stage)
            return False
        inference_ms = record.inference_ms
        self.stats.ran(stage, inference_ms)
        side = self.side_by_side
        if side is not None and side.new is stage and record.pixels is not None and side.wants():
            self._beside = (side, record.pixels, record.gap)  # run once the frame went on
        # Up to three frames wait for the report: their memory goes back now, unless a step needs them
        # (or someone watches the live view: only then, so an unwatched pipeline keeps no more frames).
        if not plan.keeps_pixels and not self.live_view.watched:
            record.pixels = None
        return True

    def _report_loop(self) -> None:
        try:
            while True:
                try:
                    job = self._inferred.get(timeout=0.5)
                except queue.Empty:
                    if self._thread is not None and not self._thread.is_alive() and self._inferred.empty():
                        return  # the inference thread failed without a word
                    continue
                if job is _END:
                    return
                self._reporting_since = time.monotonic()
                try:
                    self._report(job)
                finally:
                    self._reporting_since = None
        finally:
            self._done.set()
            self.stages.open(False)

    def _report(self, job: _Job) -> None:
        assert job.plan is not None
        record = job.record
        published = self._walk(job, "report") and record.publish
        if record.output is not None:  # the model's outputs became an output: an inference counted
            self.stats.done(record.inference_ms, record.captured_at, job.failure is not None, published)
        if job.failure is not None:
            self.stats.failed(record.index, job.failure, job.plan.stage)
