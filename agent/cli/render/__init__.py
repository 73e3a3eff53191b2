"""How the commands show things to people: rich tables and plain text (--json never comes here).
One module per noun; the helpers they share are here."""

from __future__ import annotations

import json
from typing import Any

INSPECT_VALUE_CHARS = 60  # longer metadata values are cut in tables (--json has them whole)


def cut(value: Any, limit: int = INSPECT_VALUE_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain_table(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    """A rich table of plain text (no markup read from model data); long cells wrap, never cut."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
    return table


def say(console: Any, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def num(value: float | None, fmt: str = ".2f") -> str:
    return "" if value is None else format(value, fmt)


def yes(value: bool) -> str:
    return "yes" if value else "no"
