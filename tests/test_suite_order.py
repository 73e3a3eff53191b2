"""The suite hands out its longest files first (tests/conftest.py's pytest_collection_modifyitems,
pyproject.toml's --no-loadscope-reorder): scripts/test.sh runs whole files on two workers, and
pytest-xdist's own order (most tests first) put the one-test files last, among them the longest of the
suite, so one worker ran them alone at the end while the other idled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A few real files, in alphabetical (collection) order: two of the longest, a file with a test marked
# slow, and quick files with many and with one test.
FILES = [
    "tests/test_fleet_many_agents.py",  # one test, the second longest
    "tests/test_fleet_speed_judgement.py",  # one test, the longest
    "tests/test_frugal.py",  # one of its tests is marked slow
    "tests/test_readme_suite_time.py",  # one quick test
    "tests/test_small_helpers.py",  # a few quick tests
    "tests/test_zones.py",  # many quick tests
]


def _collected(*options: str) -> list[str]:
    """The test ids in the order pytest (and so each xdist worker) has them, and the options it ran with."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *options, *FILES],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def _files(ids: list[str]) -> list[str]:
    order: list[str] = []
    for test_id in ids:
        name = test_id.split("::", 1)[0]
        if not order or order[-1] != name:
            assert name not in order, f"{name}'s tests are not together"
            order.append(name)
    return order


def test_the_longest_files_come_first_then_those_with_a_slow_test_then_the_most_tests() -> None:
    ids = _collected()
    counts = {name: sum(i.startswith(name + "::") for i in ids) for name in FILES}
    assert _files(ids) == [
        "tests/test_fleet_speed_judgement.py",
        "tests/test_fleet_many_agents.py",
        "tests/test_frugal.py",
        *sorted(
            ["tests/test_readme_suite_time.py", "tests/test_small_helpers.py", "tests/test_zones.py"],
            key=lambda name: -counts[name],
        ),
    ]
    assert counts["tests/test_zones.py"] > counts["tests/test_small_helpers.py"] > 1


def test_xdist_keeps_that_order(pytestconfig: pytest.Config) -> None:
    """pytest-xdist sorts the files by their number of tests unless told not to (pyproject.toml)."""
    assert pytestconfig.getoption("loadscopereorder") is False
