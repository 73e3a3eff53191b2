"""Short texts for people: a long reason or error cut to what a table or a report has room for."""

from __future__ import annotations

ELLIPSIS = "..."


def clip(text: str, limit: int, marker: str = ELLIPSIS) -> str:
    """`text` when it has at most `limit` characters, else its start and `marker`, `limit` in all."""
    if len(text) <= limit:
        return text
    return text[: max(limit - len(marker), 0)] + marker
