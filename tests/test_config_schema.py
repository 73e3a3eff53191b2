"""The exported JSON Schema (`edge-agent config schema`, `config_json_schema`) and the validator
(`edge-agent config validate`, `parse_config`) accept and reject the same files, checked with the
jsonschema library as an editor (yaml-language-server) would check them: every config in configs/,
configs the tests' shared writers write (a test module's own writer is checked in that module, with
tests/config_cases.py's `assert_both_accept`), both kinds of `model:`; every bad config of
tests/config_cases.py the schema can say is bad. And configs/agent.example.yaml names every key the
schema has, and no other."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from agent.config_loader import config_data
from agent.errors import ConfigError
from tests.config_cases import (
    BAD_CONFIGS,
    DEMO,
    EXAMPLE,
    PIPELINE,
    SCHEMA,
    assert_both_accept,
    assert_both_reject,
    schema_problems,
)
from tests.daemon_fixtures import pipeline, write_config
from tests.store_fixtures import http_registry_config

# Bad configs of tests/config_cases.py the validator refuses for what no JSON Schema can say: a
# comparison between two values (each case's own test checks the validator's message).
BEYOND_A_SCHEMA = {
    "duplicate_pipeline_names": "names unique across the list's items",
    "reconnect_max_below_min": "one number not below another",
    "mean_of_wrong_length": "a list's length depending on another key's value",
    "gray_with_three_std_values": "a list's length depending on another key's value",
}


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


# --- accepted by both ---------------------------------------------------------------------------------


def _configs_dir(tmp_path: Path) -> list[Path]:
    demo = DEMO.read_text()  # a template: scripts/demo.sh fills it in
    rendered = tmp_path / "demo.yaml"
    rendered.write_text(demo.replace("@PORT@", "1883").replace("@WORK@", str(tmp_path)))
    return [EXAMPLE, rendered]


def _written_by_shared_writers(tmp_path: Path) -> list[Path]:
    """What the config writers of the tests' helper modules produce. A writer kept in one test module
    is checked there, beside it (`assert_both_accept` in test_cli_json, test_cli_polish, test_reload, ...)."""
    video, registry = tmp_path / "v.mp4", tmp_path / "registry"
    folders = [tmp_path / str(i) for i in range(2)]
    for folder in folders:
        folder.mkdir()
    return [
        write_config(folders[0], 1883, registry, [pipeline("cam", str(video))]),
        http_registry_config(folders[1], 8080, video),
    ]


def test_every_config_in_configs_and_those_the_shared_writers_write_pass_both(tmp_path: Path) -> None:
    paths = [*_configs_dir(tmp_path), *_written_by_shared_writers(tmp_path)]
    assert len(paths) == 4
    for path in paths:
        assert_both_accept(path.read_text(), str(path))


def test_the_good_configs_of_test_config_pass_both() -> None:
    assert_both_accept("device:\n  id: box-1\n" + PIPELINE, "PIPELINE")
    assert_both_accept("device: {id: box-1}\nmqtt: {protocol: 5}\n", "protocol as a YAML int")
    assert_both_accept(
        "device: {id: box-1}\npipelines:\n  - {name: c, model: {path: /m.onnx}, "
        "source: {type: video, uri: 0}, postprocess: {type: raw}}\n",
        "a V4L2 index as a YAML int",
    )


DEVICE_AND_REGISTRY = "device: {id: box-1}\nregistry: {url: 'file:///srv/registry'}\n"


def _with_model(model: str, registry: bool = True) -> str:
    head = DEVICE_AND_REGISTRY if registry else "device: {id: box-1}\n"
    return (
        f"{head}pipelines:\n  - name: cam\n    model: {model}\n"
        "    source: {type: video, uri: /v.mp4}\n    postprocess: {type: raw}\n"
    )


DIGEST = "sha256:" + "a" * 64
GOOD_MODELS = {
    "registry": "{name: m, version: '1'}",
    "registry, pinned": f"{{name: m, version: '1', digest: '{DIGEST}'}}",
    "registry, path null": "{name: m, version: '1', path: null}",
    "file": "{path: /opt/models/door.onnx}",
    "file, named": "{path: /opt/models/door.onnx, name: door}",
    "file, version local": "{path: /opt/models/door.onnx, version: local}",
    "file, digest null": "{path: /opt/models/door.onnx, digest: null}",
}
BAD_MODELS = {
    "no version": "{name: m}",
    "nothing": "{}",
    "relative path": "{path: models/door.onnx}",
    "empty path": "{name: m, version: '1', path: ''}",
    "file with a version": "{path: /opt/door.onnx, version: '3'}",
    "file with a digest": f"{{path: /opt/door.onnx, digest: '{DIGEST}'}}",
    "file with a bad name": "{path: /opt/door.onnx, name: 'door/1'}",
    "both path and a registry version": "{path: /opt/door.onnx, name: m, version: '1'}",
}


@pytest.mark.parametrize("case", GOOD_MODELS)
def test_a_model_by_name_and_version_or_by_path_passes_both(case: str) -> None:
    """The friction this answers: a working `model: {path: ...}` was "'name' is a required property"
    to an editor checking the exported schema."""
    assert_both_accept(_with_model(GOOD_MODELS[case]), case)


@pytest.mark.parametrize("case", BAD_MODELS)
def test_a_model_either_kind_refuses_fails_both(case: str) -> None:
    assert_both_reject(_with_model(BAD_MODELS[case]), case)


def test_a_registry_is_needed_exactly_when_a_pipeline_names_a_registry_model() -> None:
    assert_both_accept(_with_model("{path: /m.onnx}", registry=False), "files only, no registry")
    assert_both_reject(_with_model("{name: m, version: '1'}", registry=False), "a registry model")
    assert_both_reject(
        "registry: null\n" + _with_model("{name: m, version: '1'}", registry=False), "registry: null"
    )
    disabled = _with_model("{name: m, version: '1'}", registry=False) + "    enabled: false\n"
    assert_both_reject(disabled, "a disabled pipeline's registry model")


# --- refused by both ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_what_the_validator_refuses_the_schema_refuses_where_a_schema_can_say_it(case: str) -> None:
    text = textwrap.dedent(BAD_CONFIGS[case][0])
    try:
        data = config_data(text, case, environ={})
    except ConfigError:  # the YAML itself (syntax, a duplicate key, an unset ${VAR}): before any schema
        return
    problems = schema_problems(data)
    if case in BEYOND_A_SCHEMA:
        assert problems == [], f"{case} is refused by the schema now: take it off BEYOND_A_SCHEMA"
    else:
        assert problems, f"the schema accepts {case}, which config validate refuses"


def test_the_refusals_the_schema_cannot_state_are_still_bad_configs() -> None:
    assert set(BEYOND_A_SCHEMA) <= set(BAD_CONFIGS)


# --- the example names every key ----------------------------------------------------------------------


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _options(node: dict[str, Any]) -> list[dict[str, Any]]:
    """What a value of `node` may be (through $ref, anyOf/oneOf, arrays' items)."""
    node = _resolve(node)
    found = [node]
    for option in [*node.get("anyOf", []), *node.get("oneOf", [])]:
        found += _options(option)
    if "items" in node:
        found += _options(node["items"])
    return found


def schema_key_paths(node: dict[str, Any] = SCHEMA, prefix: str = "") -> tuple[set[str], set[str]]:
    """(every key the schema has, as dotted paths: a list's items take no index, pipelines.source.uri;
    the mappings among them whose keys are names the user picks: preprocess.constants, backends.options,
    each backend's keys being docs/backends.md's)."""
    paths: set[str] = set()
    named: set[str] = set()
    for option in _options(node):
        for key, value in option.get("properties", {}).items():
            path = f"{prefix}{key}"
            paths.add(path)
            if any(o.get("type") == "object" and "properties" not in o for o in _options(value)):
                named.add(path)
            else:
                inner, inner_named = schema_key_paths(value, f"{path}.")
                paths |= inner
                named |= inner_named
    return paths, named


def _keys_in(data: Any, named: set[str], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(data, list):
        for item in data:
            paths |= _keys_in(item, named, prefix)
    elif isinstance(data, dict):
        for key, value in data.items():
            paths.add(f"{prefix}{key}")
            if f"{prefix}{key}" not in named:
                paths |= _keys_in(value, named, f"{prefix}{key}.")
    return paths


def example_key_paths() -> tuple[set[str], set[str]]:
    """(keys the example sets, keys it names in comments: `# key: value` lines, read as YAML under the
    key the comment's indentation places them at)."""
    text = EXAMPLE.read_text()
    written = _keys_in(yaml.safe_load(text), schema_key_paths()[1])
    commented: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indentation, key) of the open mappings above this line
    for line in text.splitlines():
        match = re.match(r"^(\s*)(#\s*)?(- )?([a-z_]+):(\s|$)", line)
        if match is None:
            continue
        # A commented key ("  # tls:", "  #   ca_file: ...") sits as if "# " were two spaces.
        hashed = len(match.group(2)) - 2 if match.group(2) else 0
        indent = len(match.group(1)) + hashed + len(match.group(3) or "")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([key for _, key in stack] + [match.group(4)])
        if match.group(2) is not None:
            commented.add(path)
        stack.append((indent, match.group(4)))
    return written, commented


# An attribute's model, preprocess and postprocess are the pipeline's own types: the example names
# their keys once, under the pipeline.
SAME_KEYS = {
    f"pipelines.attributes.{key}.": f"pipelines.{key}." for key in ("model", "preprocess", "postprocess")
}


def _named_elsewhere(paths: set[str], named: set[str]) -> set[str]:
    """The `paths` whose twin under SAME_KEYS is in `named`."""
    return {
        path
        for path in paths
        for prefix, twin in SAME_KEYS.items()
        if path.startswith(prefix) and twin + path[len(prefix) :] in named
    }


def test_every_key_of_the_schema_is_in_the_example_and_no_other() -> None:
    written, commented = example_key_paths()
    schema = schema_key_paths()[0]
    assert {"pipelines.model.path", "mqtt.tls.cert_file", "registry.trusted_keys.key"} <= schema
    assert sorted(written - schema) == [], "keys in configs/agent.example.yaml that the config has not"
    assert sorted(commented - schema - written) == [], "commented keys the config has not"
    unnamed = schema - written - commented
    assert "pipelines.attributes.model.digest" in _named_elsewhere(unnamed, written | commented)
    unnamed -= _named_elsewhere(unnamed, written | commented)
    assert sorted(unnamed) == [], "keys configs/agent.example.yaml does not name"


def test_the_key_check_sees_keys_in_comments_and_misspelt_ones() -> None:
    # Shows the check above is not vacuous: the example's own spellings are found where they are.
    written, commented = example_key_paths()
    assert "pipelines.model.path" in commented and "mqtt.tls.key_file" in commented
    assert "pipelines.source.uri" in written and "backends.options" in written
    assert "mqtt.tlss" not in schema_key_paths()[0] and json.dumps(sorted(written)).count("pipelines.") > 50
