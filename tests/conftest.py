import logging

import pytest

# Fixture modules, each listed after those it imports: pytest rewrites a plugin's asserts only when it
# imports the module first.
pytest_plugins = [
    "tests.mqtt_fixtures",
    "tests.media_fixtures",
    "tests.store_fixtures",
    "tests.agent_process",
    "tests.pki",
    "tests.oci_registry",
    "tests.daemon_fixtures",
    "tests.selection_fixtures",
]


# The longest files (--durations on the 2-core box, 2026-11-29), longest first. scripts/test.sh runs
# whole files on two workers: a long file handed out last keeps one core busy while the other idles.
LONGEST_FILES = (
    "test_fleet_speed_judgement.py",  # ~100 s
    "test_fleet_many_agents.py",  # 60-105 s
    "test_backend_test_models.py",  # ~90 s
    "test_side_by_side.py",  # ~70 s
    "test_one_choice.py",  # ~55 s
    "test_cli_backends.py",  # ~45 s
    "test_daemon_e2e.py",  # ~45 s
    "test_zone_edits.py",  # ~40 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest work first, so the run ends on short files with both workers busy: LONGEST_FILES, then
    files with a test marked slow, then the rest, each group by its number of tests (pytest-xdist's
    own order, which pyproject.toml's --no-loadscope-reorder keeps from sorting everything by count
    alone: that put the one-test files, the longest among them, last). A file's tests stay together
    and in their order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(name: str) -> tuple[int, int, int]:
        base = name.rsplit("/", 1)[-1]
        if base in LONGEST_FILES:
            return (0, LONGEST_FILES.index(base), 0)
        slow = any(item.get_closest_marker("slow") for item in files[name])
        return (1 if slow else 2, 0, -len(files[name]))

    items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


@pytest.fixture(autouse=True)
def _root_log_level_restored() -> object:
    """A test that runs the CLI in-process sets the root logger's level (setup_logging: e.g. `error`);
    the tests after it in the same worker would then see no WARNING in caplog. Each test starts from
    the level the worker started with."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)
