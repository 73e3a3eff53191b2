"""Choosing a pipeline's backend on this box: policy from the config, a real sample from the
pipeline's own source, the decision proven by `providers.decide`, cached and explained.

The decision is cached in `<state_dir>/decisions/` keyed by the model's artifact hashes, this
box's hardware fingerprint, the runtimes' versions and the policy, so a restart does not
benchmark again, and a driver upgrade or a new accelerator does.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import AgentConfig, PipelineConfig
from agent.errors import EdgeAgentError, ModelError
from agent.fsutil import atomic_write_bytes
from agent.hardware import HardwareInfo, detect_hardware
from agent.processing.feed import Feeder, build_feeder
from agent.processing.judge import Judge, report_judge
from agent.retry import backoff_delay
from agent.sources import Frame, open_source
from agent.testdata import TestData, testdata_samples
from agent.transform import with_upgraded_twins
from providers import (
    Backend,
    BackendError,
    Decision,
    ModelArtifact,
    SelectionPolicy,
    Session,
    all_backends,
    decide,
    load_decided,
)
from providers.catalog import cached_backends
from providers.select import (
    FULL_PRECISION_REFERENCES,
    CandidateReport,
    Loader,
    NoBackendError,
    Progress,
    Sample,
    compare_outputs,
    judged_by,
    reference_first,
    reference_session,
    serving_options,
)

log = logging.getLogger(__name__)


def box_backends(config: AgentConfig, hardware: HardwareInfo | None = None) -> list[Backend]:
    """This box's backends as the daemon sees them: probed in a child process and cached under the
    state dir (providers/catalog.py), so that only the runtime a pipeline serves on is imported here."""
    fingerprint = (hardware or detect_hardware()).fingerprint()
    return cached_backends(config.state_dir / "cache", fingerprint)


def policy_for(
    config: AgentConfig, pipeline: PipelineConfig | None = None, backends: Sequence[Backend] | None = None
) -> SelectionPolicy:
    """The agent's selection settings, with the pipeline's prefer/deny/fixed on top. `backends`:
    the backends to set cache dirs for (default: every runtime's, imported here)."""
    agent = config.backends
    prefer = list(pipeline.backend.prefer) + list(agent.prefer) if pipeline else list(agent.prefer)
    deny = list(agent.deny) + (list(pipeline.backend.deny) if pipeline else [])
    fixed = (pipeline.backend.fixed if pipeline else None) or agent.fixed
    return SelectionPolicy(
        prefer=tuple(prefer),
        deny=tuple(deny),
        fixed=fixed,
        benchmark=agent.benchmark,
        max_trials=agent.max_trials,
        warmup=agent.warmup,
        runs=agent.runs,
        min_time_s=agent.min_time_s,
        budget_s=agent.budget_s,
        timeout_s=agent.timeout_s,
        rtol=agent.rtol,
        atol=agent.atol,
        max_mismatch=agent.max_mismatch,
        spare_core=agent.spare_core,
        options=_with_cache_dirs(
            agent.options, config.state_dir / "cache", all_backends() if backends is None else backends
        ),
    )


def _with_cache_dirs(
    options: Mapping[str, Mapping[str, Any]], cache: Path, backends: Sequence[Backend]
) -> dict[str, dict[str, Any]]:
    """Compiled engines and blobs are cached under the state dir unless the config says otherwise:
    they are built before a model serves, and a restart must not build them again."""
    merged = {name: dict(values) for name, values in options.items()}
    for backend in backends:
        if backend.name.startswith("openvino/") and backend.name != "openvino/*":
            merged.setdefault(backend.name, {}).setdefault("cache_dir", str(cache / "openvino"))
        if backend.name == "onnxruntime/TensorrtExecutionProvider":
            merged.setdefault(backend.name, {}).setdefault("engine_cache_dir", str(cache / "tensorrt"))
    return merged


def grab_sample(pipeline: PipelineConfig, feeder: Feeder, timeout_s: float) -> dict[str, np.ndarray] | None:
    """One real input from the pipeline's own source, as the model's inputs; None if none came in time."""
    source, slot = open_source(pipeline.source, f"{pipeline.name}-sample")
    source.start()
    try:
        frame = slot.get(timeout_s)
    finally:
        source.stop(timeout=5)
    if frame is None:
        return None
    return feeder.feeds(frame.data, gap=True)[0]


Peek = Callable[[float], Frame | None]  # a frame of an open source, within a timeout, not taken from it


def _samples(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    testdata: Sequence[TestData],
    backends: Sequence[Backend],
    peek: Peek | None = None,
) -> tuple[list[Sample], bool]:
    """What to prove candidates on: the model's test data, then (for the artifacts it does not
    fit) a frame from the pipeline's own source (`peek`: the open source's, else it is opened for
    one frame); empty when neither can be had. And whether a frame was wanted but none came."""
    samples = testdata_samples(testdata, artifacts, backends)
    if all(any(s.fits_artifact(a) for s in samples) for a in artifacts):
        return samples, False
    reference = reference_session(artifacts, backends)
    try:
        feeder = build_feeder(pipeline, reference.inputs, reference.outputs)
    finally:
        reference.close()
    timeout = config.backends.sample_timeout_s
    if peek is not None:
        seen = peek(timeout)
        frame = None if seen is None else feeder.feeds(seen.data, gap=True)[0]
    else:
        frame = grab_sample(pipeline, feeder, timeout)
    if frame is not None:
        return [*samples, Sample(frame, "a frame from the pipeline's source")], False
    return samples, True


def hardware_notes(hardware: HardwareInfo) -> dict[str, str]:
    """Backend name -> what this box has for it, e.g. {"openvino/NPU": "Intel NPU (Meteor Lake) found"}."""
    notes: dict[str, str] = {}
    for accelerator in hardware.accelerators:
        for runtime in accelerator.runtimes:
            notes.setdefault(runtime, f"{accelerator.model} found")
    return notes


def providers_report(
    hardware: HardwareInfo | None = None, backends: Sequence[Backend] | None = None
) -> dict[str, Any]:
    """Hardware found and every backend with available/why, naming hardware left unused."""
    hardware = hardware or detect_hardware()
    notes = hardware_notes(hardware)
    rows = []
    for backend in backends if backends is not None else all_backends():
        probe = backend.probe()
        reason = probe.reason
        if not probe.available and backend.name in notes:
            reason = f"{notes[backend.name]}, but {reason}"
        rows.append(
            {
                "backend": backend.name,
                "available": probe.available,
                "reason": reason,
                "versions": dict(probe.versions),
                "devices": list(probe.devices),
            }
        )
    known = {row["backend"] for row in rows}
    for name, found in notes.items():
        if name not in known:
            reason = f"{found}, but edge-agent has no {name} backend"
            rows.append(
                {"backend": name, "available": False, "reason": reason, "versions": {}, "devices": []}
            )
    return {"hardware": hardware.to_dict(), "backends": rows}


def decision_key(
    artifacts: Sequence[ModelArtifact],
    testdata: Sequence[TestData],
    policy: SelectionPolicy,
    backends: Sequence[Backend],
    hardware: HardwareInfo,
) -> str:
    """What a decision depends on: the files (models and test data, with the test data's
    tolerances), the hardware, the runtimes and the policy."""
    facts = {
        "artifacts": sorted(a.sha256 for a in [*artifacts, *(t.artifact for t in testdata)]),
        "tolerances": sorted(str((t.artifact.sha256, t.rtol, t.atol)) for t in testdata),
        "hardware": hardware.fingerprint(),
        "runtimes": sorted({f"{k}={v}" for b in backends for k, v in b.probe().versions.items()}),
        "available": sorted(b.name for b in backends if b.probe().available),
        "policy": json.dumps(asdict(policy), sort_keys=True, default=str),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


class DecisionStore:
    """Decisions on disk: by key (the cache) and by pipeline name (for `edge-agent explain`)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "decisions"

    def get(self, key: str) -> Decision | None:
        path = self.root / f"{key}.json"
        try:
            return Decision.from_dict(json.loads(path.read_text())["decision"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable cached decision %s: %s", path, exc)
            return None

    def put(self, key: str, decision: Decision, pipeline: str | None, model: str, cache: bool = True) -> None:
        """Record the pipeline's decision (for `explain`; None: no pipeline's); with `cache` also
        under its key, for the next start to reuse (an unchecked decision is only recorded: it is
        made again)."""
        record = {
            "key": key,
            "pipeline": pipeline,
            "model": model,
            "decided_at": time.time(),
            "decision": decision.to_dict(),
        }
        data = json.dumps(record, indent=2).encode()
        self.root.mkdir(parents=True, exist_ok=True)
        if cache:
            atomic_write_bytes(self.root / f"{key}.json", data)
        if pipeline is not None:
            (self.root / "pipelines").mkdir(exist_ok=True)
            atomic_write_bytes(self.root / "pipelines" / f"{pipeline}.json", data)

    def put_refusal(self, error: NoBackendError, pipeline: str, model: str) -> None:
        """Record that no candidate could serve the pipeline, and why each could not (for `explain`)."""
        record = {
            "pipeline": pipeline,
            "model": model,
            "decided_at": time.time(),
            "refused": str(error),
            "candidates": [asdict(c) for c in error.candidates],
        }
        (self.root / "pipelines").mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(
            self.root / "pipelines" / f"{pipeline}.json", json.dumps(record, indent=2).encode()
        )

    def forget(self, pipeline: str, key: str | None = None) -> bool:
        """Drop the cached decision `key` (default: the one the pipeline's record names), so the
        pipeline's next build decides again; False when there was none cached."""
        if key is None:
            record = self.for_pipeline(pipeline)
            key = record.get("key") if record else None
        if not isinstance(key, str) or not key:
            return False
        path = self.root / f"{key}.json"
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed

    def for_pipeline(self, pipeline: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads((self.root / "pipelines" / f"{pipeline}.json").read_text())
            return record
        except (OSError, ValueError):
            return None

    def all_pipelines(self) -> list[dict[str, Any]]:
        folder = self.root / "pipelines"
        records = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return records


_decision_locks: dict[str, threading.Lock] = {}
_decision_locks_guard = threading.Lock()


def _deciding(key: str) -> threading.Lock:
    """The lock held while deciding for one decision key (one model, policy and box)."""
    with _decision_locks_guard:
        return _decision_locks.setdefault(key, threading.Lock())


def owns_state_dir(config: AgentConfig) -> bool:
    """Whether this process may write under the state dir: it is its owner (the daemon's user), or
    the dir is not made yet. A tool run as another user (`sudo edge-agent ...`) writes nothing there:
    files and folders it made would be in the daemon's way."""
    path = config.state_dir.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if path != config.state_dir.absolute():
        return os.access(path, os.W_OK)  # not made yet: whoever can make it owns it
    try:
        return path.stat().st_uid == os.geteuid()
    except OSError:
        return False


_scratch: list[Path] = []  # this process's private folder for twins, removed when it exits


def derived_dir_of(config: AgentConfig) -> Path:
    """Where opset-upgraded twins are kept: the store's derived/ folder; for another user than the
    state dir's owner, a private folder of this process's (made again by the next run)."""
    if owns_state_dir(config):
        return config.state_dir / "store" / "derived"
    if not _scratch:
        _scratch.append(Path(tempfile.mkdtemp(prefix="edge-agent-derived-")))
        atexit.register(shutil.rmtree, _scratch[0], ignore_errors=True)
    return _scratch[0]


@dataclass(frozen=True)
class Box:
    """This box as a decision sees it: its hardware and its backends (probed once, cached)."""

    hardware: HardwareInfo
    backends: tuple[Backend, ...]

    @classmethod
    def here(cls, config: AgentConfig) -> Box:
        """The daemon's view: the probes cached under the state dir (probed in-process, and not
        cached, for a user who does not own it)."""
        hardware = detect_hardware()
        backends = box_backends(config, hardware) if owns_state_dir(config) else all_backends()
        return cls(hardware, tuple(backends))


@dataclass
class Choice:
    """Where a model runs on this box and why: the one answer the daemon, infer, bench, explain,
    doctor, validate and the fleet commands share (`current_choice`, `choose_and_load`).

    `artifacts` are what it chose among (upgraded twins included: the choice may be one), `policy`
    and `box` what it was made under, `key` its decision cache key. `cached`: read from the cache
    (proven on an earlier start, or by `models validate`)."""

    model: str
    decision: Decision
    artifacts: list[ModelArtifact]
    policy: SelectionPolicy
    box: Box
    key: str
    cached: bool = False
    screened: bool = True  # False: the reference taken at once, the other candidates not screened
    load_failures: tuple[str, ...] = ()  # the candidates that did not load before the one serving

    @property
    def backend(self) -> str:
        return self.decision.backend

    @property
    def artifact(self) -> str:
        return self.decision.artifact

    @property
    def precision(self) -> str | None:
        return self.decision.precision

    @property
    def proven(self) -> bool:
        """Its outputs were compared with a reference (expected outputs, or the CPU reference)."""
        return self.decision.checked

    @property
    def full_precision_reference(self) -> bool:
        return self.decision.backend in FULL_PRECISION_REFERENCES

    def summary(self) -> dict[str, Any]:
        """What runs, for people and scripts: backend, artifact, precision, proven and on what."""
        return {
            "model": self.model,
            "backend": self.backend,
            "artifact": self.artifact,
            "precision": self.precision,
            "proven": self.proven,
            "proof": self.decision.proof() if self.proven else None,
            "cached": self.cached,
            "why": self.decision.explain(),
        }


def model_candidates(
    config: AgentConfig, artifacts: Sequence[ModelArtifact], box: Box, derived_dir: Path | None = None
) -> list[ModelArtifact]:
    """The model's files plus an opset-upgraded twin of each the CPU reference refuses as it is
    (kept in the store's derived/ folder, made once)."""
    return with_upgraded_twins(artifacts, box.backends, derived_dir or derived_dir_of(config))


def current_choice(
    config: AgentConfig,
    pipeline: PipelineConfig | None,
    artifacts: Sequence[ModelArtifact],
    model_ref: str,
    testdata: Sequence[TestData] = (),
    box: Box | None = None,
    derived_dir: Path | None = None,
    screen_all: bool = False,
) -> Choice:
    """Where this box runs the model now, without running it: the cached proven decision for this
    model, policy and box; else what a first start serves (the full-precision CPU reference, the
    upgraded twin where it refuses the file as it is) until a sample proves another candidate.

    `screen_all`: rank every candidate too (what would be tried next: `explain`), which loads
    every runtime to check the model's operators; else only the reference is named. Raises
    NoBackendError (each candidate's reason) when nothing can serve the model."""
    box = box or Box.here(config)
    policy = policy_for(config, pipeline, box.backends)
    candidates = model_candidates(config, artifacts, box, derived_dir)
    key = decision_key(candidates, testdata, policy, box.backends, box.hardware)
    cached = DecisionStore(config.state_dir).get(key)
    if cached is not None:
        return Choice(model_ref, cached, candidates, policy, box, key, cached=True)
    decision, screened = first_start_decision(candidates, policy, box, screen_all)
    return Choice(model_ref, decision, candidates, policy, box, key, screened=screened)


def first_start_decision(
    artifacts: Sequence[ModelArtifact], policy: SelectionPolicy, box: Box, screen_all: bool = False
) -> tuple[Decision, bool]:
    """What serves before any sample proved a candidate, and whether the others were screened: the
    full-precision reference at once (reference_first), else (the policy rules it out, benchmarking
    is off, or `screen_all`) `decide` without a sample."""
    if policy.benchmark and not screen_all:
        quick = reference_first(artifacts, policy, box.backends)
        if quick is not None:
            return quick, False
    notes = hardware_notes(box.hardware)
    return decide(artifacts, policy, None, box.backends, hardware=notes), True


def choose_and_load(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    model_ref: str,
    testdata: Sequence[TestData] = (),
    progress: Progress | None = None,
    load: Loader | None = None,
    peek: Peek | None = None,
    prove_later: bool = False,
    box: Box | None = None,
) -> tuple[Session, Choice]:
    """The current choice (`current_choice`), proven first where it is not and `prove_later` is
    off, and loaded in this process (the next candidate where the chosen one does not load).

    `prove_later`: with no cached decision, serve the first-start choice at once, unproven (the
    caller proves the candidates on a live frame beside it: make_prover), instead of running
    trials first. Else candidates are proven on the model's test data (`testdata`) where it fits,
    else on a frame from the pipeline's own source (`peek`: see _samples). `progress` hears each
    step (trials, engine builds) before it starts.

    Pipelines on the same model decide one at a time: the second finds the first's proven decision
    in the cache instead of deciding again (or guessing by rank when its own source is dead).
    """
    say = progress or (lambda _text: None)
    store = DecisionStore(config.state_dir)
    try:
        choice = current_choice(config, pipeline, artifacts, model_ref, testdata, box)
    except NoBackendError as exc:  # the policy rules the reference out, and nothing else can serve
        store.put_refusal(exc, pipeline.name, model_ref)
        raise
    policy, backends = choice.policy, choice.box.backends
    if choice.cached:
        log.info("pipeline %s: using the cached backend decision %s", pipeline.name, choice.key)
    elif policy.benchmark and prove_later:
        log.info(
            "pipeline %s: no proven decision for %s yet: serving on %s while the candidates are "
            "proven on its first frame",
            pipeline.name,
            model_ref,
            "the CPU reference" if choice.full_precision_reference else f"{choice.backend}, unproven,",
        )
    elif not policy.benchmark:
        log.info(
            "pipeline %s: choosing a backend for %s (benchmarking off: by rank)", pipeline.name, model_ref
        )
    else:
        say("getting inputs to prove backends on")
        samples, no_frame = _samples(config, pipeline, choice.artifacts, testdata, backends, peek)
        choice = _prove_now(config, pipeline, choice, samples, no_frame, progress)
    try:
        session, choice = load_choice(choice, f"pipeline {pipeline.name}", progress, load)
    except NoBackendError as exc:
        store.put_refusal(exc, pipeline.name, model_ref)
        raise
    # Recorded for this pipeline (explain, reselect-backend); cached for the next start only when
    # proven, or when benchmarking is off (an unchecked first-start choice is made again).
    cache = not choice.cached and (choice.proven or not policy.benchmark)
    store.put(choice.key, choice.decision, pipeline.name, model_ref, cache=cache)
    return session, choice


def _prove_now(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    samples: list[Sample],
    no_frame: bool,
    progress: Progress | None,
) -> Choice:
    """Prove the candidates on `samples` before serving (the choice is not cached yet)."""
    store = DecisionStore(config.state_dir)
    with _deciding(choice.key):
        # Another pipeline on this model may have proven a decision while this one waited for a frame.
        cached = store.get(choice.key)
        if no_frame:
            log.warning(
                "pipeline %s: no frame from its source within %.0f s; %s",
                pipeline.name,
                config.backends.sample_timeout_s,
                "another pipeline on this model proved a decision meanwhile: using it"
                if cached is not None
                else "only the candidates its test data fits are proven"
                if samples
                else "serving on the full-precision CPU reference, outputs not checked",
            )
        if cached is not None:
            log.info("pipeline %s: using the cached backend decision %s", pipeline.name, choice.key)
            return replace(choice, decision=cached, cached=True)
        if not samples:
            return choice
        log.info(
            "pipeline %s: choosing a backend for %s (benchmarking the top candidates on %s)",
            pipeline.name,
            choice.model,
            ", ".join(s.origin for s in samples),
        )
        try:
            decision = _decide_on(config, pipeline, choice, samples, progress)
        except NoBackendError as exc:
            store.put_refusal(exc, pipeline.name, choice.model)
            raise
        return replace(choice, decision=decision, screened=True)


def load_choice(
    choice: Choice, who: str, progress: Progress | None = None, load: Loader | None = None
) -> tuple[Session, Choice]:
    """Load the choice in this process; where it fails, the next candidate of its order (the
    returned choice's `load_failures` say which did not). The reference taken at once (an
    unscreened choice) that cannot load the model after all: every candidate is screened for
    another. NoBackendError when none can."""
    try:
        session, _used, failures = _load(choice, progress, load)
    except BackendError as exc:
        if choice.screened:
            raise
        log.info("%s: %s; screening every candidate", who, exc)
        decision, _screened = first_start_decision(
            choice.artifacts, choice.policy, choice.box, screen_all=True
        )
        choice = replace(choice, decision=decision, screened=True)
        session, _used, failures = _load(choice, progress, load)
    for failure in failures:
        log.warning("%s: %s; falling back to the next backend", who, failure)
    # The decision stays as it was made (it is cached): what serves instead shows from the session.
    return session, replace(choice, load_failures=tuple(failures))


def _load(
    choice: Choice, progress: Progress | None = None, load: Loader | None = None
) -> tuple[Session, CandidateReport, list[str]]:
    return load_decided(choice.decision, choice.artifacts, choice.policy, choice.box.backends, progress, load)


def check_on_testdata(session: Session, choice: Choice, testdata: Sequence[TestData]) -> int:
    """Run the loaded session on every test set that fits its artifact and compare with the expected
    outputs at the test data's tolerances: the proof a version gets on this box when the decision
    did not run trials (benchmarking off). Returns the number of sets checked; ModelError naming
    the set and the difference when one is wrong."""
    artifacts, policy, backends = choice.artifacts, choice.policy, choice.box.backends
    artifact_sha256 = choice.decision.artifact_sha256
    checked = 0
    artifact = next((a for a in artifacts if a.sha256 == artifact_sha256), None)
    if artifact is None:
        return 0
    for sample in testdata_samples(testdata, [artifact], backends):
        if not sample.expected or not sample.fits_artifact(artifact):
            continue
        outputs = session.run(sample.feeds)
        max_diff, problem = compare_outputs(outputs, sample.expected, judged_by(sample, policy))
        if problem:
            raise ModelError(
                f"{session.backend} does not give the expected outputs in {sample.origin}: {problem}"
                + (f" (max abs diff {max_diff:.3g})" if max_diff is not None else ""),
                hint="the version's test data disagrees with what the model computes on this box",
            )
        checked += 1
    return checked


def pipeline_judge(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    backends: Sequence[Backend],
) -> Judge | None:
    """Judge candidates on the pipeline's reports where its postprocessor says what matters
    (agent/processing/judge.py); None (tensors) when it does not, or when the outputs cannot be read."""
    try:
        reference = reference_session(artifacts, backends)
    except BackendError:
        return None
    try:
        return report_judge(pipeline.postprocess, reference.outputs, config.backends.match_iou)
    except EdgeAgentError as exc:  # a postprocess that does not fit the outputs fails the build later
        log.debug("pipeline %s: judging candidates on tensors: %s", pipeline.name, exc)
        return None
    finally:
        reference.close()


Prover = Callable[[Mapping[str, np.ndarray]], Decision]


def prove_on(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    feeds: Mapping[str, np.ndarray],
    testdata: Sequence[TestData] = (),
    origin: str = "a frame from the pipeline's source",
    record: bool = True,
    cache: bool = True,
) -> Choice:
    """Decide again with the candidates proven on `feeds` (plus the model's test data); a proven
    decision is cached under the choice's key (with `cache`), for every later start and tool to
    find, and with `record` recorded as the pipeline's for `explain`."""
    backends = choice.box.backends
    samples = [*testdata_samples(testdata, choice.artifacts, backends), Sample(feeds, origin)]
    log.info("pipeline %s: proving the candidates for %s on %s", pipeline.name, choice.model, origin)
    decision = _decide_on(config, pipeline, choice, samples)
    if decision.checked and (cache or record) and owns_state_dir(config):
        store = DecisionStore(config.state_dir)
        store.put(choice.key, decision, pipeline.name if record else None, choice.model, cache=cache)
    return replace(choice, decision=decision, cached=False, screened=True)


def _decide_on(
    config: AgentConfig,
    pipeline: PipelineConfig,
    choice: Choice,
    samples: Sequence[Sample],
    progress: Progress | None = None,
) -> Decision:
    """`decide` among the choice's candidates under its policy, proven on `samples` and judged as
    the pipeline reports (pipeline_judge)."""
    judge = pipeline_judge(config, pipeline, choice.artifacts, choice.box.backends)
    notes = hardware_notes(choice.box.hardware)
    return decide(
        choice.artifacts,
        choice.policy,
        samples,
        choice.box.backends,
        hardware=notes,
        progress=progress,
        judge=judge,
    )


def make_prover(
    config: AgentConfig, pipeline: PipelineConfig, choice: Choice, testdata: Sequence[TestData] = ()
) -> Prover:
    """For a pipeline whose choice is not proven (no sample when it was built): a function that
    proves the candidates on one of its frames (prove_on)."""

    def prove(feeds: Mapping[str, np.ndarray]) -> Decision:
        return prove_on(config, pipeline, choice, feeds, testdata).decision

    return prove


class DecisionSwitcher:
    """Runtime fallback along a decision's order (agent.pipeline.BackendSwitcher).

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
