"""What every config section shares: the strict base model, names, secrets and logins."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    SecretStr,
    SerializationInfo,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent.errors import ConfigError

# Names end up in MQTT topics and file names: keep them to a safe alphabet.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):  # match() would let a trailing newline through ($)
        raise ValueError(
            f"{value!r} is not a valid name: use 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit (names become MQTT topic levels and file names)"
        )
    return value


Name = Annotated[str, AfterValidator(check_name), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]

# A JSON dump with this context key true writes secrets out (state the daemon keeps for itself,
# e.g. <state_dir>/pipelines.json); every other dump shows '**********'.
REVEAL_SECRETS = "reveal_secrets"


def _dump_secret(value: SecretStr, info: SerializationInfo) -> str:
    context = info.context
    if isinstance(context, dict) and context.get(REVEAL_SECRETS):
        return value.get_secret_value()
    return str(value)  # '**********'


Secret = Annotated[SecretStr, PlainSerializer(_dump_secret, when_used="json")]


def read_password(password: SecretStr | None, password_file: Path | None, key: str) -> str | None:
    """The password of a login: `password`, or the first line of `password_file` (read now, when the
    connection is made; a trailing newline is dropped). ConfigError naming `key` (the config key of
    the file, e.g. mqtt.password_file) when the file is missing, unreadable or empty."""
    if password_file is None:
        return None if password is None else password.get_secret_value()
    try:
        text = password_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [f"{key}: cannot read {password_file}: {exc.strerror or exc}"],
            hint=f"{key} must name a file the agent's user can read, holding the password",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{key}: {password_file} is not UTF-8 text"]) from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError([f"{key}: {password_file} is empty"], hint="write the password into it (one line)")
    return secret


# Characters an MQTT topic level cannot hold (watched labels, topic prefixes).
TOPIC_SPECIALS = ("/", "+", "#", "\x00")


class StrictModel(BaseModel):
    # hide_input_in_errors: a ValidationError's text never quotes a value (a password, or a whole
    # section holding one); config_loader's messages quote only what is safe to.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def problems_at(title: str, problems: list[tuple[tuple[str | int, ...], str]]) -> ValidationError:
    """A ValidationError of (key path below the model, message) problems: raised from a model's
    validator, each problem is reported at its own key (so at its own line of the YAML), not at the
    model's, e.g. `pipelines[0].zones[1].labels[0]` rather than `pipelines[0]`."""
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError("value_error", "{message}", {"message": message}),
                loc=loc,
                input=None,
            )
            for loc, message in problems
        ],
    )


def _given(*keys: str) -> dict[str, Any]:
    """JSON Schema: these keys are there, with a value (not null)."""
    return {"required": list(keys), "properties": {key: {"type": "string"} for key in keys}}


def login_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of a model whose validator calls `check_login` says what it checks."""
    schema["allOf"] = [
        {"not": _given("password", "password_file")},
        {"if": _given("password"), "then": _given("username")},
        {"if": _given("password_file"), "then": _given("username")},
    ]


def both_or_neither(first: str, second: str) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra of a model whose validator wants `first` and `second` given together."""

    def extra(schema: dict[str, Any]) -> None:
        schema["allOf"] = [
            {"if": _given(first), "then": _given(second)},
            {"if": _given(second), "then": _given(first)},
        ]

    return extra


def check_login(username: str | None, password: SecretStr | None, password_file: Path | None) -> None:
    if password is not None and password_file is not None:
        raise ValueError("give password or password_file, not both")
    if password is not None and username is None:
        raise ValueError("password given without username")
    if password_file is not None and username is None:
        raise ValueError("password_file given without username")
