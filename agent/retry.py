"""Capped exponential backoff, shared by everything that retries (sources, pipeline builds)."""

from __future__ import annotations


def backoff_delay(attempt: int, first_s: float, max_s: float) -> float:
    """first_s, 2*first_s, 4*first_s, ... capped at max_s, for attempt 1, 2, 3, ...

    The exponent is bounded too, so a retry loop that runs for months never overflows.
    """
    return min(first_s * 2.0 ** min(max(attempt - 1, 0), 30), max_s)
