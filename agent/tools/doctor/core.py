"""The report's rows: a `Check` (OK, WARN or FAIL with a fix), the exit code and --json of a
list of them, and `bounded`, which runs one check in a thread of its own with a time limit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from agent.errors import EdgeAgentError

log = logging.getLogger(__name__)

Status = Literal["OK", "WARN", "FAIL"]
OK: Status = "OK"
WARN: Status = "WARN"
FAIL: Status = "FAIL"
EXIT_CODES: dict[Status, int] = {OK: 0, WARN: 1, FAIL: 2}

SKIPPED = "not checked: config invalid"
SKIPPED_FIX = "fix the config first (see the config row)"


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, how it went, and what to do about it."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    seconds: float | None = None  # how long the check took


def exit_code(checks: list[Check]) -> int:
    """0 when every check is OK, 1 when some WARN (none FAIL), 2 when any FAIL."""
    return max((EXIT_CODES[c.status] for c in checks), default=0)


def summary(checks: list[Check]) -> dict[str, int]:
    return {status.lower(): sum(1 for c in checks if c.status == status) for status in EXIT_CODES}


def report(checks: list[Check]) -> dict[str, Any]:
    """The --json document."""
    return {
        "checks": [asdict(c) for c in checks],
        "summary": summary(checks),
        "exit_code": exit_code(checks),
    }


def bounded(name: str, check: Callable[[], Check | list[Check]], limit_s: float) -> list[Check]:
    """Run one check in a thread of its own for at most `limit_s`: one that hangs (a driver, a
    broker that never answers) is a FAIL row, and the thread is left behind (a daemon thread)."""
    outcome: list[list[Check]] = []

    def work() -> None:
        try:
            result = check()
            outcome.append(result if isinstance(result, list) else [result])
        except EdgeAgentError as exc:  # what the agent itself would say, with its hint
            outcome.append([Check(name, FAIL, exc.message, exc.hint or "")])
        except Exception as exc:  # a check's own failure is a row, never a traceback
            log.debug("doctor check %s failed", name, exc_info=True)
            outcome.append(
                [Check(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "report this")]
            )

    started = time.monotonic()
    thread = threading.Thread(target=work, name=f"doctor-{name}", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive() or not outcome:
        return [
            Check(
                name,
                FAIL,
                f"did not finish within {limit_s:g} s",
                "something this check waits for hangs; the agent would hang there too",
                round(time.monotonic() - started, 2),
            )
        ]
    seconds = round(time.monotonic() - started, 2)
    return [replace(c, seconds=seconds) for c in outcome[0]]
