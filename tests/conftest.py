pytest_plugins = [
    "tests.mqtt_fixtures",
    "tests.store_fixtures",
    "tests.media_fixtures",
    "tests.agent_process",
    "tests.pki",
    "tests.oci_registry",
]
