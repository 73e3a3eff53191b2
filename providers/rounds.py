"""Candidates timed in interleaved rounds (A B, B A, A B ...), each loaded once in its own process.

A trial times one candidate at a time: a neighbour busy during the second one candidate was timed
makes it lose, for good. Timed in turns, a busy spell costs one turn of one candidate: each turn's
median is one figure, a candidate's speed is the median of its turns (one spiked turn does not move
it) and its spread the interquartile range of its turns (how much the box moved meanwhile). The order
is reversed every other round, so a load that rises or falls through the rounds favours nobody.

Each candidate runs in a child process (`python -m providers.rounds REQUEST`), as a trial does: a
runtime that crashes costs its own figures, never the daemon. The child answers on a private copy
of its stdout (the real stdout goes to stderr: a runtime's own prints cannot corrupt the answers).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from providers.cpu_load import CpuLoad, CpuUse
from providers.trial import TrialRequest

TURN_MAX_RUNS = 1000  # one turn runs at most this many times, however fast the model
# (round, backend, the child's pid) -> what runs around that candidate's turn (tests force a spike)
AroundTurn = Callable[[int, str, int], contextlib.AbstractContextManager[object]]


@dataclass
class RoundsResult:
    backend: str
    ok: bool = True
    error: str = ""
    turns_ms: list[list[float]] = field(default_factory=list)  # each turn's latencies

    @property
    def turn_medians(self) -> list[float]:
        return [statistics.median(turn) for turn in self.turns_ms if turn]

    @property
    def median_ms(self) -> float | None:
        """The median of the turns' medians: a spiked turn does not move it."""
        medians = self.turn_medians
        return statistics.median(medians) if medians else None

    @property
    def spread_ms(self) -> float | None:
        """The interquartile range of the turns' medians (0 with fewer than 3 turns, where the
        turns are too few to have quartiles: the caller's own margin applies)."""
        medians = sorted(self.turn_medians)
        if not medians:
            return None
        if len(medians) < 3:
            return 0.0
        return _at(medians, 75) - _at(medians, 25)

    def percentile(self, q: float) -> float | None:
        runs = sorted(ms for turn in self.turns_ms for ms in turn)
        return _at(runs, q) if runs else None


@dataclass
class Rounds:
    """Every candidate's turns, and the box's CPU use while they ran."""

    results: list[RoundsResult]
    rounds: int
    cpu: CpuUse | None = None


Timer = Callable[[Sequence[TrialRequest], int, float, float], Rounds]


def _at(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def time_in_rounds(
    requests: Sequence[TrialRequest],
    rounds: int,
    turn_s: float,
    timeout_s: float,
    around_turn: AroundTurn | None = None,
) -> Rounds:
    """Load every request's candidate in its own process (warmed up by request.warmup runs), then
    `rounds` rounds: in each, every candidate in turn runs for `turn_s` (at least once). A child
    that fails to load, crashes or stays silent for `timeout_s` is dropped from the rounds, with
    its reason; the others go on."""
    workers = [_Worker(request) for request in requests]
    try:
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.wait_ready(deadline)
        load = CpuLoad([worker.pid for worker in workers])
        for r in range(rounds):
            for worker in workers if r % 2 == 0 else reversed(workers):
                if not worker.result.ok:
                    continue
                hook = around_turn(r, worker.request.backend, worker.pid) if around_turn else None
                with hook or contextlib.nullcontext():
                    worker.turn(turn_s, timeout_s)
        return Rounds([w.result for w in workers], rounds, load.use())
    finally:
        for worker in workers:
            worker.close()


class _Worker:
    """One candidate's child process and its turns so far."""

    def __init__(self, request: TrialRequest) -> None:
        self.request = request
        self.result = RoundsResult(request.backend)
        self._dir = tempfile.TemporaryDirectory(prefix="edge-agent-rounds-")
        request_path = Path(self._dir.name) / "request.pickle"
        request_path.write_bytes(pickle.dumps(request))
        self._stderr = open(Path(self._dir.name) / "stderr", "w+b")  # noqa: SIM115 (closed in close())
        self._process = subprocess.Popen(
            [sys.executable, "-m", "providers.rounds", str(request_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.pid = self._process.pid

    def wait_ready(self, deadline: float) -> None:
        answer = self._answer(max(0.0, deadline - time.monotonic()), "loading")
        if answer is not None and answer.get("error"):
            self._fail(str(answer["error"]))

    def turn(self, turn_s: float, timeout_s: float) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(f"{turn_s}\n".encode())
            stdin.flush()
        except OSError as exc:
            self._fail(f"the timing process is gone: {exc}")
            return
        answer = self._answer(turn_s + timeout_s, "a timed turn")
        if answer is not None:
            self.result.turns_ms.append([float(ms) for ms in answer["ms"]])

    def _answer(self, timeout_s: float, doing: str) -> dict[str, Any] | None:
        stdout: IO[bytes] | None = self._process.stdout
        assert stdout is not None
        if not self.result.ok:
            return None
        readable, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline() if readable else b""
        if line:
            answer: dict[str, Any] = json.loads(line)
            return answer
        if not readable:
            self._fail(f"no answer within {timeout_s:g} s ({doing})")
        else:
            code = self._process.wait(timeout=5)
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            self._fail(f"the timing process crashed while {doing} ({how}): {self._stderr_tail()}")
        return None

    def _fail(self, error: str) -> None:
        if self.result.ok:
            self.result.ok, self.result.error = False, error[:500]
        self.close()

    def _stderr_tail(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return " ".join(self._stderr.read().decode(errors="replace").split()[-40:])

    def close(self) -> None:
        """End the child (EOF on its stdin: it exits) and wait for it, so its CPU time is counted."""
        if self._process.poll() is None:
            with contextlib.suppress(OSError):
                if self._process.stdin is not None:
                    self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if not self._stderr.closed:
            self._stderr.close()
        self._dir.cleanup()


def _serve(request: TrialRequest) -> int:
    """The child: load, warm up, say ready; then per line on stdin (a turn's seconds) run the model
    that long (at least once) and answer its latencies; exit at EOF."""
    from providers.registry import get_backend

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a runtime's prints go to stderr, never into the answers

    def answer(value: object) -> None:
        answers.write(json.dumps(value) + "\n")
        answers.flush()

    try:
        session = get_backend(request.backend).load(request.artifact, request.options)
        for _ in range(max(1, request.warmup)):
            session.run(request.feeds)
    except Exception as exc:
        answer({"error": f"{type(exc).__name__}: {exc}"})
        return 0
    answer({"ready": True})
    for line in sys.stdin:
        turn_s = float(line)
        latencies: list[float] = []
        begun = time.perf_counter()
        while len(latencies) < TURN_MAX_RUNS:
            t0 = time.perf_counter()
            session.run(request.feeds)
            now = time.perf_counter()
            latencies.append((now - t0) * 1000)
            if now - begun >= turn_s:
                break
        answer({"ms": latencies})
    session.close()
    return 0


if __name__ == "__main__":
    import providers.rounds as rounds  # the importable module's classes (see providers/trial.py)

    sys.exit(rounds._serve(pickle.loads(Path(sys.argv[1]).read_bytes())))
