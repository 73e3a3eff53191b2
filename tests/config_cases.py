"""The agent configs the config tests share: configs/ (the example, the demo template), a valid pipeline
block, the bad configs with the exact `FILE:LINE: key.path: message` problems each gives (checked by
tests/test_config.py against the validator and by tests/test_config_schema.py against the JSON Schema),
writing and loading a config, and the JSON Schema's judgement beside the validator's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agent.config_loader import config_data, config_json_schema, load_config, parse_config
from agent.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "agent.example.yaml"
DEMO = REPO / "configs" / "demo.yaml"

TOP_KEYS = (
    "backends, device, fleet, home_assistant, log_format, log_level, mqtt, pipelines, registry, "
    "snapshots, state_dir, state_topics, store, telemetry, web"
)
SOURCE_KEYS = "fps, loop, realtime, reopen_max_s, reopen_min_s, type, uri"
NAME_RULE = (
    "is not a valid name: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit "
    "(names become MQTT topic levels and file names)"
)


def bad_name(value: str) -> str:
    return f"{value!r} {NAME_RULE}"


def write(tmp_path: Path, text: str, name: str = "agent.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={} if environ is None else environ)
    problems = info.value.problems
    assert info.value.message == "\n".join(problems)
    return problems


# --- bad configs: one case each, (yaml, [(line, "key.path: message"), ...]) ----------------------

# A valid pipeline block (lines 3-9 of the documents that use it); cases edit one line of it.
PIPELINE = textwrap.dedent(
    """\
    registry:
      url: file:///srv/registry
    pipelines:
      - name: cam
        model: {name: m, version: "1"}
        source: {type: video, uri: "0"}
        postprocess: {type: raw}
    """
)

BAD_CONFIGS: dict[str, tuple[str, list[tuple[int, str]]]] = {
    "unknown_top_level_key": (
        """
        device:
          id: box-1
        mqqt:
          port: 1883
        """,
        [(3, f"mqqt: unknown key; did you mean 'mqtt'? (allowed here: {TOP_KEYS})")],
    ),
    "unknown_key_in_pipeline_source": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source:
              type: video
              uri: /dev/video0
              fsp: 5
            postprocess: {type: raw}
        """,
        [(11, f"pipelines[0].source.fsp: unknown key; did you mean 'fps'? (allowed here: {SOURCE_KEYS})")],
    ),
    "unknown_key_without_close_match": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            postprocess:
              type: raw
              top_k: 3
        """,
        [(11, "pipelines[0].postprocess.top_k: unknown key (allowed here: max_values, type)")],
    ),
    "string_for_int": (
        """
        device:
          id: box-1
        mqtt:
          keepalive_s: often
        """,
        [
            (4, 'mqtt.keepalive_s: expected a whole number, got the text "often"'),
        ],
    ),
    "port_out_of_range": (
        """
        device:
          id: box-1
        mqtt:
          host: broker.local
          port: 99999
        """,
        [(5, "mqtt.port: Input should be less than or equal to 65535 (got 99999)")],
    ),
    "outbox_below_minimum": (
        """
        device:
          id: box-1
        mqtt:
          outbox:
            max_messages: 10
        """,
        [(5, "mqtt.outbox.max_messages: Input should be greater than or equal to 100 (got 10)")],
    ),
    "missing_device_id": (
        """
        device:
          groups: [lobby]
        log_level: info
        """,
        [(1, "device.id: required key is missing")],
    ),
    "missing_device_section": (
        """
        log_level: info
        """,
        [(1, "device: required key is missing")],
    ),
    "missing_model_version_in_second_pipeline": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            postprocess: {type: raw}
          - name: cam2
            model:
              name: m
            source: {type: video, uri: "1"}
            postprocess: {type: raw}
        """,
        [(11, "pipelines[1].model.version: required key is missing")],
    ),
    "postprocess_without_type": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            postprocess:
              top_k: 3
        """,
        [
            (
                9,
                "pipelines[0].postprocess: required key 'type' is missing "
                "(one of: classification, detection, regions, threshold, plugin, ctc, embedding, raw)",
            )
        ],
    ),
    "unknown_source_type": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source:
              type: webcam
              uri: "0"
            postprocess: {type: raw}
        """,
        [
            (
                8,
                "pipelines[0].source: unknown type 'webcam'; "
                "expected one of: video, audio, mqtt, replay, serial",
            )
        ],
    ),
    "bad_protocol": (
        """
        device:
          id: box-1
        mqtt:
          protocol: 4
        """,
        [(4, "mqtt.protocol: Input should be '5' or '3.1.1' (got '4')")],
    ),
    "bad_layout": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            preprocess:
              layout: chw
            postprocess: {type: raw}
        """,
        [(10, "pipelines[0].preprocess.layout: Input should be 'nchw' or 'nhwc' (got 'chw')")],
    ),
    "bad_log_level": (
        """
        device:
          id: box-1
        log_level: verbose
        """,
        [(3, "log_level: Input should be 'debug', 'info', 'warning' or 'error' (got 'verbose')")],
    ),
    "duplicate_pipeline_names": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            postprocess: {type: raw}
          - name: cam
            model: {name: m, version: "2"}
            source: {type: video, uri: "1"}
            postprocess: {type: raw}
        """,
        [(5, "pipelines: pipeline name 'cam' is used twice")],
    ),
    "duplicate_yaml_key": (
        """
        device:
          id: box-1
        mqtt:
          host: a.local
          port: 1883
          host: b.local
        """,
        [(6, "mqtt.host: duplicate key (first at line 4)")],
    ),
    "unset_env_var_without_default": (
        """
        device:
          id: box-1
        mqtt:
          host: ${MQTT_HOST}
        """,
        [
            (
                4,
                "mqtt.host: environment variable MQTT_HOST is not set "
                "(write ${MQTT_HOST:-default} to give a default)",
            )
        ],
    ),
    "pipeline_name_with_slash": (
        "device:\n  id: box-1\n" + PIPELINE.replace("name: cam", "name: lobby/cam"),
        [(6, f"pipelines[0].name: {bad_name('lobby/cam')}")],
    ),
    "pipeline_name_with_hash": (
        # unquoted on purpose: `#` not preceded by a space is part of a plain scalar, not a comment
        "device:\n  id: box-1\n" + PIPELINE.replace("name: cam", "name: cam#2"),
        [(6, f"pipelines[0].name: {bad_name('cam#2')}")],
    ),
    "device_group_with_plus": (
        """
        device:
          id: box-1
          groups:
            - lobby
            - floor+1
        """,
        [(5, f"device.groups[1]: {bad_name('floor+1')}")],
    ),
    "registry_unsupported_scheme": (
        "device:\n  id: box-1\n" + PIPELINE.replace("file:///srv/registry", "ftp://models.example.com/reg"),
        [
            (
                4,
                "registry.url: expected a file://, http://, https:// or oci:// registry URL, "
                "e.g. file:///srv/registry, https://models.example.com/registry "
                "or oci://registry.example.com/edge-models",
            )
        ],
    ),
    "pipelines_without_registry": (
        """
        device:
          id: box-1
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            postprocess: {type: raw}
        """,
        [(1, "(top): pipelines name registry models, so a registry is required (or give model.path)")],
    ),
    "tls_cert_without_key": (
        """
        device:
          id: box-1
        mqtt:
          port: 8883
          tls:
            ca_file: /etc/edge-agent/ca.crt
            cert_file: /etc/edge-agent/client.crt
        """,
        [(5, "mqtt.tls: cert_file and key_file must be given together")],
    ),
    "password_without_username": (
        """
        device:
          id: box-1
        mqtt:
          host: broker.local
          password: hunter2
        """,
        [(3, "mqtt: password given without username")],
    ),
    "password_file_without_username": (
        """
        device:
          id: box-1
        mqtt:
          password_file: /etc/edge-agent/mqtt.pw
        """,
        [(3, "mqtt: password_file given without username")],
    ),
    "password_and_password_file": (
        """
        device:
          id: box-1
        mqtt:
          username: edge
          password: hunter2
          password_file: /etc/edge-agent/mqtt.pw
        """,
        [(3, "mqtt: give password or password_file, not both")],
    ),
    "sensor_source_password_and_password_file": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: vib
            model: {name: m, version: "1"}
            source:
              type: mqtt
              topic: plant/vibration
              username: sensors
              password: hunter2
              password_file: /etc/edge-agent/sensors.pw
            preprocess: {type: series}
            postprocess: {type: raw}
        """,
        [(8, "pipelines[0].source: give password or password_file, not both")],
    ),
    "sensor_source_password_file_without_username": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: vib
            model: {name: m, version: "1"}
            source: {type: mqtt, topic: plant/vibration, password_file: /etc/edge-agent/sensors.pw}
            preprocess: {type: series}
            postprocess: {type: raw}
        """,
        [(8, "pipelines[0].source: password_file given without username")],
    ),
    "client_id_with_a_wildcard": (
        """
        device:
          id: box-1
        mqtt:
          client_id: "edge+box"
        """,
        [(4, "mqtt.client_id: 'edge+box' holds '+': a client id must be printable, without '+', '#' or '/'")],
    ),
    "client_id_with_hash_and_slash": (
        """
        device:
          id: box-1
        mqtt:
          client_id: "site/box#1"
        """,
        [
            (
                4,
                "mqtt.client_id: 'site/box#1' holds '#', '/': a client id must be printable, without '+', "
                "'#' or '/'",
            )
        ],
    ),
    "client_id_empty": (
        """
        device:
          id: box-1
        mqtt:
          client_id: ""
        """,
        [(4, "mqtt.client_id: must not be empty (leave it out for edge-agent-<device id>)")],
    ),
    "client_id_too_long": (
        f"""
        device:
          id: box-1
        mqtt:
          client_id: {"c" * 129}
        """,
        [(4, "mqtt.client_id: is 129 characters long; at most 128 are allowed")],
    ),
    "client_id_not_printable": (
        """
        device:
          id: box-1
        mqtt:
          client_id: "box\\t1\\n"
        """,
        [
            (
                4,
                "mqtt.client_id: 'box\\t1\\n' holds '\\t', '\\n': a client id must be printable, without "
                "'+', '#' or '/'",
            )
        ],
    ),
    "reconnect_max_below_min": (
        """
        device:
          id: box-1
        mqtt:
          reconnect_min_s: 10
          reconnect_max_s: 2
        """,
        [(3, "mqtt: reconnect_max_s must be >= reconnect_min_s")],
    ),
    "mean_of_wrong_length": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            preprocess:
              color: rgb
              mean: [0.5, 0.5]
            postprocess: {type: raw}
        """,
        [(9, "pipelines[0].preprocess: mean needs 1 or 3 values for color rgb, got 2")],
    ),
    "gray_with_three_std_values": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            preprocess:
              color: gray
              std: [0.5, 0.5, 0.5]
            postprocess: {type: raw}
        """,
        [(9, "pipelines[0].preprocess: std needs 1 value for color gray, got 3")],
    ),
    "std_containing_zero": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0"}
            preprocess:
              std: [0.5, 0, 0.5]
            postprocess: {type: raw}
        """,
        [(9, "pipelines[0].preprocess: std values must not be 0")],
    ),
    "empty_source_uri": (
        """
        device:
          id: box-1
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source:
              type: video
              uri: "  "
            postprocess: {type: raw}
        """,
        [(10, "pipelines[0].source.uri: uri must not be empty")],
    ),
    "unquoted_float_version": (
        "device:\n  id: box-1\n" + PIPELINE.replace('version: "1"', "version: 2.0"),
        [(7, 'pipelines[0].model.version: expected a string, got the number 2.0: write it in quotes, "2.0"')],
    ),
    "pipelines_not_a_list": (
        """
        device:
          id: box-1
        pipelines:
          cam: {}
        """,
        [(3, 'pipelines: Input should be a valid list (got {"cam": {}})')],
    ),
    "non_string_key": (
        """
        device:
          id: box-1
        1883: port
        """,
        [(3, "(top): key 1883 must be a string")],
    ),
    "several_errors_in_document_order": (
        """
        device:
          id: box 1
        mqtt:
          port: 0
          keepalive_s: 1
          outbox:
            max_inflight: lots
        registry:
          url: file:///srv/registry
        pipelines:
          - name: cam
            model: {name: m, version: "1"}
            source: {type: video, uri: "0", fps: 0}
            postprocess:
              type: classification
              top_k: 0
              labelz: [a, b]
        """,
        [
            (2, f"device.id: {bad_name('box 1')}"),
            (4, "mqtt.port: Input should be greater than or equal to 1 (got 0)"),
            (5, "mqtt.keepalive_s: Input should be greater than or equal to 5 (got 1)"),
            (7, 'mqtt.outbox.max_inflight: expected a whole number, got the text "lots"'),
            (13, "pipelines[0].source.fps: Input should be greater than 0 (got 0)"),
            (16, "pipelines[0].postprocess.top_k: Input should be greater than or equal to 1 (got 0)"),
            (
                17,
                "pipelines[0].postprocess.labelz: unknown key; did you mean 'labels'? "
                "(allowed here: labels, output, softmax, top_k, type)",
            ),
        ],
    ),
    "batching_settings": (
        """
        device:
          id: box-1
        backends:
          batching: sometimes
          max_batch: 1
        """,
        [
            (4, "backends.batching: Input should be 'auto' or 'off' (got 'sometimes')"),
            (5, "backends.max_batch: Input should be greater than or equal to 2 (got 1)"),
        ],
    ),
    "telemetry_too_often": (
        """
        device:
          id: box-1
        telemetry:
          interval_s: 0.5
        """,
        [(4, "telemetry.interval_s: must be 0 (off) or at least 1 second")],
    ),
    "several_unset_env_vars": (
        """
        device:
          id: ${DEVICE_ID}
          groups:
            - lobby
            - ${GROUP}
        mqtt:
          host: ${MQTT_HOST:-localhost}
          username: ${MQTT_USER}
        """,
        [
            (
                2,
                "device.id: environment variable DEVICE_ID is not set "
                "(write ${DEVICE_ID:-default} to give a default)",
            ),
            (
                5,
                "device.groups[1]: environment variable GROUP is not set "
                "(write ${GROUP:-default} to give a default)",
            ),
            (
                8,
                "mqtt.username: environment variable MQTT_USER is not set "
                "(write ${MQTT_USER:-default} to give a default)",
            ),
        ],
    ),
}


# --- the JSON Schema beside the validator ----------------------------------------------------------

SCHEMA = config_json_schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def schema_problems(data: Any) -> list[str]:
    return sorted(
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in VALIDATOR.iter_errors(data)
    )


def assert_both_accept(text: str, source: str) -> None:
    parse_config(text, source=source, environ={})  # `config validate` says OK ...
    assert schema_problems(config_data(text, source, environ={})) == [], source  # ... and so does the schema


def assert_both_reject(text: str, source: str) -> None:
    with pytest.raises(ConfigError):
        parse_config(text, source=source, environ={})
    assert schema_problems(config_data(text, source, environ={})), f"the schema accepts {source}"


def validate_cli(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    """`edge-agent config validate` on `text` written as agent.yaml: its exit code and its problems,
    each `LINE: key.path: message` (the file's path cut off); never a traceback."""
    from typer.testing import CliRunner

    from agent.cli import app

    path = tmp_path / "agent.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    prefix = f"error: {path}:"
    lines = [line.removeprefix(prefix) for line in result.output.splitlines() if line.startswith(prefix)]
    assert "Traceback" not in result.output
    return result.exit_code, lines
