"""Try one backend on one artifact: load, warm up, time it, keep its outputs.

`run_trial_isolated` does it in a child process with a timeout, so a driver that hangs or a
runtime that crashes natively costs that candidate, never the daemon.
"""

from __future__ import annotations

import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from providers.base import BackendError, ModelArtifact, Session


@dataclass(frozen=True)
class TrialRequest:
    backend: str
    artifact: ModelArtifact
    feeds: Mapping[str, np.ndarray]
    options: Mapping[str, Any] = field(default_factory=dict)
    warmup: int = 3
    runs: int = 20  # at least this many timed runs ...
    min_time_s: float = 0.0  # ... and at least this long (fast models need many runs for a stable median)
    budget_s: float = 10.0  # but stop timing after this long
    # Options timed as well, on a second session loaded beside and run in turn with the main one: a
    # variant the selection may prefer (one CPU thread fewer, providers/select/ spare_core_variant).
    # None: no variant.
    variant: Mapping[str, Any] | None = None


@dataclass
class TrialResult:
    backend: str
    ok: bool
    error: str = ""
    precision: str = ""
    load_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    compute_ms: list[float] = field(default_factory=list)  # the runtime's own timer, where it has one
    variant_ms: list[float] = field(default_factory=list)  # latencies with the request's variant
    variant_error: str = ""  # why the variant could not be timed

    def percentile(self, q: float, values: list[float] | None = None) -> float | None:
        """A percentile of the wall-clock latencies (or of `values`)."""
        values = self.latencies_ms if values is None else values
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.latencies_ms) if self.latencies_ms else None


def run_trial(request: TrialRequest) -> TrialResult:
    """In this process: load, warm up, time `runs` runs for at least `min_time_s` (within `budget_s`).
    A variant (request.variant) is loaded beside and timed in turn with the main options, run for
    run: a busy spell of a shared box then slows both alike, not whichever was being timed."""
    from providers.registry import get_backend

    try:
        backend = get_backend(request.backend)
        started = time.perf_counter()
        session = backend.load(request.artifact, request.options)
        load_s = time.perf_counter() - started
    except Exception as exc:
        return _failed(request.backend, exc)
    variant: Session | None = None
    variant_error = ""
    if request.variant:
        try:
            variant = backend.load(request.artifact, {**request.options, **request.variant})
            variant.run(request.feeds)
        except Exception as exc:  # the main options work: the variant is only not taken
            variant_error = f"{type(exc).__name__}: {exc}"
            if variant is not None:
                variant.close()
                variant = None
    try:
        timed = _timed(session, variant, request)
        precision = session.precision
    except Exception as exc:
        return _failed(request.backend, exc)
    finally:
        session.close()
        if variant is not None:
            variant.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    return TrialResult(
        request.backend, True, precision=precision, load_s=load_s, latencies_ms=timed.latencies_ms,
        outputs=timed.outputs, peak_rss_mb=peak_mb, compute_ms=timed.compute_ms, variant_ms=timed.variant_ms,
        variant_error=variant_error or timed.variant_error,
    )  # fmt: skip


def _failed(backend: str, exc: Exception) -> TrialResult:
    """A trial that failed: our own errors by their message, a runtime's with its type."""
    if isinstance(exc, (BackendError, KeyError)):
        return TrialResult(backend, False, str(exc).strip("'\""))
    return TrialResult(backend, False, f"{type(exc).__name__}: {exc}")


@dataclass
class _Timings:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # the session's last
    latencies_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)  # the runtime's own timer, where it has one
    variant_ms: list[float] = field(default_factory=list)
    variant_error: str = ""  # the variant failed while timed: only it is dropped


def _timed(session: Session, variant: Session | None, request: TrialRequest) -> _Timings:
    """Warm up, then time runs as the request says, the variant's (if any) in turn with the session's.
    A variant that fails on the way is dropped, its error kept: the main options still count."""
    timings = _Timings()

    def run_variant() -> None:
        nonlocal variant
        assert variant is not None
        try:
            variant.run(request.feeds)
        except Exception as exc:
            timings.variant_error = f"{type(exc).__name__}: {exc}"
            timings.variant_ms.clear()
            variant = None

    for _ in range(max(1, request.warmup)):
        timings.outputs = session.run(request.feeds)
        if variant is not None:
            run_variant()
    begun = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        timings.outputs = session.run(request.feeds)
        now = time.perf_counter()
        timings.latencies_ms.append((now - t0) * 1000)
        if session.compute_ms is not None:
            timings.compute_ms.append(session.compute_ms)
        if variant is not None:
            run_variant()
            if variant is not None:
                timings.variant_ms.append((time.perf_counter() - now) * 1000)
            now = time.perf_counter()
        enough = len(timings.latencies_ms) >= max(1, request.runs) and now - begun >= request.min_time_s
        if enough or now - begun >= request.budget_s:
            break
    return timings


def run_trial_isolated(request: TrialRequest, timeout_s: float) -> TrialResult:
    """`run_trial` in a fresh Python process (`python -m providers.trial`), bounded by `timeout_s`.

    A new interpreter rather than fork: the daemon has threads, and a forked copy of their locks
    can deadlock; and rather than multiprocessing's spawn, which re-imports the caller's main module.
    Request and result travel as pickles in a private temp dir; the child's stderr is kept for the
    reason when it crashes.
    """
    with tempfile.TemporaryDirectory(prefix="edge-agent-trial-") as tmp:
        request_path, result_path = Path(tmp) / "request.pickle", Path(tmp) / "result.pickle"
        request_path.write_bytes(pickle.dumps(request))
        command = [sys.executable, "-m", "providers.trial", str(request_path), str(result_path)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return TrialResult(
                request.backend, False, f"no answer within {timeout_s:g} s (hung while loading or running)"
            )
        if done.returncode == 0 and result_path.exists():
            result: TrialResult = pickle.loads(result_path.read_bytes())
            return result
        how = (
            f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
        )
        tail = " ".join(done.stderr.decode(errors="replace").split()[-40:])
        return TrialResult(request.backend, False, f"the trial process crashed ({how}): {tail}"[:500])


def _main(argv: list[str]) -> int:
    # Run as __main__, this file's classes would pickle as "__main__.TrialResult": use the
    # importable module's, which the parent can unpickle.
    import providers.trial as trial

    request: TrialRequest = pickle.loads(Path(argv[0]).read_bytes())
    Path(argv[1]).write_bytes(pickle.dumps(trial.run_trial(request)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
