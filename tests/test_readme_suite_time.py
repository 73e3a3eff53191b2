"""README's suite time is a measurement, dated, whose minutes agree with its seconds, and no older than
the last CI run on record (issue 34, item 13: README said 6-7 minutes, then 11-12, while CI took 17).
When CI is measured again, write the new figure and its date in README and here."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# The last CI run measured (a clean clone's `.ci/run` timed whole, 2026-11-29 10:16-10:33 UTC: 1987
# passed): a fresh clone, set-up, ruff, mypy and every test (scripts/test.sh), on the project's 2-core
# machine.
LAST_CI_S, LAST_CI_ON = 1040, date(2026, 11, 29)

CLAIM = re.compile(r"The last CI run \((\d{4}-\d\d-\d\d):[^)]*\) took (\d+) s, about (\d+) minutes")


def test_readme_states_the_last_ci_runs_time_with_its_date() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    claim = CLAIM.search(text)
    assert claim, "README must say 'The last CI run (YYYY-MM-DD: ...) took N s, about M minutes'"
    on, seconds, minutes = date.fromisoformat(claim[1]), int(claim[2]), int(claim[3])
    assert (on, seconds) == (LAST_CI_ON, LAST_CI_S)
    assert round(seconds / 60) == minutes, (seconds, minutes)
    # No other figure for the whole suite beside it (the old "takes about 11-12 minutes" was one).
    assert not re.search(r"suite takes about \d+(-\d+)? minutes", text)
