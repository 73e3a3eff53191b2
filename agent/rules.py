"""Report rules: which results are worth publishing (pipeline `report:` in YAML).

Applied in order to each result the model makes: min_score, on_change, min_interval_s, every_n.
A result a rule holds back is counted under that rule's name, and the next published result says
how many were held back since the previous one, so a receiver knows what it did not see.
"""

from __future__ import annotations

from typing import Any

from agent.config import ReportConfig

RULES = ("min_score", "on_change", "min_interval_s", "every_n")


def best_score(output: dict[str, Any]) -> float:
    """The highest score in a classification, detection or regions output (0 when there is none)."""
    if "active" in output:  # threshold
        return float(output["score"])
    scored = output.get("top") or output.get("detections") or output.get("regions") or []
    return max((float(item["score"]) for item in scored), default=0.0)


def outcome(output: dict[str, Any], min_score: float | None = None) -> tuple[str, ...]:
    """What a result says, for on_change: the top label, the labels found (index when unlabelled),
    or how many regions reach min_score."""
    if "active" in output:  # threshold: on_change publishes the start and end events
        return ("active",) if output["active"] else ("idle",)
    if "regions" in output:
        floor = min_score or 0.0
        return (str(sum(1 for r in output["regions"] if float(r["score"]) >= floor)),)
    if "top" in output:
        top = output["top"][0] if output["top"] else None
        return () if top is None else (str(top["label"] if top["label"] is not None else top["index"]),)
    floor = min_score or 0.0
    found = {
        str(d["label"] if d["label"] is not None else d["index"])
        for d in output.get("detections", [])
        if float(d["score"]) >= floor
    }
    return tuple(sorted(found))


class ReportRules:
    """One pipeline's rules and what they held back. One caller at a time (the pipeline's worker)."""

    def __init__(self, config: ReportConfig) -> None:
        self.config = config
        self.held_back = dict.fromkeys(RULES, 0)
        self.held_since_last = 0  # held back since the last published result
        self._last_outcome: tuple[str, ...] | None = None
        self._last_published_at: float | None = None
        self._let_through = 0  # results that passed the first three rules (for every_n)

    def check(self, output: dict[str, Any], captured_at: float) -> str | None:
        """None: publish this result (and remember it). Else the name of the rule that holds it back."""
        rule = self._holding_rule(output, captured_at)
        if rule is not None:
            self.held_back[rule] += 1
            self.held_since_last += 1
            return rule
        self._last_outcome = outcome(output, self.config.min_score)
        self._last_published_at = captured_at
        return None

    def take_held_count(self) -> int:
        """For a result to publish: how many were held back since the previous one (then 0 again)."""
        held, self.held_since_last = self.held_since_last, 0
        return held

    def _holding_rule(self, output: dict[str, Any], captured_at: float) -> str | None:
        config = self.config
        if config.min_score is not None and best_score(output) < config.min_score:
            return "min_score"
        if config.on_change and outcome(output, config.min_score) == self._last_outcome:
            return "on_change"
        last = self._last_published_at
        if config.min_interval_s and last is not None and captured_at - last < config.min_interval_s:
            return "min_interval_s"
        self._let_through += 1
        if (self._let_through - 1) % config.every_n:
            return "every_n"
        return None
