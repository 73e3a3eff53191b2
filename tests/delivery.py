"""Counting a pipeline's results at a watcher by their `seq` (1, 2, 3, ... per pipeline, taken in the
transaction that stores a result, so a gap is a loss): what arrived, what is missing, duplicates and
arrivals out of order. Shared by tests/test_reliability.py, scripts/probe_faults.py and
scripts/soak_broker.py; pure functions, tested in tests/test_soak_report.py."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def seqs(messages: Iterable[Any]) -> list[int]:
    """The `seq` of each received result (anything with a JSON `payload`), in arrival order."""
    return [int(json.loads(message.payload)["seq"]) for message in messages]


@dataclass(frozen=True)
class Delivery:
    produced: int  # the highest seq made (the agent's count, or the highest seen when not given)
    received: int  # distinct seqs that arrived
    missing: list[int]  # seqs in 1..produced that never arrived
    duplicates: int  # arrivals of a seq that had arrived before
    out_of_order: int  # arrivals with a lower seq than the arrival before
    # After de-duplication (each seq's first arrival only): arrivals lower than the one before. A
    # resend of what was in flight when a link dropped is a duplicate, not disorder; the backlog
    # drained beside live results after a long outage is (outbox.backlog_share).
    out_of_order_first: int = 0

    @property
    def lost(self) -> int:
        return len(self.missing)


def count_delivery(arrivals: Sequence[int], produced: int | None = None) -> Delivery:
    """What `arrivals` (seqs in arrival order) say about seqs 1..produced (default: the highest seen)."""
    distinct = set(arrivals)
    last = max(distinct, default=0) if produced is None else produced
    return Delivery(
        produced=last,
        received=len(distinct),
        missing=sorted(set(range(1, last + 1)) - distinct),
        duplicates=len(arrivals) - len(distinct),
        out_of_order=sum(1 for a, b in itertools.pairwise(arrivals) if b < a),
        out_of_order_first=sum(1 for a, b in itertools.pairwise(dict.fromkeys(arrivals)) if b < a),
    )


def as_ranges(numbers: Iterable[int]) -> str:
    """`[3, 4, 5, 9]` -> "3-5, 9": missing seqs, readably."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
