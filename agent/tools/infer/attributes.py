"""`infer --track --pipeline P` on a pipeline with `attributes:`: its second models, and the daemon's own
attributes step (agent/steps/attributes.py) run on each frame of the clip after the tracker.

Each attribute's model (a file, or NAME@VERSION in the store) is hinted under the pipeline config the
daemon chooses it under (`attribute_pipeline`) and loaded where this box runs it, as `infer` loads the
primary (agent/tools/infer/choice.py `load_backend`: the cached decision, else the full-precision
reference). One that cannot load is left out and said, as the daemon leaves it out: the detector's
events come anyway.

The reader runs on its own thread, as in the daemon, so an answer reaches its object some frames after
the crop was taken. A file has an end the daemon's streams lack: before the clip's last tracks end,
`drain` waits for every reading asked for, so the final events carry the values.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from agent.attribute_models import AttributeModel, AttributeSet, attribute_pipeline
from agent.config import AgentConfig, AttributeConfig, ModelRef, PipelineConfig, SnapshotsConfig
from agent.errors import EdgeAgentError
from agent.model_hints import embedded_hints, with_model_hints
from agent.pipeline_attributes import PipelineAttributes
from agent.pipeline_tracking import PipelineTracking
from agent.processing.scene import Event, Scene, SnapshotWanted
from agent.stage import LoadedModel
from agent.steps.attributes import AttributesStep
from agent.steps.base import FrameRecord
from agent.store import ModelStore
from agent.tools.infer.choice import load_backend, resolve
from providers import BackendError

DRAIN_TIMEOUT_S = 60.0  # at the clip's end, the longest wait for the readings still being read


def model_spec(model: ModelRef) -> str:
    """A model reference as `resolve` takes it: its file, or NAME@VERSION in the store."""
    return str(model.path) if model.path is not None else f"{model.name}@{model.version}"


def load_attributes(config: PipelineConfig, store: ModelStore, settings: AgentConfig) -> AttributeSet:
    """The pipeline's second models, loaded where this box runs them; one that cannot be loaded is in
    the set's `problems` (why), not in its models."""
    models: list[AttributeModel] = []
    problems: dict[str, str] = {}
    try:
        for attribute in config.attributes:
            try:
                models.append(_load(config, attribute, store, settings))
            except (EdgeAgentError, BackendError) as exc:
                problems[attribute.name] = f"{model_spec(attribute.model)} cannot serve: {exc}"
    except BaseException:
        AttributeSet(config.name, models).release()  # (closes the sessions loaded so far)
        raise
    return AttributeSet(config.name, models, problems)


def _load(
    config: PipelineConfig, attribute: AttributeConfig, store: ModelStore, settings: AgentConfig
) -> AttributeModel:
    model = resolve(model_spec(attribute.model), store)
    hinted = with_model_hints(
        attribute_pipeline(config, attribute), model.manifest, embedded_hints(model.artifacts)
    )
    loaded = load_backend(model, settings, hinted, None)
    serving = LoadedModel(
        model.name, model.version, loaded.decision.artifact_sha256, loaded.session, loaded.decision
    )
    serving.acquire()
    try:
        return AttributeModel.hinted(attribute, hinted, serving)
    except BaseException:
        serving.release()
        loaded.session.close()
        raise


class _NoSink:
    """The tracking sink a clip's attributes step is given: it only reads the scene (`tracking.scene`);
    the clip's tracker steps and ends it itself (agent/tools/infer/track.py)."""

    def write_events(self, pipeline: str, events: list[dict[str, Any]]) -> None:
        return None

    def open_tracks(self, pipeline: str) -> int:
        return 1

    def line_counts(self, pipeline: str) -> dict[str, dict[str, int]]:
        return {}

    def save_snapshot(
        self,
        pipeline: str,
        wanted: SnapshotWanted,
        frame: np.ndarray,
        captured_at: float,
        config: SnapshotsConfig,
    ) -> str | None:
        return None


class ClipAttributes:
    """The attributes step over a clip's scene: `frame` after each frame's tracking, `drain` before the
    clip's end, `close` after."""

    def __init__(self, config: PipelineConfig, models: AttributeSet, scene: Scene) -> None:
        self.models = models
        models.acquire()  # released (sessions closed, reader stopped) by `close`
        self.tracking = PipelineTracking(config.name, _NoSink())
        self.tracking.scene = scene
        self.readings = PipelineAttributes()
        self.step = AttributesStep(config, models, self.readings, self.tracking)
        self.unread = 0  # readings still not answered when `drain` gave up

    def frame(self, index: int, picture: np.ndarray, output: dict[str, Any], at: float) -> list[Event]:
        """The answers delivered since the last frame put on their objects (their `update` events), and
        this frame's objects due a reading handed to the reader."""
        record = FrameRecord(index, at, None, False, picture, output=output)
        self.step.run(record)
        return record.events

    def drain(self, index: int, at: float, timeout: float = DRAIN_TIMEOUT_S) -> list[Event]:
        """Wait for the readings asked for (at most `timeout` s) and put them on their objects."""
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            record = FrameRecord(index, at, None, False, None)  # no pixels: answers only, nothing asked
            self.step.run(record)
            events += record.events
            left = deadline - time.monotonic()
            if not self.readings.pending() or left <= 0 or not self.readings.wait_for_answers(left):
                break
        self.unread = self.readings.pending()
        return events

    def status(self) -> dict[str, Any]:
        """Per attribute: its model, backend and why (or why it could not load), and what it read."""
        return self.step.status() or {}

    def close(self) -> None:
        self.models.release()


def attributes_note(shown: dict[str, Any], unread: int) -> str:
    """What the result's note says of the second models: the ones left out, readings never answered."""
    notes = [f"attribute {name} left out: {shown[name]['error']}" for name in shown if "error" in shown[name]]
    if unread:
        notes.append(f"{unread} reading(s) still unanswered after {DRAIN_TIMEOUT_S:g} s at the clip's end")
    return "; ".join(notes)
