"""agent/retry.py: the one capped exponential backoff, with its jitter options."""

from __future__ import annotations

import random

import pytest

from agent.retry import Jitter, backoff_delay


def test_without_jitter_the_delay_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(n, 1.0, 30.0) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(0, 0.5, 10.0) == 0.5  # before the first attempt: the first delay
    assert backoff_delay(10**6, 10.0, 600.0) == 600.0  # a loop that retried for months


@pytest.mark.parametrize(("jitter", "low"), [("full", 0.0), ("half", 0.5)])
def test_jitter_draws_from_its_share_of_the_delay(jitter: Jitter, low: float) -> None:
    random.seed(5)
    for attempt, planned in [(1, 0.5), (3, 2.0), (4, 4.0), (9, 5.0), (10**6, 5.0)]:
        draws = [backoff_delay(attempt, 0.5, 5.0, jitter=jitter) for _ in range(400)]
        assert all(low * planned <= d <= planned for d in draws)
        # Spread over the range (a fleet that failed together does not retry together).
        assert min(draws) < (low + 0.1) * planned and max(draws) > 0.9 * planned


def test_jitter_none_is_the_default() -> None:
    assert backoff_delay(3, 1.0, 60.0, jitter="none") == backoff_delay(3, 1.0, 60.0) == 4.0
