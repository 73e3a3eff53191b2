"""What selection says: each candidate's `CandidateReport`, the explained `Decision`, and
`NoBackendError` when nothing can run the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from providers.base import BackendError
from providers.cpu_load import CpuUse


@dataclass
class CandidateReport:
    backend: str
    artifact: str  # label
    format: str
    sha256: str
    verdict: str  # "chosen", "rejected", "passed" (correct, not chosen), "untried"
    reason: str = ""
    rank: int | None = None
    precision: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    max_abs_diff: float | None = None
    peak_rss_mb: float | None = None
    unlock: str = ""  # rejected for its outputs: what would let it through
    # Timed with one core fewer too (spare_core_variant), and at most SPARE_CORE_SLOWDOWN slower that
    # way: the threads it runs with, and its median on the runtime's default threads (median_ms and
    # p90_ms are then those with `threads`). None: it runs on the runtime's default threads.
    threads: int | None = None
    default_threads_ms: float | None = None
    # Timed side by side with the other correct candidates (providers/rounds.py): the interquartile
    # range of its turns' medians (median_ms is then their median). None: timed alone in its trial.
    spread_ms: float | None = None
    # A reduced-precision variant (VariantArtifact): the float model file it was made from, and how
    # many times faster it ran than the fastest correct float candidate on the same backend.
    variant_of: str = ""
    speedup: float | None = None


@dataclass
class Decision:
    backend: str
    artifact_sha256: str
    artifact: str
    precision: str | None
    candidates: list[CandidateReport]
    reference: str | None = None  # the backend whose outputs were the reference
    checked: bool = False  # outputs compared with the reference on a real sample
    note: str = ""
    inputs: str = ""  # where the sample the chosen candidate was proven on came from
    # How the speeds were measured: in how many interleaved rounds (0: each candidate alone in its
    # trial), and how busy the box's CPU was meanwhile (all of it, and by other processes).
    rounds: int = 0
    cpu_busy_percent: float | None = None
    cpu_others_percent: float | None = None
    # What the candidates' outputs were judged on: "detections" (max_abs_diff: box pixels), "top-k"
    # (scores), "" (tensors, or a decision from before).
    judged_on: str = ""

    def explain(self) -> str:
        head = f"chose {self.backend} for {self.artifact}"
        chosen = next((c for c in self.candidates if c.verdict == "chosen"), None)
        if chosen and chosen.median_ms is not None:
            speed = f"{chosen.median_ms:.2f} ms median{_spread(chosen)}"
            head += f" ({speed}, {chosen.precision}{_spare_core(chosen)})"
        if self.reference and self.checked:
            head += f"; outputs checked against {self.proof()}"
        if self.timing():
            head += f"; {self.timing()}"
        if chosen and chosen.variant_of:
            head += f"; {self.variant_note(chosen)}"
        if self.note:
            head += f"; {self.note}"
        # Candidates with the same verdict for the same reason share one entry: a fixed backend
        # rejects a dozen others alike, and the line should say so once.
        others: dict[tuple[str, str], list[str]] = {}
        for c in self.candidates:
            if c.verdict != "chosen":
                verdict = (
                    f"{c.verdict}{_numbers(c)}"
                    + (f": {c.reason}" if c.reason else "")
                    + (f" (would pass with {c.unlock})" if c.unlock else "")
                )
                others.setdefault((c.artifact, verdict), []).append(c.backend)
        entries = [
            f"{', '.join(backends)} on {artifact}: {verdict}"
            for (artifact, verdict), backends in others.items()
        ]
        return head + (f" (others: {'; '.join(entries)})" if entries else "")

    def variant_note(self, report: CandidateReport) -> str:
        """ "int8 variant of 320n.onnx: 1.7x, boxes within 0.6 px" for a variant that passed."""
        speed = f"{report.speedup:.1f}x" if report.speedup is not None else "not timed against it"
        within = reports_within(self.judged_on, report.max_abs_diff)
        return f"{report.precision} variant of {report.variant_of}: {speed}" + (
            f", {within}" if within else ""
        )

    def timing(self) -> str:
        """How the speeds were measured: "timed side by side in 5 rounds while the box's CPU was 85 %
        busy (5 % by other processes)"; "" where nothing was timed (or a decision from before)."""
        if self.cpu_busy_percent is None:
            return ""
        how = f"timed side by side in {self.rounds} rounds" if self.rounds else "timed"
        return f"{how} while {CpuUse(self.cpu_busy_percent, self.cpu_others_percent).describe()}"

    def proof(self) -> str:
        """What the outputs were checked against, and on which inputs."""
        if self.inputs and self.reference and self.inputs not in self.reference:
            return f"{self.reference} on {self.inputs}"
        return self.reference or ""

    def order(self) -> list[CandidateReport]:
        """Usable candidates, best first: the chosen one, then those that passed, then untried."""
        rank = {"chosen": 0, "passed": 1, "untried": 2}
        usable = [c for c in self.candidates if c.verdict in rank]
        return sorted(usable, key=lambda c: (rank[c.verdict], c.rank if c.rank is not None else 1 << 30))

    def artifact_on(self, backend: str) -> str | None:
        """The artifact a session on `backend` runs: the chosen one on the chosen backend, else the
        best of its order on that backend (a fallback); None when the decision has none there."""
        return next((c.artifact for c in self.order() if c.backend == backend), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        values = dict(data)
        values["candidates"] = [CandidateReport(**c) for c in values.get("candidates", [])]
        return cls(**values)


class NoBackendError(BackendError):
    def __init__(self, candidates: list[CandidateReport]) -> None:
        reasons = "; ".join(
            f"{c.backend} on {c.artifact}: {c.reason}"
            + (f" (would pass with {c.unlock})" if c.unlock else "")
            for c in candidates
        )
        super().__init__(f"no backend can run this model ({reasons or 'no backends are registered'})")
        self.candidates = candidates


def reports_within(judged_on: str, diff: float | None) -> str:
    """How far a candidate's reports are from the reference's, in their units: "boxes within 0.6 px"
    (detections), "scores within 0.02" (top-k), else "max diff 0.3"; "" without a difference."""
    if diff is None:
        return ""
    units = {
        "detections": f"boxes within {diff:.2g} px",
        "top-k": f"the same top-k, scores within {diff:.2g}",
    }
    return units.get(judged_on, f"max diff {diff:.2g}")


def spare_core_note(report: CandidateReport) -> str:
    """ "1 thread, one core left to the pipeline (1.53 ms on the default threads)" where its trial chose
    one core fewer, else ""."""
    if report.threads is None or report.default_threads_ms is None:
        return ""
    threads = f"{report.threads} thread" + ("s" if report.threads > 1 else "")
    default = f"{report.default_threads_ms:.2f} ms on the default threads"
    return f"{threads}, one core left to the pipeline ({default})"


def _spare_core(report: CandidateReport) -> str:
    note = spare_core_note(report)
    return f", {note}" if note else ""


def _spread(report: CandidateReport) -> str:
    return f" ±{report.spread_ms:.2g}" if report.spread_ms is not None else ""


def _numbers(report: CandidateReport) -> str:
    parts = []
    if report.median_ms is not None:
        parts.append(f"{report.median_ms:.2f} ms{_spread(report)}")
    if report.precision:
        parts.append(report.precision + _spare_core(report))
    if report.max_abs_diff is not None:
        parts.append(f"max diff {report.max_abs_diff:.2g}")
    return f" ({', '.join(parts)})" if parts else ""
