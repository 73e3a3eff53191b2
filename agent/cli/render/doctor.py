"""`doctor` for people: a row per check, OK, WARN or FAIL with its fix."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from agent.cli.render import say

if TYPE_CHECKING:
    from agent.tools.doctor.core import Check


_SHA256 = re.compile(r"\b[0-9a-f]{64}\b")


def print_doctor(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from agent.tools.doctor.core import summary

    def shown(text: str) -> Text:
        return Text(_SHA256.sub(lambda m: m.group(0)[:12] + "…", text))  # --json has them whole

    styles = {"OK": "green", "WARN": "yellow", "FAIL": "bold red"}
    table = Table()
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")  # long paths wrap, never cut
    for check in checks:
        status = Text(check.status, style=styles[check.status])
        table.add_row(Text(check.name), status, shown(check.detail), shown(check.fix))
    console = Console()
    console.print(table)
    counts = summary(checks)
    say(console, f"{counts['ok']} OK, {counts['warn']} WARN, {counts['fail']} FAIL")
