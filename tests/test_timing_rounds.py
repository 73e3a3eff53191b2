"""Candidates are timed side by side in interleaved rounds (providers/rounds.py), so a busy moment
during one candidate's turn does not decide the backend: real runtimes in real child processes, a
real model (PP-OCR's direction classifier) and a forced spike (the candidate's process held stopped
~95 % of the time during one turn, as a neighbour taking the CPU would)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from providers import TrialRequest, TrialResult
from providers.rounds import Rounds, RoundsResult, Timer, time_in_rounds
from providers.select import SelectionPolicy, decide
from providers.trial import run_trial
from tests.selection_fixtures import ORT_CPU, QUICK, artifact_of, report_of

OV_CPU = "openvino/CPU"
# f32 on OpenVINO (right on every CPU); no GPU/NPU/AUTO: the two CPU runtimes compete.
CPU_RUNTIMES = {"deny": ("*/GPU", "*/NPU", "*/AUTO"), "options": {OV_CPU: {"precision": "f32"}}}


@contextlib.contextmanager
def neighbour_takes_the_cpu(pid: int, on_s: float = 0.00025, off_s: float = 0.00475) -> Iterator[None]:
    """The process runs `on_s` in every `on_s + off_s` (stopped the rest): ~95 % of its CPU taken."""
    done = threading.Event()

    def throttle() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(off_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(on_s)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def spike_during(backend: str, in_round: int) -> Timer:
    """Rounds timed for real, with the spike on `backend`'s turn in round `in_round`."""

    def around(round_: int, name: str, pid: int) -> contextlib.AbstractContextManager[object]:
        return (
            neighbour_takes_the_cpu(pid)
            if (round_, name) == (in_round, backend)
            else contextlib.nullcontext()
        )

    return functools.partial(time_in_rounds, around_turn=around)


def requests_for(model: Path, sample: dict[str, np.ndarray], *backends: str) -> list[TrialRequest]:
    return [TrialRequest(b, artifact_of(model), sample, warmup=1) for b in backends]


def test_every_candidate_gets_a_turn_in_every_round_in_alternating_order(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    turns: list[tuple[int, str]] = []

    def record(round_: int, backend: str, pid: int) -> contextlib.AbstractContextManager[object]:
        assert pid > 0 and pid != os.getpid()
        turns.append((round_, backend))
        return contextlib.nullcontext()

    rounds = time_in_rounds(
        requests_for(cls_model_path, cls_sample, ORT_CPU, OV_CPU), 4, 0.02, 60, around_turn=record
    )
    assert turns == [(0, ORT_CPU), (0, OV_CPU), (1, OV_CPU), (1, ORT_CPU), (2, ORT_CPU), (2, OV_CPU),
                     (3, OV_CPU), (3, ORT_CPU)]  # fmt: skip
    assert rounds.rounds == 4
    for result in rounds.results:
        assert result.ok, result.error
        assert len(result.turns_ms) == 4 and all(len(turn) >= 1 for turn in result.turns_ms)
        assert result.median_ms is not None and result.median_ms > 0
        assert result.spread_ms is not None and result.spread_ms >= 0
    assert rounds.cpu is not None and 0 < rounds.cpu.busy_percent <= 100
    assert rounds.cpu.others_percent is not None and 0 <= rounds.cpu.others_percent <= rounds.cpu.busy_percent


def test_a_candidate_that_cannot_load_or_dies_is_dropped_with_its_reason_and_the_others_go_on(
    tmp_path: Path, cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    requests = [
        *requests_for(cls_model_path, cls_sample, ORT_CPU, OV_CPU),
        TrialRequest(ORT_CPU, artifact_of(broken), cls_sample),
    ]

    def kill_openvino(round_: int, backend: str, pid: int) -> contextlib.AbstractContextManager[object]:
        if (round_, backend) == (1, OV_CPU):
            os.kill(pid, signal.SIGKILL)
        return contextlib.nullcontext()

    ort, openvino, unreadable = time_in_rounds(requests, 3, 0.02, 60, around_turn=kill_openvino).results
    assert ort.ok and len(ort.turns_ms) == 3
    assert not openvino.ok and len(openvino.turns_ms) == 1
    assert "crashed while a timed turn (killed by signal 9)" in openvino.error
    assert not unreadable.ok and unreadable.turns_ms == []
    assert "broken.onnx" in unreadable.error or "INVALID" in unreadable.error.upper(), unreadable.error


def test_a_spiked_turn_does_not_move_the_median_of_the_turns() -> None:
    result = RoundsResult("x", turns_ms=[[1.0, 1.1], [1.0], [30.0, 31.0], [1.2], [0.9, 1.0]])
    assert result.median_ms == 1.05  # the medians 1.05, 1.0, 30.5, 1.2, 0.95
    assert result.spread_ms is not None and abs(result.spread_ms - (1.2 - 1.0)) < 1e-9
    assert RoundsResult("y", turns_ms=[[2.0], [3.0]]).spread_ms == 0.0  # too few turns for quartiles


def fixed_rounds(medians: dict[str, list[float]]) -> Timer:
    """A timer that runs nothing: each backend's turns took these medians (one run each)."""

    def timer(requests: Sequence[TrialRequest], rounds: int, turn_s: float, timeout_s: float) -> Rounds:
        return Rounds(
            [RoundsResult(r.backend, turns_ms=[[ms] for ms in medians[r.backend]]) for r in requests], rounds
        )

    return timer


def in_process_trial(request: TrialRequest, timeout_s: float) -> TrialResult:
    return run_trial(request)


def test_a_candidate_is_preferred_for_speed_only_when_it_is_faster_by_more_than_the_spread(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    """OpenVINO ranks first on a CPU: ONNX Runtime takes over only when it is faster by more than
    both spreads together."""
    policy = SelectionPolicy(**CPU_RUNTIMES, **{**QUICK, "spare_core": False})  # type: ignore[arg-type]
    artifact = artifact_of(cls_model_path)
    unsteady = {OV_CPU: [1.0, 1.4, 1.2, 0.9, 1.3], ORT_CPU: [0.9, 1.3, 1.0, 0.8, 1.1]}  # IQR 0.3 and 0.2
    decision = decide([artifact], policy, cls_sample, trial=in_process_trial, timer=fixed_rounds(unsteady))
    assert decision.backend == OV_CPU  # 1.2 against 1.0: within the spreads
    assert report_of(decision, ORT_CPU).spread_ms is not None
    assert abs((report_of(decision, ORT_CPU).spread_ms or 0) - 0.2) < 1e-9
    steady = {OV_CPU: [1.2, 1.21, 1.19, 1.2, 1.2], ORT_CPU: [1.0, 1.02, 0.98, 1.01, 0.99]}
    decision = decide([artifact], policy, cls_sample, trial=in_process_trial, timer=fixed_rounds(steady))
    assert decision.backend == ORT_CPU  # the same medians, measured steadily
    assert report_of(decision, ORT_CPU).median_ms == 1.0 and report_of(decision, OV_CPU).median_ms == 1.2
    assert "1.00 ms median ±0.02" in decision.explain()


def test_a_load_spike_during_one_candidates_turn_does_not_change_the_choice(
    cls_model_path: Path, cls_sample: dict[str, np.ndarray]
) -> None:
    """The real runtimes, timed in real child processes. The spike hits the winner's turn in one
    round of five: the same winner. Timed once each (as a single trial is), the same spike hands the
    choice to the other runtime: the spike is real, the rounds are what absorb it."""
    artifact = artifact_of(cls_model_path)
    policy = SelectionPolicy(**CPU_RUNTIMES, **{**QUICK, "rounds": 5, "turn_s": 0.1})  # type: ignore[arg-type]
    quiet = decide([artifact], policy, cls_sample)
    winner = quiet.backend
    other = ORT_CPU if winner == OV_CPU else OV_CPU
    assert report_of(quiet, other).verdict == "passed"  # both are correct: speed decides
    assert quiet.rounds == 5 and quiet.cpu_busy_percent is not None
    assert "timed side by side in 5 rounds while the box's CPU was" in quiet.explain()

    spiked = decide([artifact], policy, cls_sample, timer=spike_during(winner, 2))
    assert spiked.backend == winner, spiked.explain()

    once = SelectionPolicy(**CPU_RUNTIMES, **{**QUICK, "rounds": 1, "turn_s": 0.1})  # type: ignore[arg-type]
    timed_once = decide([artifact], once, cls_sample, timer=spike_during(winner, 0))
    assert timed_once.backend == other, timed_once.explain()
    assert (report_of(timed_once, winner).median_ms or 0) > 5 * (report_of(spiked, winner).median_ms or 0)
