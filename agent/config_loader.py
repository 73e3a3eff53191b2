"""Load agent.yaml into `AgentConfig` with errors a person can act on.

YAML is composed into nodes first so every key keeps its line number (and every value the text it
was written as); `${VAR}` and `${VAR:-default}` are expanded in string values (`$${` is a literal
`${`), into `Expanded` text: the one text read as a number or true/false where the key wants one.
Validation errors from pydantic are mapped back to `file:line: key.path: message`, each one plain
sentence saying what the key expects (not pydantic's words: "Input should be a valid tuple").
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from agent.config import AgentConfig
from agent.config.base import Expanded
from agent.config_origin import PathKey, dotted, line_for, remember
from agent.errors import ConfigError

_ENV_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


SECRET_KEYS = frozenset({"password"})  # keys whose values error messages never quote

# Far beyond any real config; stops "billion laughs" alias expansion (configs also arrive over MQTT).
_MAX_NODES = 100_000


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Read, interpolate and validate one agent config file. Raises ConfigError."""
    return read_config(path, environ)[1]


def read_config(path: Path, environ: Mapping[str, str] | None = None) -> tuple[str, AgentConfig]:
    """`load_config`, also returning the file's text as read (before interpolation: what a reload
    compares and the last good config keeps, with no secret from the environment in it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: cannot read config file: not UTF-8 text (byte {exc.start})"]) from None
    return text, parse_config(text, source=str(path), environ=environ)


def parse_config(
    text: str, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Validate config text; `source` names it in errors (a file path, or an MQTT topic)."""
    data, lines, texts = _load_yaml(text, source, os.environ if environ is None else environ)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError([f"{source}:1: the config is {kind}; expected a mapping with at least 'device'"])
    try:
        config = AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, data, lines, source, texts)) from None
    remember(config, source, lines)  # a problem found later (labels vs the model) names its line
    return config


def config_data(text: str, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Any:
    """The document that validation checks (and `config_json_schema` describes): the YAML read and
    its `${VAR}` references expanded (text: where a key wants a number or true/false, the validator
    reads it as one and the schema, seeing text, refuses it; README). ConfigError for what fails
    before validation (YAML syntax, unset variables)."""
    return _load_yaml(text, source, os.environ if environ is None else environ)[0]


def config_json_schema() -> dict[str, Any]:
    """JSON Schema of agent.yaml, for editors (yaml-language-server) and docs. It accepts what the
    validator accepts, with `${VAR}` references expanded (`config_data`), and rejects what it rejects
    where a schema can say so (not, e.g., two pipelines of one name: `edge-agent config validate`)."""
    schema = AgentConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edge-agent configuration (agent.yaml)"
    return schema


# --- YAML with positions -----------------------------------------------------------------


def _load_yaml(
    text: str, source: str, environ: Mapping[str, str]
) -> tuple[Any, dict[PathKey, int], dict[PathKey, str]]:
    """(the document, each key's line, each scalar's text as written)."""
    try:
        loader = yaml.SafeLoader(text)  # checks every character up front
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(
            [f"{source}:{line}:{column}: YAML syntax error: character #x{char:04x} is not allowed"]
        ) from None
    try:
        node = loader.get_single_node()
        lines: dict[PathKey, int] = {}
        texts: dict[PathKey, str] = {}
        problems: list[str] = []
        data = None if node is None else _build(node, (), loader, lines, texts, environ, source, problems)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError([f"{where}: YAML syntax error: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: YAML error: {exc}"]) from None
    except RecursionError:
        raise ConfigError(
            [f"{source}: YAML error: the document nests too deeply (or an alias refers to itself)"]
        ) from None
    finally:
        loader.dispose()
    if problems:
        raise ConfigError(problems)
    return data, lines, texts


def _build(
    node: yaml.Node,
    path: PathKey,
    loader: yaml.SafeLoader,
    lines: dict[PathKey, int],
    texts: dict[PathKey, str],
    environ: Mapping[str, str],
    source: str,
    problems: list[str],
) -> Any:
    if len(lines) >= _MAX_NODES:
        raise ConfigError([f"{source}: the document has more than {_MAX_NODES} values (alias expansion?)"])
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                problems.append(
                    f"{source}:{key_node.start_mark.line + 1}: {dotted(path) or '(top)'}: "
                    f"key {key!r} must be a string"
                )
                continue
            key_path = (*path, key)
            if key in result:
                problems.append(
                    f"{source}:{key_node.start_mark.line + 1}: {dotted(key_path)}: "
                    f"duplicate key (first at line {lines[key_path]})"
                )
                continue
            result[key] = _build(value_node, key_path, loader, lines, texts, environ, source, problems)
            lines[key_path] = key_node.start_mark.line + 1  # errors point at the key, not its value
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _build(item, (*path, index), loader, lines, texts, environ, source, problems)
            for index, item in enumerate(node.value)
        ]
    value = loader.construct_object(node, deep=True)
    if isinstance(node, yaml.ScalarNode):
        texts[path] = node.value  # as written: `yes` for a value YAML reads as true
    if isinstance(value, str) and "$" in value:
        try:
            value = _interpolate(value, environ)
        except KeyError as exc:
            name = exc.args[0]
            problems.append(
                f"{source}:{lines[path]}: {dotted(path)}: environment variable {name} is not set "
                f"(write ${{{name}:-default}} to give a default)"
            )
    return value


def _interpolate(value: str, environ: Mapping[str, str]) -> str:
    """`value` with its references expanded: `Expanded` text when one was (typed by its key)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise KeyError(name)

    expanded, count = _ENV_REF.subn(replace, value)
    return Expanded(expanded) if count else expanded


# --- pydantic errors -> file:line: key.path: message --------------------------------------


def _format_errors(
    exc: ValidationError, data: Any, lines: dict[PathKey, int], source: str, texts: Mapping[PathKey, str]
) -> list[str]:
    return [
        f"{source}:{line_for(path, lines)}: {dotted(path) or '(top)'}: {message}"
        for path, message in validation_problems(exc, data, AgentConfig, texts=texts)
    ]


def validation_problems(
    exc: ValidationError,
    data: Any,
    model: type[BaseModel],
    syntax: Literal["yaml", "json"] = "yaml",
    texts: Mapping[PathKey, str] | None = None,
) -> list[tuple[PathKey, str]]:
    """(path of keys in `data`, message) for each of pydantic's errors from validating `data` as
    `model`; the caller says where the path is (a file line, a JSON path). `syntax` is the language
    `data` was written in, `texts` each scalar's text as written there (YAML), for the hints that
    depend on them. The errors of a zone's or line's points that are not [x, y] pairs (a flat list
    gives one per number) are said once, at `points`."""
    problems = []
    said: set[PathKey] = set()
    for error in exc.errors(include_url=False):
        path, missing_leaf = _data_path(error["loc"], data)
        points = _points_not_pairs(error, path)
        if points is not None:
            if points not in said:
                said.add(points)
                problems.append((points, _points_message(points, data)))
            continue
        problems.append((path, _message(error, path, missing_leaf, data, model, syntax, texts or {})))
    return problems


POINTS_WANTED = "expected a list of [x, y] points, each two numbers"


def _points_not_pairs(error: Mapping[str, Any], path: PathKey) -> PathKey | None:
    """The path of a zone's or line's `points` when `error` says one of its items is not a pair of
    numbers (or it is no list); else None. The list's own length is said as pydantic says it."""
    if "points" not in path:
        return None
    at = len(path) - 1 - path[::-1].index("points")
    item_shape = error["type"] in ("tuple_type", "too_long", "too_short") and len(path) == at + 2
    return path[: at + 1] if item_shape or (error["type"] == "list_type" and len(path) == at + 1) else None


def _points_message(points: PathKey, data: Any) -> str:
    """`expected a list of [x, y] points, each two numbers between 0 and 1, got a flat list of 6 numbers:
    pair them, [[0.1, 0.5], [0.4, 0.5], ...]` (or the first item that is not a pair)."""
    parent, value = _value_at(data, points[:-1]), _value_at(data, points)
    pixels = isinstance(parent, dict) and parent.get("units") == "pixels"
    wanted = POINTS_WANTED + (" (pixels)" if pixels else " between 0 and 1")
    if not isinstance(value, list):
        return f"{wanted}, got {_quoted(value)}"
    if value and all(_is_number(v) for v in value):
        pairs = ", ".join(
            f"[{_short(a)}, {_short(b)}]" for a, b in zip(value[:4:2], value[1:4:2], strict=False)
        )
        return f"{wanted}, got a flat list of {len(value)} numbers: pair them, [{pairs}, ...]"
    i, item = next(
        ((i, v) for i, v in enumerate(value) if not (isinstance(v, list) and len(v) == 2)), (0, None)
    )
    return f"{wanted}, got {_quoted(item)} as point {i}"


def _quoted(value: Any) -> str:
    """`value` as JSON (text in double quotes, as YAML and JSON write it), cut short."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _value_at(data: Any, path: PathKey) -> Any:
    for part in path:
        found = isinstance(data, dict) and part in data
        found = found or (isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data))
        if not found:
            return None
        data = data[part]
    return data


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# pydantic's type errors for a scalar, by what the key wants (agent/config/base.py's words for text
# where a number is meant).
_WANTED = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def _data_path(loc: tuple[Any, ...], data: Any) -> tuple[PathKey, bool]:
    """Turn a pydantic `loc` into the path of keys in the YAML document.

    Discriminated unions add the tag (e.g. 'video') to `loc`, and model validators add
    nothing; walking the real data tells those apart from real keys. The bool says the
    last element does not exist in the data (a missing or unknown key).
    """
    path: list[str | int] = []
    current = data
    for part in loc:
        if isinstance(current, dict):
            if part in current:
                path.append(part)
                current = current[part]
                continue
            # A discriminator tag, not a key; preprocess is tagged "image" when it has no type.
            if current.get("type", "image") == part:
                continue
            path.append(part)
            return tuple(path), True
        if isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
            continue
        # Inside a scalar (e.g. a union member name): the rest is pydantic's, not ours.
        break
    return tuple(path), False


def _message(
    error: Mapping[str, Any],
    path: PathKey,
    missing_leaf: bool,
    data: Any,
    model: type[BaseModel],
    syntax: Literal["yaml", "json"],
    texts: Mapping[PathKey, str],
) -> str:
    kind = error["type"]
    # A password's value is never quoted back (error output, a refused document in reported state).
    secret = bool(path) and not missing_leaf and str(path[-1]) in SECRET_KEYS
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(path[:-1], data, model)
        hint = ""
        if allowed:
            close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            hint += f" (allowed here: {', '.join(sorted(allowed))})"
        return f"unknown key{hint}"
    if kind == "union_tag_not_found":
        return f"required key 'type' is missing (one of: {', '.join(_union_tags(path, data, model))})"
    if kind == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        return f"unknown type {tag!r}; expected one of: {_expected_tags(error)}"
    if kind == "string_type" and isinstance(error.get("input"), (int, float, bool, datetime.date)):
        # YAML turned an unquoted 2.0 / 2024-01-01 / yes into a number, date or bool (JSON: a number).
        if secret:  # not even its kind: "a number" says much about a password
            return f"expected a string: quote it in the {syntax.upper()}"
        return _not_text(error["input"], texts.get(path))
    if kind in _WANTED:
        if secret:
            return f"expected {_WANTED[kind]}"
        value = error.get("input")
        got, written = _quoted(value), texts.get(path)
        expanded = f" (from {written})" if isinstance(value, Expanded) and written else ""
        return f"expected {_WANTED[kind]}, got {got}{expanded}"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if not missing_leaf and not secret and kind not in ("value_error", "assertion_error"):
        message += f" (got {_short(error.get('input'))})"
    return message


def _not_text(value: Any, written: str | None) -> str:
    """A string was expected, and YAML (or JSON) read a number, a date or true/false: say what it read,
    from what (`yes` is true to YAML), and how to write it as text."""
    if isinstance(value, bool):
        got = json.dumps(value)
    elif isinstance(value, datetime.date):
        got = f"the date {value.isoformat()}"
    else:
        got = f"the number {_short(value)}"
    shown = got.removeprefix("the date ").removeprefix("the number ")
    written = written if written is not None else shown
    read_as = f" (YAML reads {written} unquoted as {shown})" if written.lower() != shown else ""
    return f'expected a string, got {got}{read_as}: write it in quotes, "{written}"'


def _expected_tags(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    return str(ctx.get("expected_tags", "")).replace("'", "")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed_keys(path: PathKey, data: Any, root: type[BaseModel]) -> list[str]:
    """Field names of the config model at `path` (following the data through unions)."""
    model = _model_in(*_annotation_at(path, data, root))
    # A field whose key is a Python keyword (a line's `in`) is spelt by its alias.
    return [field.alias or name for name, field in model.model_fields.items()] if model else []


def _union_tags(path: PathKey, data: Any, root: type[BaseModel]) -> list[str]:
    """The `type` values a tagged union at `path` accepts."""
    annotation, _ = _annotation_at(path, data, root)
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = typing.get_args(annotation) or (annotation,)
    tags: list[str] = []
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel) and "type" in member.model_fields:
            tags.extend(str(t) for t in typing.get_args(member.model_fields["type"].annotation))
    return tags


def _annotation_at(path: PathKey, data: Any, root: type[BaseModel]) -> tuple[Any, Any]:
    """Walk the config models from `root` and the data together; return (annotation, data) at `path`."""
    annotation: Any = root
    node = data
    keyed: Callable[[str], Any] | None = None  # a mapping whose values' model depends on their key
    for part in path:
        if isinstance(part, int):
            args = typing.get_args(_strip_optional(annotation))
            annotation = args[0] if args else None
            node = node[part] if isinstance(node, list) and part < len(node) else None
            continue
        if keyed is not None:  # e.g. backends.options.<backend name>
            annotation, keyed = keyed(part), None
        else:
            model = _model_in(annotation, node)
            field = model.model_fields.get(part) if model else None
            if field is None:
                return None, None
            annotation = field.annotation
            keyed = next((m.model_for_key for m in field.metadata if hasattr(m, "model_for_key")), None)
        node = node.get(part) if isinstance(node, dict) else None
    return annotation, node


def _strip_optional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _model_in(annotation: Any, node: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation such as `X | None`, `list[X]`, or a tagged union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_in(args[0], node)
    if origin in (typing.Union, types.UnionType):
        candidates = [m for m in (_model_in(a, node) for a in args) if m is not None]
        if isinstance(node, dict) and "type" in node:
            for candidate in candidates:
                tag = candidate.model_fields.get("type")
                if tag is not None and node["type"] in typing.get_args(tag.annotation):
                    return candidate
        return candidates[0] if len(candidates) == 1 else None
    return None
