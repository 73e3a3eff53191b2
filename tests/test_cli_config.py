"""`edge-agent config validate|schema`, run as the installed console script (a real subprocess)."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from agent.config_loader import config_json_schema
from tests.cli_runs import edge_agent

EDGE_AGENT = Path(sys.executable).parent / "edge-agent"
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "agent.example.yaml"

# Two problems on different lines: the CLI must print both.
BAD = """\
device:
  id: box-1
mqtt:
  port: 99999
  keepalive_s: 1
"""
BAD_PROBLEMS = [
    "{path}:4: mqtt.port: Input should be less than or equal to 65535 (got 99999)",
    "{path}:5: mqtt.keepalive_s: Input should be greater than or equal to 5 (got 1)",
]


def assert_user_error(result: subprocess.CompletedProcess[str], problems: list[str]) -> None:
    """Exit 1, every problem as its own `error: ` line on stderr, nothing on stdout, no traceback."""
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"error: {p}" for p in problems]


def test_console_script_is_installed() -> None:
    assert EDGE_AGENT.is_file()
    assert os.access(EDGE_AGENT, os.X_OK)


# --- config validate ---------------------------------------------------------------------------


def test_validate_good_config() -> None:
    result = edge_agent("config", "validate", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"OK: {EXAMPLE} (8 pipeline(s), device lobby-cam-01)\n"
    assert result.stderr == ""


def test_validate_good_config_json() -> None:
    result = edge_agent("config", "validate", "--json", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "ok": True,
        "file": str(EXAMPLE),
        "device": "lobby-cam-01",
        "pipelines": 8,
        "labels_unchecked": [],  # no zone, line or watch of it names a label only a model can give
    }


def test_validate_bad_config_single_problem(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device:\n  id: box-1\nmqtt:\n  port: 99999\n")
    result = edge_agent("config", "validate", str(path))
    assert_user_error(
        result, [f"{path}:4: mqtt.port: Input should be less than or equal to 65535 (got 99999)"]
    )


def test_validate_bad_config_prints_every_problem_as_an_error_line(tmp_path: Path) -> None:
    # ConfigError.message joins the problems with newlines; each line must carry its own `error: `
    # prefix so `grep ^error:` (and a person) sees every problem.
    path = tmp_path / "agent.yaml"
    path.write_text(BAD)
    result = edge_agent("config", "validate", str(path))
    assert_user_error(result, [p.format(path=path) for p in BAD_PROBLEMS])


def test_validate_bad_config_json(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(BAD)
    result = edge_agent("config", "validate", "--json", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["errors"] == [p.format(path=path) for p in BAD_PROBLEMS]


def test_validate_relative_path_is_reported_as_given(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text(BAD)
    result = edge_agent("config", "validate", "--json", "agent.yaml", cwd=tmp_path)
    assert json.loads(result.stdout)["errors"] == [p.format(path="agent.yaml") for p in BAD_PROBLEMS]


def test_validate_yaml_that_does_not_parse(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device:\n  id: box-1\nmqtt:\n  host: broker: 1883\n")
    result = edge_agent("config", "validate", str(path))
    assert_user_error(result, [f"{path}:4:15: YAML syntax error: mapping values are not allowed here"])


def test_validate_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    result = edge_agent("config", "validate", str(path))
    assert_user_error(result, [f"{path}: cannot read config file: No such file or directory"])


def test_validate_missing_file_json(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    result = edge_agent("config", "validate", "--json", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert json.loads(result.stdout)["errors"] == [
        f"{path}: cannot read config file: No such file or directory"
    ]


def test_validate_directory(tmp_path: Path) -> None:
    result = edge_agent("config", "validate", str(tmp_path))
    assert_user_error(result, [f"{tmp_path}: cannot read config file: Is a directory"])


def test_validate_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    result = edge_agent("config", "validate", str(path))
    assert_user_error(result, [f"{path}: cannot read config file: not UTF-8 text (byte 0)"])


def test_validate_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("")
    result = edge_agent("config", "validate", str(path))
    assert_user_error(result, [f"{path}:1: the config is empty; expected a mapping with at least 'device'"])


# --- config schema -----------------------------------------------------------------------------


@functools.cache
def _schema() -> dict[str, Any]:
    result = edge_agent("config", "schema")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    schema = json.loads(result.stdout)
    assert isinstance(schema, dict)
    return schema


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/"), ref
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node  # type: ignore[no-any-return]


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(schema: dict[str, Any], root: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """A small JSON Schema checker for the keywords pydantic emits (tests/test_config_schema.py checks
    every keyword, with the jsonschema library)."""
    if "$ref" in schema:
        return schema_errors(_resolve(root, schema["$ref"]), root, value, where)
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            results = [schema_errors(option, root, value, where) for option in schema[keyword]]
            matches = sum(not r for r in results)
            if matches == 1 or (keyword == "anyOf" and matches > 1):
                return []
            return [f"{where}: {matches} {keyword} options match", *min(results, key=len)]
    errors: list[str] = []
    types = schema["type"] if isinstance(schema.get("type"), list) else [schema.get("type", "any")]
    if "type" in schema and not any(_TYPES[kind](value) for kind in types):
        return [f"{where}: {value!r} is not of type {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if "minLength" in schema and isinstance(value, str) and len(value) < schema["minLength"]:
        errors.append(f"{where}: too short")
    bounds = [
        ("minimum", lambda v, b: v >= b),
        ("maximum", lambda v, b: v <= b),
        ("exclusiveMinimum", lambda v, b: v > b),
        ("exclusiveMaximum", lambda v, b: v < b),
    ]
    for keyword, ok in bounds:
        if keyword in schema and isinstance(value, (int, float)) and not ok(value, schema[keyword]):
            errors.append(f"{where}: {value!r} fails {keyword} {schema[keyword]}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{where}: {key!r} is required" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(properties[key], root, item, f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: {key!r} is not allowed")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], root, item, f"{where}[{index}]")
    return errors


def _example_data() -> dict[str, Any]:
    """The example as YAML data, with its ${VAR:-default} references replaced by their defaults."""
    data = yaml.safe_load(EXAMPLE.read_text())
    assert data["device"]["id"] == "${EDGE_DEVICE_ID:-lobby-cam-01}"
    assert data["mqtt"]["host"] == "${MQTT_HOST:-127.0.0.1}"
    data["device"]["id"] = "lobby-cam-01"
    data["mqtt"]["host"] = "127.0.0.1"
    assert "${" not in json.dumps(data)  # no other references left
    return data


def test_schema_is_json_with_the_top_level_sections() -> None:
    schema = _schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    sections = {
        "device",
        "mqtt",
        "registry",
        "backends",
        "telemetry",
        "store",
        "fleet",
        "state_topics",
        "home_assistant",
        "snapshots",
        "pipelines",
        "state_dir",
        "log_level",
        "log_format",
        "web",
    }
    assert sections == set(schema["properties"])
    assert schema["required"] == ["device"]
    assert schema["additionalProperties"] is False
    assert schema == json.loads(json.dumps(config_json_schema()))


def test_schema_structure() -> None:
    schema = _schema()
    defs = schema["$defs"]
    objects = {name: d for name, d in defs.items() if d.get("type") == "object"}
    assert len(objects) >= 10
    # Every nested object forbids unknown keys, like the config models do.
    assert {name for name, d in objects.items() if d.get("additionalProperties") is not False} == set()
    assert defs["DeviceConfig"]["required"] == ["id"]
    assert defs["RegistryConfig"]["required"] == ["url"]
    # A registry model (name, version) or a file on the box (path): what ModelRef's validator decides.
    assert "required" not in defs["ModelRef"]
    assert [option["required"] for option in defs["ModelRef"]["oneOf"]] == [["name", "version"], ["path"]]
    assert defs["PipelineConfig"]["required"] == ["name", "model", "source", "postprocess"]
    assert defs["MqttConfig"]["properties"]["port"]["maximum"] == 65535
    assert defs["OutboxConfig"]["properties"]["max_messages"]["default"] == 100_000
    postprocess = defs["PipelineConfig"]["properties"]["postprocess"]
    assert postprocess["discriminator"]["propertyName"] == "type"
    kinds = {"classification", "detection", "regions", "threshold", "plugin", "ctc", "embedding", "raw"}
    assert set(postprocess["discriminator"]["mapping"]) == kinds
    assert defs["MqttConfig"]["properties"]["topic_prefix"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def test_schema_accepts_the_example_config() -> None:
    schema = _schema()
    assert schema_errors(schema, schema, _example_data()) == []


def test_schema_accepts_a_full_dump_of_the_example_config() -> None:
    from agent.config_loader import load_config

    schema = _schema()
    dumped = load_config(EXAMPLE, environ={}).model_dump(mode="json")
    assert schema_errors(schema, schema, dumped) == []


def test_schema_rejects_what_the_loader_rejects() -> None:
    # Shows the checker above is not vacuous: each edit must produce exactly the expected complaint.
    schema = _schema()
    edits = {
        "$.mqtt.port: 99999 fails maximum 65535": lambda d: d["mqtt"].update(port=99999),
        "$.mqtt: 'mqqt' is not allowed": lambda d: d["mqtt"].update(mqqt=1),
        "$.device: 'id' is required": lambda d: d["device"].pop("id"),
        "$.pipelines[0].source.fps: 'five' is not of type number": lambda d: d["pipelines"][0][
            "source"
        ].update(fps="five"),
        "$.pipelines[1].name: 'raw/debug' does not match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$": lambda d: d[
            "pipelines"
        ][1].update(name="raw/debug"),
        "$.log_level: 'verbose' not in ['debug', 'info', 'warning', 'error']": lambda d: d.update(
            log_level="verbose"
        ),
    }
    base = _example_data()
    for expected, edit in edits.items():
        data = copy.deepcopy(base)
        edit(data)
        assert expected in schema_errors(schema, schema, data), expected
    data = copy.deepcopy(base)
    data["pipelines"][0]["postprocess"]["type"] = "detection"
    assert schema_errors(schema, schema, data)[0] == "$.pipelines[0].postprocess: 0 oneOf options match"
