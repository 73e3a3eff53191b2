"""The base layer's small helpers that several layers share: agent/text.py `clip` and
agent/logfmt.py `first_or_every`."""

from __future__ import annotations

from agent.logfmt import first_or_every
from agent.text import clip


def test_clip_keeps_a_short_text_and_cuts_a_long_one_to_the_limit() -> None:
    assert clip("short", 10) == "short"
    assert clip("x" * 10, 10) == "x" * 10
    assert clip("abcdefghijk", 10) == "abcdefg..."
    assert clip("a" * 700, 600, " ... (clipped)") == "a" * 586 + " ... (clipped)"
    assert all(len(clip("y" * n, 40)) == min(n, 40) for n in range(100))


def test_first_or_every_logs_the_first_then_every_nth() -> None:
    assert [n for n in range(1, 451) if first_or_every(n)] == [1, 100, 200, 300, 400]
    assert [n for n in range(1, 31) if first_or_every(n, every=10)] == [1, 10, 20, 30]
