"""A pipeline's status, typed: what `edge-agent status` (the control socket), status.json, the MQTT
status, the fleet's reported state, telemetry and Home Assistant show of a pipeline.

It is built in one place, `pipeline_status`, from two parts: what the running pipeline knows
(`RunStatus`: `run_status` makes it of the stage's `StageStatus`, the counters' `Counts` and the
source's `SourceStatus`; agent/pipeline.py `Pipeline.status`) and what the supervisor knows of the
change that brings a version in (`ChangeStatus`; agent/supervisor/state.py `PipelineSlot.status`).

Inside agent/ a status is read by its attributes. It becomes JSON only here: `to_json` (status.json,
the control socket, `status --json`: the keys and their order are what scripts know, see
tests/test_cli_json.py), and the smaller records made of it (`brief_json`: the MQTT status;
`reported_json` and `outcome_json`: the fleet's reported state and a document's outcome). JSON is
read back here too (`from_json`: the CLI from the control socket, doctor from status.json),
leniently: a key a daemon of another version did not write reads as its empty value.

The lifecycle vocabulary (docs/operations.md, "Pipeline states and phases"): a pipeline's `state`
(`RunState`) says how its frames flow now; its `phase` (`Phase`) where the supervisor's change of
version stands. A source has its own `state` (`SourceState`), which the pipeline's is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

# How a pipeline's frames flow now (docs/operations.md).
RunState = Literal["starting", "running", "degraded", "source-unavailable", "finished", "stopped", "error"]
# Where the supervisor's change of version stands (docs/operations.md): in flight, then terminal.
InFlightPhase = Literal["pending", "pulling", "validating", "building", "health-check"]
TerminalPhase = Literal["running", "failed", "rolled-back", "removed"]
Phase = Literal[InFlightPhase, TerminalPhase]
# A source's own state (agent/sources/base.py); once stopped, a source stays so.
SourceState = Literal["starting", "streaming", "retrying", "finished", "stopped"]

RUN_STATES: tuple[RunState, ...] = get_args(RunState)
PHASES: tuple[Phase, ...] = get_args(Phase)
SOURCE_STATES: tuple[SourceState, ...] = get_args(SourceState)
IN_FLIGHT: tuple[InFlightPhase, ...] = get_args(InFlightPhase)
TERMINAL: tuple[TerminalPhase, ...] = get_args(TerminalPhase)
# The reported state's long texts, in the order a document too big for the broker loses them.
LONG_TEXTS = ("backend_why", "last_error", "reason")

Clip = Callable[[str | None], str | None]
Json = dict[str, Any]


def phase_of(text: str) -> Phase:
    """`text` as a phase; ValueError when it is none (a build names its phases as text)."""
    for phase in PHASES:
        if phase == text:
            return phase
    raise ValueError(f"unknown phase {text!r} (phases: {', '.join(PHASES)})")


def _plain(item: Any) -> Json:
    """A flat dataclass's fields as JSON, in their order."""
    return {f.name: getattr(item, f.name) for f in fields(item)}


# --- the source -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceCounters:
    """A source kind's own counters (this base: none); each kind's come between its error and
    `frames_dropped` in the JSON."""

    def to_json(self) -> Json:
        return _plain(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SourceCounters:
        for kind in _COUNTER_KINDS:  # the most specific first: each has `windows` but the video's
            names = [f.name for f in fields(kind)]
            if all(name in data for name in names):
                make: Callable[..., SourceCounters] = kind
                return make(**{name: data[name] for name in names})
        return SourceCounters()


@dataclass(frozen=True)
class VideoCounters(SourceCounters):
    frames_decoded: int
    frames_skipped_by_fps: int


@dataclass(frozen=True)
class AudioCounters(SourceCounters):
    windows: int


@dataclass(frozen=True)
class ReplayCounters(SourceCounters):
    rows: int
    bad_rows: int
    last_bad_row: str | None
    windows: int


@dataclass(frozen=True)
class SensorCounters(SourceCounters):
    messages: int
    bad_messages: int
    last_bad_message: str | None
    windows: int


@dataclass(frozen=True)
class SerialCounters(SourceCounters):
    lines: int
    bad_lines: int
    last_bad_line: str | None
    windows: int


_COUNTER_KINDS: tuple[type[SourceCounters], ...] = (
    ReplayCounters,
    SensorCounters,
    SerialCounters,
    VideoCounters,
    AudioCounters,
)


@dataclass(frozen=True)
class SourceStatus:
    """A source's state, its error and its counters (agent/sources/base.py `stats`)."""

    uri: str
    state: SourceState
    error: str | None
    counters: SourceCounters
    frames_dropped: int  # frames (windows) the model had no time for
    queued: int  # frames (windows) waiting for the model
    reconnects: int
    outages: int  # times it streamed again after being unavailable
    last_outage_s: float | None  # how long the last one lasted

    def to_json(self) -> Json:
        return {
            "uri": self.uri,
            "state": self.state,
            "error": self.error,
            **self.counters.to_json(),
            "frames_dropped": self.frames_dropped,
            "queued": self.queued,
            "reconnects": self.reconnects,
            "outages": self.outages,
            "last_outage_s": self.last_outage_s,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SourceStatus:
        return SourceStatus(
            data.get("uri", ""),
            data.get("state", "starting"),
            data.get("error"),
            SourceCounters.from_json(data),
            data.get("frames_dropped") or 0,
            data.get("queued") or 0,
            data.get("reconnects") or 0,
            data.get("outages") or 0,
            data.get("last_outage_s"),
        )


# --- what serves ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chosen:
    """What a backend decision adds to what serves: the artifact it runs and whether it was proven
    (outputs compared with the reference on a real sample)."""

    artifact: str | None
    proven: bool


@dataclass(frozen=True)
class Serving:
    """What serves a stage now and why (agent/stage.py `Stage.serving`): read from the session it
    runs and the decision it follows. `chosen`: None for a session given, not chosen (tests, tools)."""

    backend: str
    precision: str
    backend_why: str | None
    chosen: Chosen | None = None

    def to_json(self) -> Json:
        chosen = (
            {} if self.chosen is None else {"artifact": self.chosen.artifact, "proven": self.chosen.proven}
        )
        return {
            "backend": self.backend,
            "precision": self.precision,
            **chosen,
            "backend_why": self.backend_why,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Serving:
        chosen = Chosen(data.get("artifact"), bool(data["proven"])) if "proven" in data else None
        return Serving(
            data.get("backend") or "", data.get("precision") or "", data.get("backend_why"), chosen
        )


@dataclass(frozen=True)
class StageStatus:
    """The stage a pipeline serves: its model (`name@version`), what serves it, its last backend
    switches ("a -> b: why", newest last) and what its report rules held back, per rule."""

    model: str
    serving: Serving
    backend_switches: tuple[str, ...]
    held_back: Mapping[str, int]


# --- the counters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LastError:
    """The last failed frame: `<step> failed: <error>`, when (UTC, RFC 3339) and through which model."""

    text: str
    at: str
    model: str

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> LastError | None:
        """From a status's flat `last_error`, `last_error_at`, `last_error_model`."""
        text = data.get("last_error")
        return (
            None
            if text is None
            else LastError(text, data.get("last_error_at") or "", data.get("last_error_model") or "")
        )


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p95: float


@dataclass(frozen=True)
class Latency:
    """Milliseconds over the last inferences (None: none yet): the model's run, and from the frame's
    capture to its result."""

    inference: Percentiles | None = None
    capture_to_result: Percentiles | None = None

    def to_json(self) -> Json:
        def of(p: Percentiles | None) -> Json | None:
            return None if p is None else {"p50": p.p50, "p95": p.p95}

        return {"inference": of(self.inference), "capture_to_result": of(self.capture_to_result)}

    @staticmethod
    def from_json(data: Mapping[str, Any] | None) -> Latency:
        def of(p: Mapping[str, Any] | None) -> Percentiles | None:
            return None if not p else Percentiles(p["p50"], p["p95"])

        data = data or {}
        return Latency(of(data.get("inference")), of(data.get("capture_to_result")))


@dataclass(frozen=True)
class Rates:
    """The live rate (frames per second over the last seconds; None: no frame yet) and latencies."""

    fps: float | None
    latency: Latency


@dataclass(frozen=True)
class Counts:
    """A pipeline's counters (agent/pipeline_stats.py `PipelineStats.read`)."""

    results: int  # published
    inferences: int  # frames the model ran on, published or held back
    degraded: bool  # so many failed frames in a row that the pipeline is degraded
    errors: int  # failed frames
    last_error: LastError | None  # cleared after a clean health window
    mean_inference_ms: float | None
    fps: float | None
    latency: Latency


# --- the running pipeline -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStatus:
    """What a running pipeline knows of itself (`run_status` makes it)."""

    state: RunState
    error: str | None
    stage: StageStatus
    stage_swaps: int
    counts: Counts
    source: SourceStatus
    tracking: Mapping[str, Any] | None  # a tracking pipeline's scene (agent/processing/scene.py summary)
    # What steps show of themselves, by step name (agent/steps/base.py `Step.status`): the motion
    # gate's frames gated, the filters' drops...
    steps: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_json(self) -> Json:
        counts, error = self.counts, self.counts.last_error
        return {
            "state": self.state,
            "error": self.error,
            "model": self.stage.model,
            **self.stage.serving.to_json(),
            "stage_swaps": self.stage_swaps,
            "backend_switches": list(self.stage.backend_switches),
            "results": counts.results,
            "inferences": counts.inferences,
            "held_back": dict(self.stage.held_back),
            "errors": counts.errors,
            "last_error": None if error is None else error.text,
            "last_error_at": None if error is None else error.at,
            "last_error_model": None if error is None else error.model,
            "mean_inference_ms": counts.mean_inference_ms,
            "fps": counts.fps,
            "latency_ms": counts.latency.to_json(),
            "source": self.source.to_json(),
            **({} if self.tracking is None else {"tracking": self.tracking}),
            **({"steps": {name: dict(value) for name, value in self.steps.items()}} if self.steps else {}),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunStatus:
        state: RunState = data.get("state", "running")
        counts = Counts(
            results=data.get("results") or 0,
            inferences=data.get("inferences") or 0,
            degraded=state == "degraded",
            errors=data.get("errors") or 0,
            last_error=LastError.from_json(data),
            mean_inference_ms=data.get("mean_inference_ms"),
            fps=data.get("fps"),
            latency=Latency.from_json(data.get("latency_ms")),
        )
        switches, held_back = tuple(data.get("backend_switches") or ()), dict(data.get("held_back") or {})
        stage = StageStatus(data.get("model") or "", Serving.from_json(data), switches, held_back)
        source = SourceStatus.from_json(data.get("source") or {})
        swaps, tracking = data.get("stage_swaps") or 0, data.get("tracking")
        steps = data.get("steps") or {}
        return RunStatus(state, data.get("error"), stage, swaps, counts, source, tracking, steps)


def run_state(finished: bool, degraded: bool, source: SourceState) -> RunState:
    """A running pipeline's state: its threads ended (the source played through: `finished`, else
    `stopped`), too many failed frames in a row (`degraded`), its source retrying
    (`source-unavailable`), else `running`."""
    if finished:
        return "finished" if source == "finished" else "stopped"
    if degraded:
        return "degraded"
    if source == "retrying":
        return "source-unavailable"
    return "running"


def run_status(
    stage: StageStatus,
    counts: Counts,
    source: SourceStatus,
    stage_swaps: int,
    finished: bool,
    tracking: Mapping[str, Any] | None = None,
    steps: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunStatus:
    """A running pipeline's status; its `error`: the last failed frame's while it is degraded, else
    its source's (None while it delivers)."""
    state = run_state(finished, counts.degraded, source.state)
    if counts.degraded:
        error = None if counts.last_error is None else counts.last_error.text
    else:
        error = source.error
    return RunStatus(state, error, stage, stage_swaps, counts, source, tracking, steps or {})


# --- the change -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a version came from: the desired state's layer (`yaml`: agent.yaml) and generation."""

    layer: str
    generation: int | None


@dataclass(frozen=True)
class Step:
    """What an in-flight phase is doing now (pulling x, a backend trial, compiling an engine), and
    for how long (s)."""

    text: str
    seconds: float


@dataclass(frozen=True)
class Download:
    """How far a pull got: bytes of the artifact done, of total, at rate_bps."""

    artifact: str
    done: int
    total: int
    rate_bps: int

    def to_json(self) -> Json:
        return {"artifact": self.artifact, "bytes": self.done, "total": self.total, "rate_bps": self.rate_bps}


@dataclass(frozen=True)
class ChangeStatus:
    """What the supervisor knows of a pipeline: the version wanted (`desired_model`, from `desired`),
    the phase of the change bringing it in and since when (UTC), its reason (why it failed or rolled
    back), the attempts, and where the version serving came from when it is not the desired one
    (`running_from`: a change failed, rolled back or in flight)."""

    phase: Phase
    reason: str | None
    since: str
    desired: Origin
    attempts: int
    desired_model: str
    running_from: Origin | None = None
    step: Step | None = None
    download: Download | None = None

    def to_json(self) -> Json:
        data: Json = {
            "phase": self.phase,
            "reason": self.reason,
            "since": self.since,
            "layer": self.desired.layer,
            "generation": self.desired.generation,
            "attempts": self.attempts,
            "desired_model": self.desired_model,
        }
        if self.running_from is not None:
            data["running_layer"] = self.running_from.layer
            data["running_generation"] = self.running_from.generation
        if self.step is not None:
            data["step"], data["step_s"] = self.step.text, self.step.seconds
        if self.download is not None:
            data["download"] = self.download.to_json()
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ChangeStatus:
        running = Origin(data.get("running_layer") or "", data.get("running_generation"))
        step = Step(data["step"], data.get("step_s") or 0.0) if data.get("step") else None
        got = data.get("download")
        download = None if not got else Download(got["artifact"], got["bytes"], got["total"], got["rate_bps"])
        return ChangeStatus(
            data.get("phase", "running"),  # none said: no change in flight
            data.get("reason"),
            data.get("since") or "",
            Origin(data.get("layer") or "", data.get("generation")),
            data.get("attempts") or 0,
            data.get("desired_model") or "",
            running if "running_layer" in data or "running_generation" in data else None,
            step,
            download,
        )


# --- the pipeline ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineStatus:
    """A named pipeline's status (`pipeline_status` makes it): its `state` and `error`, what runs
    (`run`; None: nothing serves), the change (`change`), and the results the outbox dropped for it
    (the daemon's: None where not known)."""

    state: RunState
    error: str | None
    run: RunStatus | None
    change: ChangeStatus
    results_dropped: int | None = None

    @property
    def phase(self) -> Phase:
        return self.change.phase

    @property
    def running_model(self) -> str | None:
        """The version frames go through now (None: nothing serves)."""
        return None if self.run is None else self.run.stage.model

    @property
    def serving(self) -> Serving | None:
        return None if self.run is None else self.run.stage.serving

    @property
    def inferences(self) -> int:
        return 0 if self.run is None else self.run.counts.inferences

    @property
    def last_error(self) -> LastError | None:
        """The last failed frame, until a clean health window cleared it."""
        return None if self.run is None else self.run.counts.last_error

    def problems(self) -> list[str]:
        """What is wrong now, for people, the news first: while an older version serves, a change
        that failed or was rolled back (after a reload or a fleet update: why the pipeline is not
        what was asked for), then the serving version's own error (a missing video, failing frames),
        which may date from before that change and so is said to be that version's."""
        change, serving = self.change, self.running_model
        if serving is not None and change.reason and change.phase in ("failed", "rolled-back"):
            verb = "failed" if change.phase == "failed" else "rolled back"
            found = [f"{change.desired_model or 'the new version'} {verb}: {change.reason}"]
            return found + ([f"{serving}, still serving: {self.error}"] if self.error else [])
        return [text for text in dict.fromkeys((self.error, change.reason)) if text]

    def with_dropped(self, dropped: int) -> PipelineStatus:
        return replace(self, results_dropped=dropped)

    def to_json(self) -> Json:
        """The pipeline's status as status.json, the control socket and `status --json` show it."""
        if self.run is not None:
            data = {**self.run.to_json(), "state": self.state, "error": self.error}
            data["running_model"] = self.run.stage.model
        else:
            data = {"state": self.state, "error": self.error, "backend_why": None, "running_model": None}
        data.update(self.change.to_json())
        if self.results_dropped is not None:
            data["results_dropped"] = self.results_dropped
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PipelineStatus:
        """`to_json`'s output back (a run when it names a model or a source: what only a running
        pipeline has); a missing key reads as empty."""
        runs = data.get("model") is not None or isinstance(data.get("source"), Mapping)
        run = RunStatus.from_json(data) if runs else None
        return PipelineStatus(
            data.get("state", "starting"),
            data.get("error"),
            run,
            ChangeStatus.from_json(data),
            data.get("results_dropped"),
        )

    def brief_json(self) -> Json:
        """The pipeline in the retained MQTT status (docs/results.md, Status messages)."""
        step = {} if self.change.step is None else {"step": self.change.step.text}
        return {"state": self.state, "error": self.error, "phase": self.phase, **step}

    def reported_json(self, clip: Clip) -> Json:
        """The pipeline in the fleet's reported state (docs/fleet.md), long texts through `clip`."""
        change, serving, running = self.change, self.serving, self.change.running_from
        chosen = None if serving is None else serving.chosen
        error = self.last_error
        return {
            "phase": change.phase,
            "since": change.since,
            "reason": clip(change.reason),
            "layer": change.desired.layer,
            "generation": change.desired.generation,
            "model": self.running_model,
            "desired_model": change.desired_model,
            "running_model": self.running_model,
            "running_layer": None if running is None else running.layer,
            "running_generation": None if running is None else running.generation,
            "backend": None if serving is None else serving.backend,
            "precision": None if serving is None else serving.precision,
            "artifact": None if chosen is None else chosen.artifact,
            "proven": None if chosen is None else chosen.proven,
            "backend_why": clip(None if serving is None else serving.backend_why),
            "state": self.state,
            "last_error": clip(None if error is None else error.text),
            "last_error_at": None if error is None else error.at,
        }

    def outcome_json(self, name: str, clip: Clip) -> Json:
        """A failed or rolled-back pipeline in its document's outcome (`edge-agent status`'s fleet)."""
        running = self.change.running_from
        return {
            "pipeline": name,
            "phase": self.phase,
            "desired_model": self.change.desired_model,
            "reason": clip(self.change.reason),
            "running_model": self.running_model,
            "running_layer": None if running is None else running.layer,
            "running_generation": None if running is None else running.generation,
        }


def pipeline_status(run: RunStatus | None, change: ChangeStatus) -> PipelineStatus:
    """The one place a pipeline's status is made: a running pipeline's state and error are its own;
    with nothing serving, `error` once the change failed, else `starting`, and the change's reason."""
    if run is not None:
        return PipelineStatus(run.state, run.error, run, change)
    return PipelineStatus("error" if change.phase == "failed" else "starting", change.reason, None, change)


def statuses_json(statuses: Mapping[str, PipelineStatus]) -> dict[str, Json]:
    return {name: status.to_json() for name, status in statuses.items()}


def statuses_of(data: Mapping[str, Any] | None) -> dict[str, PipelineStatus]:
    """`statuses_json`'s output back; entries that are not objects are left out."""
    return {name: PipelineStatus.from_json(p) for name, p in (data or {}).items() if isinstance(p, Mapping)}
