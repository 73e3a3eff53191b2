"""What object filters dropped (a pipeline's `filters:`, agent/steps/filter.py): counts per rule and
per label and rule, and the boxes kept, as the filter step's status shows them, and the same in words
for `edge-agent status` and `edge-agent infer`. Plain counting, no numpy: the CLI reads it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any


class Drops:
    """What a pipeline's filter steps dropped, since the pipeline started: the pipeline's, so a new
    stage (a new model version, a changed config) counts on. The report thread counts, a status
    request reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: Counter[str] = Counter()
        self.by_label: dict[str, Counter[str]] = {}
        self.kept = 0

    def count(self, kept: int, dropped: list[tuple[str, str]]) -> None:
        """A frame's: how many boxes were kept, and (label, rule) of each one dropped."""
        with self._lock:
            self.kept += kept
            for label, rule in dropped:
                self.dropped[rule] += 1
                self.by_label.setdefault(label, Counter())[rule] += 1

    def to_dict(self) -> dict[str, Any]:
        """{"dropped": {rule: n}, "by_label": {label: {rule: n}}, "kept": n}."""
        with self._lock:
            return {
                "dropped": dict(self.dropped),
                "by_label": {label: dict(rules) for label, rules in self.by_label.items()},
                "kept": self.kept,
            }


def drops_text(shown: Mapping[str, Any]) -> str:
    """`to_dict`'s counts in words: `kept 40, dropped 15: min_area 12 (person 10, car 2), mask 3 (car)`,
    by rule with the labels each dropped (their counts when more than one)."""
    dropped: Mapping[str, int] = shown.get("dropped") or {}
    by_label: Mapping[str, Mapping[str, int]] = shown.get("by_label") or {}
    rules = []
    for rule, count in dropped.items():
        labels = {label: of[rule] for label, of in by_label.items() if rule in of}
        which = ", ".join(labels) if len(labels) == 1 else ", ".join(f"{k} {n}" for k, n in labels.items())
        rules.append(f"{rule} {count}" + (f" ({which})" if which else ""))
    text = f"kept {shown.get('kept', 0)}, dropped {sum(dropped.values())}"
    return text + (": " + ", ".join(rules) if rules else "")
