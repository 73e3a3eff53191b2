"""What `edge-agent explain` says of a record (agent/tools/explain.py's, or a running daemon's
`Supervisor.serving_records`): where the model runs or would, why, and every candidate's verdict.

One wording of those facts for every reader: the CLI prints it with rich (agent/cli/render/backends.py
`print_explanation`), the web page's models page as HTML (agent/web/models_page.py). Text comes as
spans, (text, bold), so each renders emphasis its own way and escapes what it must.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from providers import Decision
from providers.select import CandidateReport, spare_core_note

Span = tuple[str, bool]  # (text, bold)
Line = list[Span]

CANDIDATE_COLUMNS = (
    "backend", "artifact", "verdict", "median ms", "spread ms", "precision", "max diff", "reason",
)  # fmt: skip
UNLOCK_COLUMN = "would pass with"


@dataclass(frozen=True)
class Explained:
    """A record for people: the title line, the lines under it, and the candidates' table (None:
    no table)."""

    title: Line
    lines: list[Line]
    candidates: list[CandidateReport] | None = None


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "" if value is None else format(value, fmt)


def candidate_rows(candidates: list[CandidateReport]) -> tuple[list[str], list[list[str]]]:
    """The candidates' table: its columns (the last, "would pass with", only where some candidate
    has such a setting) and a row of text each."""
    unlock = any(c.unlock for c in candidates)
    columns = [*CANDIDATE_COLUMNS, *([UNLOCK_COLUMN] if unlock else [])]
    rows = []
    for c in candidates:
        row = [
            c.backend,
            c.artifact,
            c.verdict,
            _num(c.median_ms),
            _num(c.spread_ms),
            c.precision or "",
            _num(c.max_abs_diff, ".2g"),
            "; ".join(part for part in (c.reason, spare_core_note(c)) if part),
        ]
        rows.append(row + ([c.unlock or ""] if unlock else []))
    return columns, rows


def explained(record: dict[str, Any]) -> Explained:
    """What `edge-agent explain` says of one record."""
    title: Line = [(record["pipeline"] or record["model"], True)]
    if record["pipeline"]:
        title.append((f" ({record['model']})", False))
    if record.get("attribute"):  # a second model of the pipeline (its `attributes:`)
        title = [(record["pipeline"], True), (" attribute ", False), (record["attribute"], True)]
        title.append((f" ({record['model']})", False))
    if "error" in record:
        left = "left out, the pipeline serves without it" if record.get("live") else "not to be had here"
        return Explained([*title, (f": {left}", False)], [[(record["error"], False)]])
    if "decision" not in record and "refused" not in record:  # the daemon's word, no record of its choice
        serving = record.get("serving") or {}
        said = f": serving now on {serving.get('backend')}, precision {serving.get('precision')}"
        why: list[Line] = [[(serving["why"], False)]] if serving.get("why") else []
        return Explained([*title, (said, False)], why)
    if "refused" in record:
        candidates = [CandidateReport(**c) for c in record["candidates"]]
        refused: list[Line] = [[(record["refused"], False)]]
        return Explained([*title, (": no backend serves it", False)], refused, candidates)
    decision = Decision.from_dict(record["decision"])
    serving = record.get("serving") or {}
    backend = serving.get("backend") or decision.backend
    artifact = serving.get("artifact") or decision.artifact
    precision = serving.get("precision") or decision.precision
    verb = "would serve first on" if record.get("prospective") else "runs on"
    if record.get("live"):
        verb = "serving now on"
    said = f": {verb} {backend} on {artifact}" + (f", precision {precision}" if precision else "")
    lines: list[Line] = []
    if record.get("prospective"):
        lines.append([("not proven yet: the daemon proves the candidates below, in this order, on the "
                       "version's test data or its first frame, and switches to the fastest correct one",
                       False)])  # fmt: skip
    elif not record.get("live") and "serving" in record:
        lines.append([("the cached decision: the next start serves it at once", False)])
    if backend != decision.backend:
        lines.append([(f"on a fallback: the decision chose {decision.backend}", False)])
    if decision.reference:
        checked = "checked" if decision.checked else "not checked"
        lines.append([(f"outputs {checked} against {decision.proof()}", False)])
    if decision.timing():
        lines.append([(decision.timing(), False)])
    if decision.note:
        lines.append([(f"note: {decision.note}", False)])
    if not decision.checked and not record.get("prospective"):
        compared = ": no candidate's outputs were compared with a reference"
        lines.append([("unchecked", True), (compared, False)])
    return Explained([*title, (said, False)], lines, decision.candidates)
