"""A stage's second models (its pipeline's `attributes:`), loaded and proven like its own model
(agent/supervisor/building.py), and the thread that reads objects' crops with them.

The reader runs beside the pipeline's threads, at a lower CPU priority (a second model takes the
detector's gaps, not its time: scripts/bench_attributes.py measured 0.91 of the detector's frame rate
at the same priority, 1.00 below it): the report thread hands it crops (`submit`, never blocking: a
full queue refuses them, and they are tried at a later frame) and goes on; the answers are
delivered to the pipeline's `PipelineAttributes` (agent/pipeline_attributes.py), which the next frame's
attributes step puts on the objects. So the detector never waits for a second model, and an answer that
comes late attaches to its track, not to a stale frame.

Chains: an attribute whose crop is turned by an earlier classifier's answer (`crop.rotate_by`: PP-OCR's
direction classifier, then its recognizer) reads after that classifier, on the crop turned back by its
fresh answer (or the object's last one, when the classifier did not run this time).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from agent.attribute_check import not_an_image
from agent.batching import runs_batches
from agent.config import AttributeConfig, PipelineConfig
from agent.errors import ModelError
from agent.processing import Postprocessor, build_postprocessor
from agent.processing.preprocess import Preprocessor
from agent.stage import LoadedModel
from agent.threads import named_thread

log = logging.getLogger(__name__)

_LOG_FAILURES_EVERY_S = 60.0  # a model failing on every crop is said once a minute, not per crop
_QUEUE_JOBS = 32  # objects waiting for the reader at most: more are tried again at later frames
_READER_NICENESS = 10  # the reader thread's nice value above the process's (`_yield_to_the_detector`)
_ROTATIONS = {90: cv2.ROTATE_90_COUNTERCLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_CLOCKWISE}


def attribute_pipeline(pipeline: PipelineConfig, attribute: AttributeConfig) -> PipelineConfig:
    """The pipeline config an attribute's model is chosen, proven and hinted under: the pipeline's
    source and backend choice with the attribute's model, preprocess and postprocess, named
    `<pipeline>.<attribute>` in the log and the backend decisions. What is about the primary's boxes
    (zones, lines, tracking, filters, the motion gate's regions, the report rules, Home Assistant) is
    left out: the hints revalidate the config, and a ctc or classification output has no boxes."""
    return pipeline.model_copy(
        update={
            "name": f"{pipeline.name}.{attribute.name}",
            "model": attribute.model,
            "preprocess": attribute.preprocess,
            "postprocess": attribute.postprocess,
            "state": [],
            "attributes": [],
            "zones": [],
            "lines": [],
            "track": None,
            "filters": None,
            "motion": None,
            "report": type(pipeline.report)(),
            "home_automation": type(pipeline.home_automation)(),
        }
    )


def answer_of(output: Mapping[str, Any]) -> tuple[Any, float | None]:
    """A postprocessed crop's answer and its score: classification -> the top label (its index where
    it has none), ctc -> the text, embedding -> the vector, a plugin -> its `value` (else all of it)."""
    if "top" in output:
        best = output["top"][0]
        label = best.get("label")
        return (label if label is not None else str(best["index"])), float(best["score"])
    if "text" in output:
        return output["text"], float(output.get("score", 0.0))
    if "embedding" in output:
        return output["embedding"], None
    score = output.get("score")
    return output.get("value", dict(output)), (float(score) if isinstance(score, int | float) else None)


@dataclass
class AttributeModel:
    """One attribute's loaded model with the processing around it."""

    config: AttributeConfig
    model: LoadedModel
    preprocess: Preprocessor
    postprocess: Postprocessor
    batches: bool

    @classmethod
    def of(cls, config: AttributeConfig, model: LoadedModel) -> AttributeModel:
        """`config` (with the model's hints) on `model`'s session; a ModelError when they do not fit
        (an input that is no image, labels or characters that do not fit the output)."""
        session = model.session
        no_image = not_an_image(config, session.inputs)
        if no_image is not None:
            raise ModelError(f"attribute {config.name!r}: {no_image}")
        try:
            preprocess = Preprocessor(config.preprocess, session.inputs)
        except ModelError as exc:
            raise ModelError(f"attribute {config.name!r} reads crops of the picture: {exc}") from exc
        postprocess = build_postprocessor(config.postprocess, session.outputs)
        return cls(config, model, preprocess, postprocess, runs_batches(session))

    @classmethod
    def hinted(cls, config: AttributeConfig, hinted: PipelineConfig, model: LoadedModel) -> AttributeModel:
        """`of`, with what the model's hints filled into the attribute's processing (`hinted`: its
        `attribute_pipeline` through with_model_hints: labels, characters, input size)."""
        return cls.of(
            config.model_copy(update={"preprocess": hinted.preprocess, "postprocess": hinted.postprocess}),
            model,
        )

    @property
    def ref(self) -> str:
        return f"{self.model.name}@{self.model.version}"

    def read(self, crops: list[np.ndarray]) -> list[dict[str, Any]]:
        """The postprocessed output of each crop (BGR images), in one run where the model takes
        batches, else one run each."""
        tensors = [self.preprocess(crop) for crop in crops]
        session = self.model.session
        name = self.preprocess.input.name
        if self.batches and len(tensors) > 1 and len({t.shape for t in tensors}) == 1:
            outputs = session.run({name: np.concatenate(tensors)})
            return [self.postprocess(_row(outputs, i, len(tensors))) for i in range(len(tensors))]
        return [self.postprocess(session.run({name: tensor})) for tensor in tensors]


def _row(outputs: Mapping[str, np.ndarray], i: int, count: int) -> dict[str, np.ndarray]:
    """Row `i` of a batch of `count`, as a run on that input alone would give it."""
    return {k: (v[i : i + 1] if v.ndim and v.shape[0] == count else v) for k, v in outputs.items()}


@dataclass
class Job:
    """One object to read: a copy of the frame around its box, and which attributes want it."""

    track_id: int
    region: np.ndarray  # BGR pixels around the box (the largest padding of the attributes wanted)
    box: tuple[float, float, float, float]  # the object's box in `region`'s pixels
    wanted: list[int]  # indexes of the stage's attributes to read, in order
    known: dict[str, Any]  # the object's answers so far, by attribute (a chain's earlier classifier)
    captured_at: float
    polygon: np.ndarray | None = None  # its rotated rectangle (4 corners) in `region`'s pixels, if any


@dataclass(frozen=True)
class Reading:
    """An attribute's answer on an object (`value` None: the model failed on it)."""

    track_id: int
    name: str
    value: Any
    score: float | None
    captured_at: float
    error: str | None = None


@dataclass
class _Counts:
    crops: int = 0
    runs: int = 0  # model runs (a batch is one)
    failures: int = 0
    failed_crops: int = 0
    total_ms: float = 0.0
    last_error: str | None = None
    logged_at: float = -math.inf  # time.monotonic() of the last failure logged


@dataclass
class AttributeSet:
    """A stage's attribute models, the ones that could not load (`problems`: the primary serves on
    without them) and the reader thread. Stages made by `Stage.with_config` share it; the sessions
    close and the thread stops with the last of them."""

    pipeline: str
    models: list[AttributeModel]
    problems: dict[str, str] = field(default_factory=dict)  # attribute -> why it has no model
    _users: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _jobs: queue.Queue[Job | None] = field(default_factory=lambda: queue.Queue(_QUEUE_JOBS))
    _thread: threading.Thread | None = None
    _deliver: Callable[[list[Reading]], None] | None = None
    _counts: dict[str, _Counts] = field(default_factory=dict)

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """One stage less; the last one stops the reader (after the crop it reads) and closes the
        sessions. Crops still queued are dropped: their objects are read again by the next stage."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            thread, self._thread = self._thread, None
        if thread is not None:
            _drain(self._jobs)
            self._jobs.put(None)
            thread.join(timeout=10)
        for model in self.models:
            if model.model.release():
                model.model.session.close()

    def by_name(self, name: str) -> AttributeModel | None:
        return next((m for m in self.models if m.config.name == name), None)

    def submit(self, job: Job, deliver: Callable[[list[Reading]], None]) -> bool:
        """Queue an object for the reader (started at the first job); False when the queue is full."""
        with self._lock:
            self._deliver = deliver
            if self._thread is None:
                self._thread = named_thread(self._read_loop, f"attributes-{self.pipeline}")
                self._thread.start()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def status(self) -> dict[str, dict[str, Any]]:
        """Per attribute: its model, backend and why, and what the reader did with it."""
        shown: dict[str, dict[str, Any]] = {name: {"error": why} for name, why in self.problems.items()}
        for model in self.models:
            session, decision = model.model.session, model.model.decision
            counts = self._counts.get(model.config.name, _Counts())
            shown[model.config.name] = {
                "model": model.ref,
                "backend": session.backend,
                "precision": session.precision,
                "why": decision.explain() if decision is not None else None,
                "crops": counts.crops,
                "runs": counts.runs,
                "failures": counts.failures,
                "mean_ms": round(counts.total_ms / counts.runs, 3) if counts.runs else None,
                "last_error": counts.last_error,
            }
        return shown

    def unhealthy(self, max_error_rate: float, min_reads: int) -> str | None:
        """Why these second models fail a health window (None: fine): one that could not load, or one
        failing on more than `max_error_rate` of its crops (once it was given `min_reads`)."""
        for name, why in self.problems.items():
            return f"attribute {name}: {why}"
        for model in self.models:
            counts = self._counts.get(model.config.name)
            if counts is None:
                continue
            tried = counts.crops + counts.failed_crops
            if tried >= min_reads and counts.failed_crops / tried > max_error_rate:
                return (
                    f"attribute {model.config.name}: {counts.failed_crops} of {tried} crops failed (over "
                    f"max_error_rate {max_error_rate:g}); last: {counts.last_error}"
                )
        return None

    def _read_loop(self) -> None:
        _yield_to_the_detector()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs = [job]
            while len(jobs) < _QUEUE_JOBS:  # what is waiting is read together (batches)
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)
                    break
                jobs.append(more)
            readings = self.read(jobs)
            deliver = self._deliver
            if deliver is not None and readings:
                deliver(readings)

    def read(self, jobs: list[Job]) -> list[Reading]:
        """Each job's wanted attributes, attribute by attribute in the config's order (so a chain's
        classifier answers before the crops it turns are read)."""
        readings: list[Reading] = []
        fresh: dict[tuple[int, str], Any] = {}
        for index, model in enumerate(self.models):
            name = model.config.name
            mine = [job for job in jobs if index in job.wanted]
            if not mine:
                continue
            crops = [self._crop(job, model.config, fresh) for job in mine]
            counts = self._counts.setdefault(name, _Counts())
            started = time.perf_counter()
            try:
                outputs = model.read(crops)
            except Exception as exc:  # a second model's failure costs only its own answers
                counts.failures += 1
                counts.failed_crops += len(crops)
                now = time.monotonic()
                if now - counts.logged_at >= _LOG_FAILURES_EVERY_S:
                    counts.logged_at = now
                    log.warning(
                        "pipeline %s: attribute %s failed (%d times so far): %s",
                        self.pipeline,
                        name,
                        counts.failures,
                        exc,
                    )
                counts.last_error = str(exc)
                readings += [Reading(j.track_id, name, None, None, j.captured_at, str(exc)) for j in mine]
                continue
            counts.runs += 1 if model.batches and len(crops) > 1 else len(crops)
            counts.crops += len(crops)
            counts.total_ms += (time.perf_counter() - started) * 1000
            for job, output in zip(mine, outputs, strict=True):
                value, score = answer_of(output)
                fresh[job.track_id, name] = value
                readings.append(Reading(job.track_id, name, value, score, job.captured_at))
        return readings

    @staticmethod
    def _crop(job: Job, config: AttributeConfig, fresh: Mapping[tuple[int, str], Any]) -> np.ndarray:
        """The object's crop for `config`: its box grown by the padding, turned back by the chain's
        classifier's angle."""
        if config.crop.align and job.polygon is not None:
            crop = level_crop(job.region, job.polygon, config.crop.padding)
        else:
            x1, y1, x2, y2 = job.box
            pad = config.crop.padding * (y2 - y1)
            height, width = job.region.shape[:2]
            left, top = max(int(x1 - pad), 0), max(int(y1 - pad), 0)
            right, bottom = min(int(np.ceil(x2 + pad)), width), min(int(np.ceil(y2 + pad)), height)
            crop = job.region[top:bottom, left:right]
        source = config.crop.rotate_by
        if source is not None:
            angle = fresh.get((job.track_id, source), job.known.get(source))
            turn = _ROTATIONS.get(int(angle)) if isinstance(angle, str) and angle.isdigit() else None
            if turn is not None:
                crop = cv2.rotate(crop, turn)
        return crop


def level_crop(image: np.ndarray, polygon: np.ndarray, padding: float) -> np.ndarray:
    """The rotated rectangle `polygon` (4 corners, any order) of `image`, turned level: its longer side
    horizontal, grown by `padding` x its height on every side (PP-OCR's crop of a text line at an angle)."""
    corners = np.asarray(polygon, dtype=np.float32).reshape(4, 2)
    sums, diffs = corners.sum(axis=1), corners[:, 1] - corners[:, 0]
    tl, br = corners[np.argmin(sums)], corners[np.argmax(sums)]
    tr, bl = corners[np.argmin(diffs)], corners[np.argmax(diffs)]
    width = max(float(np.linalg.norm(tr - tl)), float(np.linalg.norm(br - bl)), 1.0)
    height = max(float(np.linalg.norm(bl - tl)), float(np.linalg.norm(br - tr)), 1.0)
    across, down = (tr - tl) / width, (bl - tl) / height
    pad = padding * min(width, height)
    grown = np.array(
        [
            tl - pad * (across + down),
            tr + pad * (across - down),
            br + pad * (across + down),
            bl - pad * (across - down),
        ],
        dtype=np.float32,
    )
    out_w, out_h = max(round(width + 2 * pad), 1), max(round(height + 2 * pad), 1)
    level = np.array([[0, 0], [out_w, 0], [out_w, out_h], [0, out_h]], dtype=np.float32)
    crop = cv2.warpPerspective(
        image, cv2.getPerspectiveTransform(grown, level), (out_w, out_h), borderMode=cv2.BORDER_REPLICATE
    )
    return np.ascontiguousarray(np.rot90(crop)) if out_h >= 1.5 * out_w else crop


def _yield_to_the_detector() -> None:
    """Lower this thread's CPU priority (Linux: per thread): on a box whose cores the detector keeps busy,
    a second model runs in the detector's gaps instead of taking its time. The model's own worker
    threads (a runtime's pool) keep theirs."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: the default priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _READER_NICENESS)


def _drain(jobs: queue.Queue[Job | None]) -> None:
    while True:
        try:
            jobs.get_nowait()
        except queue.Empty:
            return
