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


@pytest.fixture(autouse=True)
def _root_log_level_restored() -> object:
    """A test that runs the CLI in-process sets the root logger's level (setup_logging: e.g. `error`);
    the tests after it in the same worker would then see no WARNING in caplog. Each test starts from
    the level the worker started with."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)
