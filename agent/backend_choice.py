"""Choosing a pipeline's backend on this box: policy from the config, a real sample from the
pipeline's own source, the decision proven by `providers.decide`, cached and explained.

The decision is cached in `<state_dir>/decisions/` keyed by the model's artifact hashes, this
box's hardware fingerprint, the runtimes' versions and the policy, so a restart does not
benchmark again, and a driver upgrade or a new accelerator does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
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
from agent.transform import upgraded_artifacts
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
    REFERENCE_BACKENDS,
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

    def put(self, key: str, decision: Decision, pipeline: str, model: str, cache: bool = True) -> None:
        """Record the pipeline's decision (for `explain`); with `cache` also under its key, for the
        next start to reuse (an unchecked decision is only recorded: it is made again)."""
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

    def forget(self, pipeline: str) -> bool:
        """Drop the cached decision the pipeline last used, so its next build decides again; False
        when there was none cached."""
        record = self.for_pipeline(pipeline)
        key = record.get("key") if record else None
        if not isinstance(key, str):
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
) -> tuple[Session, Decision, list[ModelArtifact]]:
    """Decide (or reuse the cached decision) and load the chosen backend in this process.

    `prove_later`: with no cached decision, take the CPU reference at once, unproven (the caller
    proves the candidates on a live frame beside it: make_prover), instead of running trials first.

    Candidates are proven on the model's test data (`testdata`: archives with the model file each
    is for) where it fits, else on a frame from the pipeline's own source (`peek`: see _samples).
    `progress` hears each step (trials, engine builds) before it starts. Returns the session, the
    decision, and the artifacts it chose among (derived ones included).

    Pipelines on the same model decide one at a time: the second finds the first's proven decision
    in the cache instead of deciding again (or guessing by rank when its own source is dead).
    """
    say = progress or (lambda _text: None)
    hardware = detect_hardware()
    backends = box_backends(config, hardware)
    policy = policy_for(config, pipeline, backends)
    cpu_reference = next((b for b in backends if b.name == REFERENCE_BACKENDS[0]), None)
    if cpu_reference is not None:  # old opsets the reference refuses get an upgraded twin
        derived_dir = config.state_dir / "store" / "derived"
        artifacts = [*artifacts, *upgraded_artifacts(artifacts, derived_dir, cpu_reference)]
    store = DecisionStore(config.state_dir)
    key = decision_key(artifacts, testdata, policy, backends, hardware)
    decision = store.get(key)
    samples: list[Sample] = []
    no_frame = False
    if decision is None and policy.benchmark and prove_later:
        log.info(
            "pipeline %s: no proven decision for %s yet: serving on the CPU reference while the "
            "candidates are proven on its first frame",
            pipeline.name,
            model_ref,
        )
    elif decision is None and policy.benchmark:
        say("getting inputs to prove backends on")
        samples, no_frame = _samples(config, pipeline, artifacts, testdata, backends, peek)
    with _deciding(key):
        # Another pipeline on this model may have proven a decision while this one waited for a frame.
        cached = decision or store.get(key)
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
        if cached is None and prove_later and policy.benchmark:
            # Serving on the reference needs no other runtime: the candidates are screened (every
            # runtime loaded to check the model's operators) when a frame proves them.
            quick = reference_first(artifacts, policy, backends)
            if quick is not None:
                try:
                    session = load_decided(quick, artifacts, policy, backends, progress, load)[0]
                except BackendError as exc:
                    log.info("pipeline %s: %s; screening every candidate", pipeline.name, exc)
                else:
                    store.put(key, quick, pipeline.name, model_ref, cache=False)
                    return session, quick, list(artifacts)
        if cached is None:
            log.info(
                "pipeline %s: choosing a backend for %s%s",
                pipeline.name,
                model_ref,
                f" (benchmarking the top candidates on {', '.join(s.origin for s in samples)})"
                if samples
                else "",
            )
            notes = hardware_notes(hardware)
            judge = pipeline_judge(config, pipeline, artifacts, backends) if samples else None
            try:
                decision = decide(
                    artifacts, policy, samples, backends, hardware=notes, progress=progress, judge=judge
                )
            except NoBackendError as exc:
                store.put_refusal(exc, pipeline.name, model_ref)
                raise
            # An unchecked choice is recorded for explain but made again next time.
            store.put(key, decision, pipeline.name, model_ref, cache=decision.checked or not policy.benchmark)
        else:
            decision = cached
            log.info("pipeline %s: using the cached backend decision %s", pipeline.name, key)
            # Recorded for this pipeline too: `explain` shows it, reselect-backend finds what to forget.
            store.put(key, decision, pipeline.name, model_ref, cache=False)
    session, used, failures = load_decided(decision, artifacts, policy, backends, progress, load)
    for failure in failures:
        log.warning("pipeline %s: %s; falling back to the next backend", pipeline.name, failure)
    if used.backend != decision.backend:
        decision.note = (
            decision.note + "; " if decision.note else ""
        ) + f"running on fallback {used.backend}"
    return session, decision, list(artifacts)


def check_on_testdata(
    session: Session,
    artifact_sha256: str,
    testdata: Sequence[TestData],
    artifacts: Sequence[ModelArtifact],
    policy: SelectionPolicy,
    backends: Sequence[Backend] | None = None,
) -> int:
    """Run the loaded session on every test set that fits its artifact and compare with the expected
    outputs at the test data's tolerances: the proof a version gets on this box when the decision
    did not run trials (benchmarking off). Returns the number of sets checked; ModelError naming
    the set and the difference when one is wrong."""
    checked = 0
    artifact = next((a for a in artifacts if a.sha256 == artifact_sha256), None)
    if artifact is None:
        return 0
    readers = all_backends() if backends is None else backends
    for sample in testdata_samples(testdata, [artifact], readers):
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


def make_prover(
    config: AgentConfig,
    pipeline: PipelineConfig,
    artifacts: Sequence[ModelArtifact],
    model_ref: str,
    testdata: Sequence[TestData] = (),
) -> Prover:
    """For a pipeline whose decision could not be checked (no sample when it was built): a function
    that decides again on one of its frames (plus its test data) and caches the checked decision."""
    hardware = detect_hardware()
    backends = box_backends(config, hardware)
    policy = policy_for(config, pipeline, backends)
    key = decision_key(artifacts, testdata, policy, backends, hardware)

    def prove(feeds: Mapping[str, np.ndarray]) -> Decision:
        samples = [
            *testdata_samples(testdata, artifacts, backends),
            Sample(feeds, "a frame from the pipeline's source"),
        ]
        log.info(
            "pipeline %s: proving the candidates for %s on a frame from its source", pipeline.name, model_ref
        )
        judge = pipeline_judge(config, pipeline, artifacts, backends)
        decision = decide(
            artifacts, policy, samples, backends, hardware=hardware_notes(hardware), judge=judge
        )
        if decision.checked:
            DecisionStore(config.state_dir).put(key, decision, pipeline.name, model_ref)
        return decision

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
        self._upgrade: Session | None = None
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
        self.decision, self.order = decision, decision.order()
        self._prove = None
        log.info("proved on a frame: %s", decision.explain())
        if decision.backend == current:
            return
        if self.warm_up_feeds is None:
            self.warm_up_feeds = feeds  # inputs the pipeline really makes
        session = self._load(0)
        if session is not None:
            with self._upgrade_lock:
                self._upgrade = session

    def take_upgrade(self) -> Session | None:
        """A session on the candidate a frame proved, once it is loaded (the worker swaps it in)."""
        with self._upgrade_lock:
            session, self._upgrade = self._upgrade, None
        return session

    def _load(self, index: int) -> Session | None:
        report = self.order[index]
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

    def _index(self, name: str) -> int:
        return next((i for i, c in enumerate(self.order) if c.backend == name), len(self.order))

    def fallback(self, failed: str) -> Session | None:
        self._demote(failed)
        for i in range(len(self.order)):
            if self.order[i].backend in self._demoted:
                continue
            session = self._load(i)
            if session is not None:
                return session
        return None

    def retry_preferred(self, current: str) -> Session | None:
        now = time.monotonic()
        for i in range(self._index(current)):
            name = self.order[i].backend
            if name in self._demoted and self._demoted[name][1] > now:
                continue
            session = self._load(i)
            if session is not None:
                self._demoted.pop(name, None)
                return session
        return None
