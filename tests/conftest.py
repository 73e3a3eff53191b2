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
