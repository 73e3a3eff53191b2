"""Capped exponential backoff, shared by everything that retries (sources, pipeline builds, the MQTT
reconnect, the registry's HTTP client)."""

from __future__ import annotations

import random
from typing import Literal

# How much of the delay is left to chance: none; "full", anywhere from 0 to it (AWS's "full jitter":
# many clients that failed together spread out the most); "half", anywhere from half of it to it
# (never much sooner than planned).
Jitter = Literal["none", "full", "half"]


def backoff_delay(attempt: int, first_s: float, max_s: float, jitter: Jitter = "none") -> float:
    """first_s, 2*first_s, 4*first_s, ... capped at max_s, for attempt 1, 2, 3, ...; with `jitter`,
    a random delay up to that one (`Jitter`).

    The exponent is bounded too, so a retry loop that runs for months never overflows.
    """
    delay = min(first_s * 2.0 ** min(max(attempt - 1, 0), 30), max_s)
    if jitter == "full":
        return random.uniform(0, delay)
    if jitter == "half":
        return random.uniform(delay / 2, delay)
    return delay
