"""agent.yaml loading: exact `FILE:LINE: key.path: message` errors, ${ENV} interpolation, good configs.

Every YAML document is written to tmp_path so the file path and the line numbers in the expected
messages are deterministic. `environ=` is passed explicitly so the host's environment never leaks in.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agent.config import (
    REVEAL_SECRETS,
    AgentConfig,
    CommandsConfig,
    FleetConfig,
    HealthWindowConfig,
    MqttConfig,
    MqttSourceConfig,
    OutboxConfig,
    PipelineConfig,
)
from agent.config_loader import load_config, parse_config
from agent.errors import ConfigError
from tests.config_cases import BAD_CONFIGS, DEMO, EXAMPLE, bad_name, problems_of, write


def test_there_are_many_distinct_bad_configs() -> None:
    texts = [textwrap.dedent(text) for text, _ in BAD_CONFIGS.values()]
    assert len(set(texts)) == len(texts) >= 14


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_reports_exact_lines(tmp_path: Path, case: str) -> None:
    text, expected = BAD_CONFIGS[case]
    path = write(tmp_path, text)
    assert problems_of(path) == [f"{path}:{line}: {message}" for line, message in expected]


def test_parse_config_names_the_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("device:\n  id: box-1\nmqtt:\n  port: 99999\n", source="edge/box-1/config", environ={})
    assert info.value.problems == [
        "edge/box-1/config:4: mqtt.port: Input should be less than or equal to 65535 (got 99999)"
    ]


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: box-1
        mqtt:
          host: broker: 1883
        """,
    )
    assert problems_of(path) == [f"{path}:4:15: YAML syntax error: mapping values are not allowed here"]


def test_unclosed_flow_sequence_is_a_syntax_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: box-1
          groups: [lobby, hall
        mqtt:
          port: 1883
        """,
    )
    # PyYAML notices the missing `]` only at the next key (line 4), not where the `[` opened
    assert problems_of(path) == [f"{path}:4:5: YAML syntax error: expected ',' or ']', but got ':'"]


def test_tab_indentation_is_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device:\n\tid: box-1\n", encoding="utf-8")
    assert problems_of(path) == [
        f"{path}:2:1: YAML syntax error: found character '\\t' that cannot start any token"
    ]


def test_control_character_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device:\n  id: box\x00-1\n", encoding="utf-8")
    assert problems_of(path) == [f"{path}:2:10: YAML syntax error: character #x0000 is not allowed"]


def test_file_that_is_not_utf8_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"device:\n  id: caf\xe9\n")
    assert problems_of(path) == [f"{path}: cannot read config file: not UTF-8 text (byte 17)"]


def test_recursive_alias_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device: &dev
          id: box-1
          groups: *dev
        """,
    )
    assert problems_of(path) == [
        f"{path}: YAML error: the document nests too deeply (or an alias refers to itself)"
    ]


@pytest.mark.parametrize(
    "text", ["", "\n\n", "# only a comment\n", "---\n"], ids=["empty", "blank", "comment", "marker"]
)
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text, encoding="utf-8")
    assert problems_of(path) == [f"{path}:1: the config is empty; expected a mapping with at least 'device'"]


@pytest.mark.parametrize(
    ("text", "kind"),
    [("- device: {id: box-1}\n", "a list"), ("just text\n", "a str"), ("42\n", "a int")],
    ids=["list", "string", "int"],
)
def test_top_level_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    assert problems_of(path) == [f"{path}:1: the config is {kind}; expected a mapping with at least 'device'"]


def test_file_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "agent.yaml"
    assert problems_of(path) == [f"{path}: cannot read config file: No such file or directory"]


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert problems_of(tmp_path) == [f"{tmp_path}: cannot read config file: Is a directory"]


def test_config_error_is_raised_without_pydantic_chain(tmp_path: Path) -> None:
    path = write(tmp_path, "device:\n  id: box-1\nmqtt:\n  port: 99999\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# --- ${ENV} interpolation ------------------------------------------------------------------------


def test_env_plain_default_and_literal(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: ${DEVICE_ID}
        mqtt:
          host: ${MQTT_HOST:-127.0.0.1}
          client_id: ${CLIENT:-agent}-${DEVICE_ID}
          username: $${NOT_EXPANDED}
          password: pre-$${A}-${SECRET:-}-post
        """,
    )
    cfg = load_config(path, environ={"DEVICE_ID": "box-7", "NOT_EXPANDED": "oops", "A": "oops"})
    assert cfg.device.id == "box-7"
    assert cfg.mqtt.host == "127.0.0.1"
    assert cfg.mqtt.client_id == "agent-box-7"
    assert cfg.mqtt.username == "${NOT_EXPANDED}"
    assert cfg.mqtt.password is not None and cfg.mqtt.password.get_secret_value() == "pre-${A}--post"


def test_env_value_overrides_default(tmp_path: Path) -> None:
    path = write(tmp_path, "device:\n  id: box-1\nmqtt:\n  host: ${MQTT_HOST:-127.0.0.1}\n")
    assert load_config(path, environ={"MQTT_HOST": "broker.lan"}).mqtt.host == "broker.lan"
    # set but empty is still "set": no fallback to the default, and an empty host is then rejected
    assert problems_of(path, {"MQTT_HOST": ""}) == [
        f"{path}:4: mqtt.host: String should have at least 1 character (got '')"
    ]


def test_env_value_is_not_expanded_again(tmp_path: Path) -> None:
    path = write(tmp_path, "device:\n  id: box-1\nmqtt:\n  username: ${USER_NAME}\n")
    cfg = load_config(path, environ={"USER_NAME": "${OTHER}"})
    assert cfg.mqtt.username == "${OTHER}"


def test_env_in_lists(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: box-1
          groups:
            - ${SITE}
            - floor-${FLOOR:-0}
          # in a flow sequence `{` is an indicator, so the reference must be quoted
        """,
    )
    cfg = load_config(path, environ={"SITE": "hq"})
    assert cfg.device.groups == ["hq", "floor-0"]
    flow = write(tmp_path, 'device:\n  id: box-1\n  groups: ["${SITE}", "b-${B:-2}"]\n', name="flow.yaml")
    assert load_config(flow, environ={"SITE": "hq"}).device.groups == ["hq", "b-2"]


def test_env_in_nested_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: box-1
        registry:
          url: file://${REGISTRY_DIR}
        mqtt:
          tls:
            ca_file: ${CERTS}/ca.crt
            cert_file: ${CERTS}/client.crt
            key_file: ${CERTS}/client.key
          outbox:
            max_messages: ${OUTBOX_MAX:-5000}
        pipelines:
          - name: ${PIPELINE:-cam}
            model: {name: m, version: "${MODEL_VERSION}"}
            source:
              type: video
              uri: ${CAMERA}
              fps: ${FPS:-2.5}
            postprocess: {type: raw}
        """,
    )
    env = {
        "REGISTRY_DIR": "/srv/reg",
        "CERTS": "/etc/certs",
        "MODEL_VERSION": "3.1",
        "CAMERA": "rtsp://cam/1",
    }
    cfg = load_config(path, environ=env)
    assert cfg.registry is not None
    assert cfg.registry.url == "file:///srv/reg"
    assert cfg.mqtt.tls is not None
    assert cfg.mqtt.tls.ca_file == Path("/etc/certs/ca.crt")
    assert cfg.mqtt.tls.key_file == Path("/etc/certs/client.key")
    assert cfg.mqtt.outbox.max_messages == 5000  # a string from the environment, validated as an int
    (pipeline,) = cfg.pipelines
    assert pipeline.name == "cam"
    assert pipeline.model.version == "3.1"
    assert pipeline.source.uri == "rtsp://cam/1"
    assert pipeline.source.fps == 2.5


PORT_FROM_ENV = """
device:
  id: box-1
mqtt:
  host: broker.local
  port: ${PORT}
"""


def test_env_value_is_validated_after_interpolation(tmp_path: Path) -> None:
    path = write(tmp_path, PORT_FROM_ENV)
    assert load_config(path, environ={"PORT": "8883"}).mqtt.port == 8883
    assert problems_of(path, {"PORT": "abc"}) == [
        f'{path}:5: mqtt.port: expected a whole number, got "abc" (from ${{PORT}})'
    ]
    assert problems_of(path, {"PORT": "70000"}) == [
        f"{path}:5: mqtt.port: Input should be less than or equal to 65535 (got '70000')"
    ]


def test_env_value_breaking_the_name_rule(tmp_path: Path) -> None:
    path = write(tmp_path, "device:\n  id: ${DEVICE_ID}\n")
    assert problems_of(path, {"DEVICE_ID": "box/1"}) == [f"{path}:2: device.id: {bad_name('box/1')}"]


def test_env_errors_come_before_validation(tmp_path: Path) -> None:
    # An unset variable is reported alone: validating a half-interpolated document would add noise.
    path = write(tmp_path, "device:\n  id: ${DEVICE_ID}\nmqtt:\n  port: 99999\n")
    assert problems_of(path) == [
        f"{path}:2: device.id: environment variable DEVICE_ID is not set "
        "(write ${DEVICE_ID:-default} to give a default)"
    ]


def test_environ_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one test that uses the process environment: it checks the environ=None default.
    monkeypatch.setenv("EDGE_TEST_DEVICE_ID", "from-os-environ")
    path = write(tmp_path, "device:\n  id: ${EDGE_TEST_DEVICE_ID}\n")
    assert load_config(path).device.id == "from-os-environ"
    assert parse_config(path.read_text()).device.id == "from-os-environ"


# --- good configs --------------------------------------------------------------------------------


def test_example_config_validates() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert cfg.device.id == "lobby-cam-01"
    assert cfg.device.groups == ["lobby", "building-7"]
    assert cfg.mqtt.host == "127.0.0.1"
    assert cfg.registry is not None
    assert cfg.registry.url == "file:///srv/edge-registry"
    assert [p.name for p in cfg.pipelines] == [
        "entrance",
        "faces",
        "text-finder",
        "speech",
        "vibration",
        "replay",
        "uart",
        "raw-debug",
    ]
    entrance, faces, text, speech, vibration, replay, uart, raw = cfg.pipelines
    assert uart.source.type == "serial"
    assert replay.source.type == "replay"
    assert vibration.source.type == "mqtt"
    assert speech.source.type == "audio" and speech.preprocess.type == "audio"  # type: ignore[union-attr]
    assert speech.postprocess.type == "threshold" and speech.state[0].input == "state"
    assert text.postprocess.type == "regions"
    assert faces.postprocess.type == "detection" and faces.preprocess.resize is not None
    assert faces.preprocess.resize.mode == "letterbox"
    assert entrance.model.version == "2.0"
    assert entrance.preprocess.resize is not None
    assert (entrance.preprocess.resize.width, entrance.preprocess.resize.height) == (192, 48)
    assert entrance.postprocess.type == "classification"
    assert entrance.postprocess.labels == ["upright", "upside-down"]
    assert raw.enabled is False
    assert raw.source.uri == "0"
    assert raw.postprocess.type == "raw"


def test_example_config_env_overrides() -> None:
    cfg = load_config(EXAMPLE, environ={"EDGE_DEVICE_ID": "dock-2", "MQTT_HOST": "mqtt.site"})
    assert (cfg.device.id, cfg.mqtt.host) == ("dock-2", "mqtt.site")


def test_example_config_documents_the_defaults() -> None:
    """The example says it lists "every key, with its default": hold it to that."""
    example = load_config(EXAMPLE, environ={})
    minimal = parse_config("device:\n  id: lobby-cam-01\n", environ={})
    assert example.mqtt == minimal.mqtt == MqttConfig()
    assert example.mqtt.outbox == OutboxConfig()
    assert example.state_dir == minimal.state_dir == Path("/var/lib/edge-agent")
    assert example.log_level == minimal.log_level == "info"
    mqtt = minimal.mqtt
    assert (mqtt.host, mqtt.port, mqtt.protocol, mqtt.topic_prefix) == ("127.0.0.1", 1883, "5", "edge")
    assert (mqtt.client_id, mqtt.username, mqtt.password, mqtt.tls) == (None, None, None, None)
    assert (mqtt.keepalive_s, mqtt.reconnect_min_s, mqtt.reconnect_max_s) == (30, 1.0, 60.0)
    assert mqtt.outbox.max_messages == 100_000
    assert mqtt.outbox.max_inflight == 20
    assert mqtt.outbox.flush_timeout_s == 10.0
    assert minimal.registry is None
    assert minimal.pipelines == []
    assert example.fleet == minimal.fleet == FleetConfig()
    assert minimal.fleet.health.max_latency_ms is None and minimal.fleet.commands.allow is None

    # Pipeline keys the example marks as defaults.
    entrance = example.pipelines[0]
    bare = parse_config(
        "device: {id: a}\nregistry: {url: 'file:///r'}\n"
        "pipelines: [{name: p, model: {name: m, version: '1'}, source: {type: video, uri: '0'},"
        " postprocess: {type: raw}}]\n",
        environ={},
    ).pipelines[0]
    # Installed as it is (scripts/install.sh), the example must run: every pipeline is off there.
    assert bare.enabled is True
    assert [p.enabled for p in example.pipelines] == [False] * len(example.pipelines)
    for key in ("loop", "reopen_min_s", "reopen_max_s"):
        assert getattr(bare.source, key) == getattr(entrance.source, key), key
    for key in ("input", "scale", "layout", "dtype"):
        assert getattr(bare.preprocess, key) == getattr(entrance.preprocess, key), key
    assert bare.preprocess.scale == 1 / 255
    assert bare.postprocess.type == "raw"
    assert bare.postprocess.max_values == example.pipelines[7].postprocess.max_values == 1000
    # The resize and detection keys the example spells out are the defaults.
    assert entrance.preprocess.resize is not None
    resize = entrance.preprocess.resize.model_dump()
    assert {k: resize[k] for k in ("mode", "anchor", "pad")} == {
        "mode": "stretch",
        "anchor": "center",
        "pad": 114,
    }
    detection = (
        parse_config(
            "device: {id: a}\nregistry: {url: 'file:///r'}\n"
            "pipelines: [{name: p, model: {name: m, version: '1'}, source: {type: video, uri: '0'},"
            " postprocess: {type: detection}}]\n",
            environ={},
        )
        .pipelines[0]
        .postprocess
    )
    faces = example.pipelines[1].postprocess
    for key in ("format", "output", "iou_threshold", "labels"):
        assert getattr(detection, key) == getattr(faces, key), key
    regions = (
        parse_config(
            "device: {id: a}\nregistry: {url: 'file:///r'}\n"
            "pipelines: [{name: p, model: {name: m, version: '1'}, source: {type: video, uri: '0'},"
            " postprocess: {type: regions}}]\n",
            environ={},
        )
        .pipelines[0]
        .postprocess
    )
    text = example.pipelines[2].postprocess
    for key in ("output", "threshold", "min_area", "min_score", "max_regions"):
        assert getattr(regions, key) == getattr(text, key), key


def test_example_config_spells_out_every_fleet_key() -> None:
    """The fleet section is new: every key of it (and of health and commands) is written out."""
    fleet = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["fleet"]
    assert set(fleet) == set(FleetConfig.model_fields)
    assert set(fleet["health"]) == set(HealthWindowConfig.model_fields)
    assert set(fleet["commands"]) == set(CommandsConfig.model_fields)


def test_gray_pipeline_with_default_mean_and_std() -> None:
    cfg = parse_config(
        "device: {id: a}\nregistry: {url: 'file:///r'}\n"
        "pipelines: [{name: p, model: {name: m, version: '1'}, source: {type: video, uri: '0'},"
        " preprocess: {color: gray}, postprocess: {type: raw}}]\n",
        environ={},
    )
    preprocess = cfg.pipelines[0].preprocess
    assert (preprocess.color, preprocess.mean, preprocess.std) == ("gray", [0.0], [1.0])


def test_protocol_accepts_int_and_dotted_version(tmp_path: Path) -> None:
    assert parse_config("device: {id: a}\nmqtt: {protocol: 5}\n", environ={}).mqtt.protocol == "5"
    assert parse_config("device: {id: a}\nmqtt: {protocol: 3.1.1}\n", environ={}).mqtt.protocol == "3.1.1"


def test_demo_config_validates(tmp_path: Path) -> None:
    work = tmp_path / "demo work"
    text = DEMO.read_text(encoding="utf-8").replace("@PORT@", "1883").replace("@WORK@", str(work))
    assert "@" not in text
    cfg = load_config(write(tmp_path, text, name="demo.yaml"), environ={})
    assert cfg.device.id == "demo-box"
    assert cfg.state_dir == work / "state"
    assert cfg.mqtt.port == 1883
    assert cfg.registry is not None
    assert cfg.registry.url == f"file://{work}/registry"
    (pipeline,) = cfg.pipelines
    assert pipeline.name == "sign-orientation"
    assert pipeline.source.uri == f"{work}/signs.mp4"
    assert pipeline.postprocess.type == "classification"


def test_name_with_a_trailing_newline_is_refused() -> None:
    """A name becomes a topic level and a file name: "cam\\n" must not pass the `$` of the pattern."""
    with pytest.raises(ConfigError) as info:
        parse_config('device: {id: "box-1\\n"}\n', environ={})
    assert info.value.problems == [f"<config>:1: device.id: {bad_name('box-1' + chr(10))}"]


def test_config_objects_are_frozen() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert isinstance(cfg, AgentConfig)
    with pytest.raises(ValueError, match="frozen"):
        cfg.mqtt.port = 1  # type: ignore[misc]


def test_alias_expansion_bomb_is_refused_quickly(tmp_path: Path) -> None:
    # Each level repeats the previous one 10 times: 10**8 values if expanded.
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\n")
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.problems == [f"{path}: the document has more than 100000 values (alias expansion?)"]
    assert time.monotonic() - started < 30


# --- client ids, device ids, passwords -----------------------------------------------------------


@pytest.mark.parametrize("device_id", ["box+1", "box#1", "site/box", "box 1", "", "b" * 65])
def test_a_device_id_that_would_break_topics_or_the_client_id_is_refused(device_id: str) -> None:
    """The device id is a topic level (<prefix>/<device>/...) and part of the default client id."""
    with pytest.raises(ConfigError) as info:
        parse_config(f"device: {{id: {device_id!r}}}\n", environ={})
    assert info.value.problems == [f"<config>:1: device.id: {bad_name(device_id)}"]


def test_the_longest_client_id_and_unicode_ones_are_fine() -> None:
    assert MqttConfig(client_id="c" * 128).client_id == "c" * 128
    assert MqttConfig(client_id="kamera-büro_1.2:ü").client_id == "kamera-büro_1.2:ü"


SECRET = "Zq7-never-shown-9Xw"


def _config_with_passwords() -> AgentConfig:
    return parse_config(
        textwrap.dedent(
            f"""
            device: {{id: box-1}}
            mqtt: {{username: edge, password: {SECRET}}}
            registry: {{url: file:///srv/registry}}
            pipelines:
              - name: vib
                model: {{name: m, version: "1"}}
                source: {{type: mqtt, topic: plant/vib, host: sensors.lan, username: s, password: {SECRET}}}
                preprocess: {{type: series}}
                postprocess: {{type: raw}}
            """
        ),
        environ={},
    )


def test_passwords_are_never_shown_in_repr_dumps_or_the_schema() -> None:
    cfg = _config_with_passwords()
    source = cfg.pipelines[0].source
    assert isinstance(source, MqttSourceConfig)
    assert cfg.mqtt.login_password() == source.login_password() == SECRET  # what the logins use
    shown = [
        repr(cfg),
        str(cfg),
        f"{cfg.mqtt}",
        cfg.model_dump_json(),
        json.dumps(cfg.model_dump(mode="json")),
        json.dumps(cfg.model_dump(), default=str),  # how the daemon's JSON files dump odd values
        json.dumps(AgentConfig.model_json_schema()),
    ]
    for text in shown:
        assert SECRET not in text
    assert "**********" in shown[0] and "**********" in shown[3]
    # Only a dump that asks for them (the daemon's own state) has the secrets: to log in again.
    revealed = cfg.pipelines[0].model_dump(mode="json", context={REVEAL_SECRETS: True})
    assert revealed["source"]["password"] == SECRET
    assert PipelineConfig.model_validate(revealed) == cfg.pipelines[0]


def test_a_password_is_never_quoted_in_config_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        device:
          id: box-1
        mqtt:
          username: edge
          password: 918273645
        """,
    )
    assert problems_of(path) == [f"{path}:5: mqtt.password: expected a string: quote it in the YAML"]
    # Nor in pydantic's own text of an error about the section that holds it.
    with pytest.raises(ValidationError) as info:
        MqttConfig(password=SECRET)  # type: ignore[arg-type]
    assert "password given without username" in str(info.value) and SECRET not in str(info.value)


def test_a_password_file_is_read_when_connecting_without_its_newline(tmp_path: Path) -> None:
    for text in (f"{SECRET}\n", f"{SECRET}\r\n", SECRET):
        (tmp_path / "mqtt.pw").write_text(text)
        cfg = MqttConfig(username="edge", password_file=tmp_path / "mqtt.pw")
        assert cfg.login_password() == SECRET
    assert MqttConfig(username="edge").login_password() is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read {path}: No such file or directory"),
        ("dir", "cannot read {path}: Is a directory"),
        ("", "{path} is empty"),
        ("\n", "{path} is empty"),
        (b"\xff\xfe\n", "{path} is not UTF-8 text"),
    ],
    ids=["missing", "directory", "empty", "only-a-newline", "not-text"],
)
def test_a_password_file_that_cannot_be_used_is_a_config_error_naming_the_key(
    tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    path = tmp_path / "mqtt.pw"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    # Validating the config does no I/O (it may be checked on a laptop for a box): it passes.
    mqtt = MqttConfig(username="edge", password_file=path)
    source = MqttSourceConfig(type="mqtt", topic="t", host="h", username="s", password_file=path)
    for config, key in ((mqtt, "mqtt.password_file"), (source, "source.password_file")):
        with pytest.raises(ConfigError) as info:
            config.login_password()
        assert info.value.problems == [f"{key}: {problem.format(path=path)}"]
