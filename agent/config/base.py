"""What every config section shares: the strict base model, names, secrets and logins."""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ModelWrapValidatorHandler,
    PlainSerializer,
    PlainValidator,
    SecretStr,
    SerializationInfo,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from agent.errors import ConfigError
from agent.text import clip

# Names end up in MQTT topics and file names: keep them to a safe alphabet.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):  # match() would let a trailing newline through ($)
        raise ValueError(
            f"{clip(value, 80)!r} is not a valid name: use 1-64 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit (names become MQTT topic levels and file names)"
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


class Expanded(str):
    """Text a `${VAR}` reference was expanded into (agent/config_loader.py): the one string a number
    or true/false is read from, typed by the key it is for (`port: ${MQTT_PORT}` is the number 8883)."""

    __slots__ = ()


class StrictModel(BaseModel):
    """The base of every config model: unknown keys refused, frozen, and every number and true/false
    given as such, not as text, as the JSON Schema (`edge-agent config schema`) says: pydantic alone
    would read "0.5" as 0.5 and "yes" as true, where the schema refuses both (README: they agree).
    `Expanded` text is the one exception."""

    # hide_input_in_errors: a ValidationError's text never quotes a value (a password, or a whole
    # section holding one); config_loader's messages quote only what is safe to. defer_build: a
    # model's validator is built when it is first used, not when its class is: validating a whole
    # config builds AgentConfig's alone (the sections within it), not one more for each of the ~50
    # section models (docs/performance.md, "Start-up time").
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True, defer_build=True)

    @model_validator(mode="wrap")
    @classmethod
    def _typed_as_the_schema_says(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        wrong = untyped_values(cls, data)
        if not wrong:
            return handler(data)
        try:
            handler(data)  # for the other problems of the same section: all are said at once
        except ValidationError as exc:
            raise with_problems(cls, exc, wrong) from None
        raise problems_at(cls.__name__, wrong)


# What a scalar annotation wants, in the words of a message; a value of another kind is refused.
_SCALARS: dict[Any, str] = {bool: "true or false", int: "a whole number", float: "a number"}


def untyped_values(model: type[BaseModel], data: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """(key path, message) of each value in `data` (a model's input) that pydantic would convert but
    the JSON Schema refuses: text or true/false where a number is meant, anything but true/false
    where a boolean is; nested models check their own."""
    if not isinstance(data, dict):
        return []
    found: list[tuple[tuple[str | int, ...], str]] = []
    converted = _converted_fields(model)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key in data and name not in converted and not any(map(_converts, field.metadata)):
            found += _untyped(field.annotation, data[key], (key,))
    return found


def _converts(metadata: Any) -> bool:
    """A validator that reads the input itself (an RFC 3339 time into a number): not ours to judge."""
    return isinstance(metadata, (BeforeValidator, PlainValidator, WrapValidator))


def _converted_fields(model: type[BaseModel]) -> set[str]:
    """Fields whose `field_validator` reads the input itself (mode before, plain or wrap)."""
    decorators = model.__pydantic_decorators__.field_validators.values()
    return {name for d in decorators if d.info.mode in ("before", "plain", "wrap") for name in d.info.fields}


def _untyped(
    annotation: Any, value: Any, where: tuple[str | int, ...]
) -> list[tuple[tuple[str | int, ...], str]]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return [] if any(map(_converts, args[1:])) else _untyped(args[0], value, where)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if value is None and len(members) < len(args):
            return []
        # Only a union of one kind (`float | None`) says what a value must be.
        return _untyped(members[0], value, where) if len(members) == 1 else []
    if annotation in _SCALARS:
        return [] if _fits(annotation, value) else [(where, untyped_message(_SCALARS[annotation], value))]
    if origin in (list, tuple) and isinstance(value, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return [
                p
                for i, (a, v) in enumerate(zip(args, value, strict=False))
                for p in _untyped(a, v, (*where, i))
            ]
        item = args[0] if args else Any
        return [p for i, v in enumerate(value) for p in _untyped(item, v, (*where, i))]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return [p for k, v in value.items() for p in _untyped(args[1], v, (*where, k))]
    return []


def _fits(kind: type, value: Any) -> bool:
    if isinstance(value, Expanded):
        return True  # typed after expansion: pydantic reads "8883" as the number the key wants
    if kind is bool:
        return isinstance(value, bool)
    return not isinstance(value, (str, bool))  # a number; pydantic itself refuses other kinds


def untyped_message(wanted: str, value: Any) -> str:
    """`expected a number, got the text "0.5": write it without quotes` and the like."""
    if not isinstance(value, str):
        got = json.dumps(value) if isinstance(value, (bool, int, float)) else f"a {type(value).__name__}"
        return f"expected {wanted}, got {got}"
    if wanted == "true or false":
        bare = value.lower() in ("true", "false", "yes", "no", "on", "off")
        hint = ": write true or false without quotes" if bare else ""
    else:
        try:
            float(value)
            hint = ": write it without quotes"
        except ValueError:
            hint = ""
    return f"expected {wanted}, got the text {json.dumps(value)}{hint}"


ModelT = TypeVar("ModelT", bound=BaseModel)


def validate_typed(model: type[ModelT], data: Any) -> ModelT:
    """`model.model_validate(data)` with StrictModel's check of numbers and true/false, for a model
    that is not one (a backend's options: providers/options.py)."""
    wrong = untyped_values(model, data)
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        if wrong:
            raise with_problems(model, exc, wrong) from None
        raise
    if wrong:
        raise problems_at(model.__name__, wrong)
    return validated


def carried(error: ErrorDetails, loc: tuple[str | int, ...] | None = None) -> InitErrorDetails:
    """A pydantic error to raise again (at `loc`, else where it was), as it was: its type, context,
    input and message (a built-in type given again by name would want its own context, which an error
    a validator raised with `problems_at` does not have)."""
    context = {**(error.get("ctx") or {}), "message": error["msg"]}
    return InitErrorDetails(
        type=PydanticCustomError(error["type"], "{message}", context),
        loc=error["loc"] if loc is None else loc,
        input=error.get("input"),
    )


def with_problems(
    model: type[BaseModel], exc: ValidationError, problems: list[tuple[tuple[str | int, ...], str]]
) -> ValidationError:
    """`exc`'s errors (from validating `model`) and `problems` (key path, message) as one
    ValidationError, in the order of `model`'s fields. pydantic's errors of a key that has a problem
    here are left out: they judged the value pydantic made of the text ("often" is no whole number;
    `true` read as 1 made a line's two ends the same). The others keep their type, context and input
    (what agent/config_loader.py's messages read) and their message as pydantic wrote it."""
    judged = {loc[0] for loc, _ in problems if loc}
    details = [carried(e) for e in exc.errors(include_url=False) if not (e["loc"] and e["loc"][0] in judged)]
    details += [
        InitErrorDetails(
            type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=None
        )
        for loc, message in problems
    ]
    order = {field.alias or name: i for i, (name, field) in enumerate(model.model_fields.items())}
    details.sort(key=lambda d: order.get(str(d["loc"][0]), len(order)) if d["loc"] else -1)
    return ValidationError.from_exception_data(exc.title, details, hide_input=True)


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
