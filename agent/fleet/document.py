"""The desired-state document (docs/fleet.md) as both sides of the fleet read it: what one is
(`DesiredDocument`) and the check every payload passes (`parse_document`). Part of the protocol the
device side (agent/fleet/desired.py, on what comes over MQTT) and the controller
(agent/fleetctl/spec.py, before it publishes) share, so the controller refuses what the devices
would refuse, with their messages. Pure: no broker, no threads, no files.

A document is refused whole, with every problem found, each `<layer>: <JSON path>: message`.
Pipelines are validated by the same models and with the same messages as agent.yaml
(agent/config_loader.py).
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

from pydantic import BeforeValidator, Field, StrictInt, ValidationError

from agent.config import (
    HealthWindowConfig,
    Name,
    PipelineConfig,
    StrictModel,
    check_name,
    is_gst_pipeline,
)
from agent.config_loader import PathKey, validation_problems
from agent.errors import DesiredStateError
from agent.fleet import protocol
from agent.registry.signing import SignatureError, TrustPolicy

# Real documents nest about 6 levels; a deeper one is refused before anything walks it recursively.
MAX_NESTING = 32
# A document issued further in the future than this means a wrong clock here or at the controller.
MAX_CLOCK_SKEW_S = 300.0
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
_LAYER_KINDS = ("device", "group")


# --- what a document is ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rollout:
    """A staged rollout (docs/fleet.md, Staged rollouts). With phase "all", canary_percent and seed
    are what the document gave (0 and "" when it gave none) and do not matter."""

    phase: Literal["canary", "all"]
    canary_percent: float
    seed: str
    baseline: dict[str, PipelineConfig | None]


class AgentRelease(StrictModel):
    """`agent`: the edge-agent release the device should run (docs/fleet.md, Agent releases): a
    wheel published to the registry as `release@version`, confirmed within `health_s`."""

    version: Name = Field(description="The edge-agent version, e.g. 0.2.0.")
    release: Name = Field("edge-agent", description="The registry name the release wheels are published as.")
    health_s: float = Field(
        60.0,
        ge=10,
        le=3600,
        strict=False,
        description="How long a new version has to prove itself healthy (twice that: rolled back).",
    )


@dataclass(frozen=True)
class DesiredDocument:
    """An accepted desired-state document. `raw` is the payload as received (the signed envelope,
    when signed): it is what is persisted, so a restart checks the signature again."""

    layer: str
    generation: int
    priority: int
    issued_at: float | None
    expires_at: float | None
    pipelines: dict[str, PipelineConfig | None]
    health: HealthWindowConfig | None
    rollout: Rollout | None
    raw: bytes
    key_id: str | None
    agent: AgentRelease | None = None

    def effective_pipelines(self, device_id: str) -> dict[str, PipelineConfig | None]:
        """What this document sets on `device_id`: `pipelines`, or during a canary wave the
        `baseline` for a device outside the cohort."""
        rollout = self.rollout
        if rollout is None or rollout.phase != "canary":
            return self.pipelines
        canary = protocol.in_canary(device_id, rollout.seed, rollout.canary_percent)
        return self.pipelines if canary else rollout.baseline


# --- parsing --------------------------------------------------------------------------------------


def _epoch(value: Any) -> float | None:
    """An RFC 3339 time (with a UTC offset) as epoch seconds."""
    if value is None:
        return None
    example = "such as 2026-11-23T19:00:00Z"
    if not isinstance(value, str):
        raise ValueError(f"expected an RFC 3339 time {example}, got {_kind(value)}")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{_short(value)} is not an RFC 3339 time {example}") from None
    if moment.tzinfo is None:
        raise ValueError(f"{_short(value)} has no UTC offset: end it with Z or +HH:MM")
    try:
        return moment.timestamp()
    except OverflowError:
        raise ValueError(f"{_short(value)} is out of range") from None


Rfc3339 = Annotated[float | None, BeforeValidator(_epoch)]


class _RolloutDocument(StrictModel):
    """`rollout` as written; baseline pipelines are checked one by one like `pipelines`."""

    phase: Literal["canary", "all"]
    canary_percent: float | None = Field(None, ge=0, le=100, strict=True)
    seed: str | None = Field(None, min_length=1)
    baseline: dict[str, Any] = Field(default_factory=dict)


class _Document(StrictModel):
    """A desired-state document's top level as written (docs/fleet.md); pipelines are checked one
    by one, so each problem gets its own path."""

    schema_version: Literal[1]
    target: str
    generation: StrictInt = Field(ge=1)
    priority: StrictInt = 0
    issued_at: Rfc3339 = None
    expires_at: Rfc3339 = None
    pipelines: dict[str, Any] = Field(default_factory=dict)
    health: HealthWindowConfig | None = None
    rollout: _RolloutDocument | None = None
    agent: AgentRelease | None = None


class Problems:
    """Collects `<layer>: <JSON path>: message` lines; `fail` ends the parse at once."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self.lines: list[str] = []

    def add(self, path: PathKey, message: str) -> None:
        self.lines.append(f"{self.layer}: {json_path(path)}: {message}")

    def fail(self, path: PathKey, message: str, hint: str | None = None) -> NoReturn:
        self.add(path, message)
        raise DesiredStateError(self.layer, self.lines, hint)

    def raise_any(self) -> None:
        if self.lines:
            raise DesiredStateError(self.layer, self.lines)


def check_layer(layer: str) -> str:
    """ValueError unless `layer` is "device:<name>" or "group:<name>" (it becomes a file name)."""
    kind, _, name = layer.partition(":")
    if kind not in _LAYER_KINDS:
        raise ValueError(f"layer {layer!r} must be device:<id> or group:<name>")
    check_name(name)
    return layer


def json_path(path: PathKey) -> str:
    """`$.pipelines.door-cam.state[0].input`; keys that are not plain (a '.' in a pipeline name)
    are bracketed, `$.pipelines["cam.1"]`."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def parse_document(
    payload: bytes, layer: str, trust: TrustPolicy, max_bytes: int, now: float
) -> DesiredDocument:
    """Check one desired-state document that came on `layer`'s topic ("device:<id>" or
    "group:<name>"); DesiredStateError listing every problem when it is refused.

    With `trust.required` the payload must be a signed envelope, and the signature is checked
    before the document is validated (against the model names it uses, read from it first). The
    replay rule needs what was applied before: see `admit`. An empty payload (the MQTT way to
    delete a retained message) withdraws the layer; the caller handles it before calling this.
    """
    check_layer(layer)
    problems = Problems(layer)
    if not payload:
        problems.fail((), "the payload is empty (an empty retained message withdraws the document)")
    if len(payload) > max_bytes:
        problems.fail(
            (), f"the payload is {len(payload)} bytes, over fleet.max_document_bytes ({max_bytes}): not read"
        )
    data = _load_json(payload, "the payload", problems)
    signer = None
    if protocol.is_envelope(data):
        data, signer = _open_envelope(data, trust, problems)
    elif trust.required:
        problems.fail(
            (),
            "the document is unsigned, and this agent takes only signed desired state "
            "(registry.trusted_keys lists keys)",
            hint="publish it in a signed envelope: edge-agent fleet deploy --sign KEY",
        )
    if not isinstance(data, dict):
        problems.fail((), f"expected a JSON object, got {_kind(data)}")
    return _check_document(data, payload, signer, now, problems)


def _open_envelope(data: dict[str, Any], trust: TrustPolicy, problems: Problems) -> tuple[Any, str | None]:
    """The signed document of an envelope, and the trusted key that signed it. Without trusted keys
    signatures are not required, and with no key to check them by they are not checked."""
    try:
        signed, signatures = protocol.open_envelope(data, "in the signed envelope")
    except UnicodeEncodeError:  # a ValueError too: handled first
        problems.fail((), 'the signed envelope\'s "document" holds a lone surrogate escape: not UTF-8')
    except ValueError as exc:
        problems.fail((), str(exc))
    except SignatureError as exc:
        problems.fail((), exc.message)
    document = _load_json(signed, "the signed document", problems)
    if not trust.required:
        return document, None
    if not isinstance(document, dict):  # fail closed: nothing to ask the trust policy about
        problems.fail((), f"the signed document must be a JSON object, got {_kind(document)}")
    try:
        signer = trust.verify(signed, signatures, _model_names(document), "the desired-state document")
    except SignatureError as exc:
        problems.fail((), exc.message, exc.hint)
    return document, signer


def _model_names(document: Mapping[str, Any]) -> list[str]:
    """The model names the document's pipelines and baseline use, read without validating it: what
    the trust policy needs to say which keys may sign it. The full check comes after the signature
    (a pipeline without a string model name cannot pass it)."""
    names = set()
    release = document.get("agent")
    if isinstance(release, dict):  # a key that may sign the release may send the box to it
        name = release.get("release", "edge-agent")
        if isinstance(name, str):
            names.add(name)
    for _, section in _sections(document):
        if not isinstance(section, dict):
            continue
        for pipeline in section.values():
            model = pipeline.get("model") if isinstance(pipeline, dict) else None
            name = model.get("name") if isinstance(model, dict) else None
            if isinstance(name, str):
                names.add(name)
    return sorted(names)


def _sections(document: Mapping[str, Any]) -> list[tuple[PathKey, Any]]:
    """Where a document writes pipelines, as written: `pipelines` and `rollout.baseline`."""
    rollout = document.get("rollout")
    baseline = rollout.get("baseline") if isinstance(rollout, dict) else None
    return [(("pipelines",), document.get("pipelines")), (("rollout", "baseline"), baseline)]


def _check_document(
    data: dict[str, Any], payload: bytes, signer: str | None, now: float, problems: Problems
) -> DesiredDocument:
    version = data.get("schema_version")
    if type(version) is not int or version != protocol.SCHEMA_VERSION:  # True == 1, but is no version
        got = "it is missing" if "schema_version" not in data else f"got {_short(version)}"
        problems.fail(
            ("schema_version",), f"this agent reads schema_version {protocol.SCHEMA_VERSION}; {got}"
        )
    target = data.get("target")
    if isinstance(target, str) and target != problems.layer:
        problems.fail(
            ("target",),
            f"the document is for {_short(target)}, not {problems.layer}: a document for another "
            "device or group is refused (published on the wrong topic, or replayed)",
        )
    document: _Document | None = None
    try:
        document = _Document.model_validate(data)
    except ValidationError as exc:
        for path, message in validation_problems(exc, data, _Document, "json"):
            problems.add(path, message)
    # Pipelines are checked even when the top level failed, so one answer lists every problem.
    pipelines, baseline = (_pipelines(section, path, problems) for path, section in _sections(data))
    if document is None:  # its validation error added problems
        raise DesiredStateError(problems.layer, problems.lines)
    if document.expires_at is not None and document.expires_at <= now:
        problems.add(("expires_at",), f"the document expired at {data['expires_at']}")
    if document.issued_at is not None and document.issued_at > now + MAX_CLOCK_SKEW_S:
        problems.add(
            ("issued_at",),
            f"{data['issued_at']} is {document.issued_at - now:.0f} s in the future (more than "
            f"{MAX_CLOCK_SKEW_S:.0f} s: is this device's clock right?)",
        )
    rollout = None
    if document.rollout is not None:
        spec = document.rollout
        if spec.phase == "canary":
            for key in ("canary_percent", "seed"):
                if getattr(spec, key) is None:
                    problems.add(("rollout", key), "required with phase canary (it picks the canary devices)")
        rollout = Rollout(spec.phase, spec.canary_percent or 0.0, spec.seed or "", baseline)
    problems.raise_any()
    return DesiredDocument(
        layer=problems.layer,
        generation=document.generation,
        priority=document.priority,
        issued_at=document.issued_at,
        expires_at=document.expires_at,
        pipelines=pipelines,
        health=document.health,
        rollout=rollout,
        raw=payload,
        key_id=signer,
        agent=document.agent,
    )


def _pipelines(section: Any, prefix: PathKey, problems: Problems) -> dict[str, PipelineConfig | None]:
    """Validate a name -> pipeline (or null) mapping; one that is not a mapping is the top-level
    model's problem to report."""
    result: dict[str, PipelineConfig | None] = {}
    if not isinstance(section, dict):
        return result
    for key, value in section.items():
        where = (*prefix, key)
        try:
            check_name(key)
        except ValueError as exc:
            problems.add(where, f"pipeline name {exc}")
            continue
        if value is None:
            result[key] = None
            continue
        if not isinstance(value, dict):
            problems.add(where, f"expected a pipeline (an object) or null (removes it), got {_kind(value)}")
            continue
        refused = list(_refused(value))
        for path, message in refused:
            problems.add((*where, *path), message)
        if refused:  # what pydantic would add about them would only confuse
            continue
        if "name" in value:
            problems.add((*where, "name"), "unknown key: the pipeline's key is its name")
        config = {**value, "name": key}
        try:
            result[key] = PipelineConfig.model_validate(config)
        except ValidationError as exc:
            for path, message in validation_problems(exc, config, PipelineConfig, "json"):
                problems.add((*where, *path), message)
    return result


def _refused(pipeline: Mapping[str, Any]) -> Iterator[tuple[PathKey, str]]:
    """What agent.yaml may say but a document from the broker may not: anything that makes the box
    run its own files or code."""
    model, source, post = (pipeline.get(k) for k in ("model", "source", "postprocess"))
    if isinstance(model, dict) and model.get("path") is not None:
        yield (
            ("model", "path"),
            "desired state names registry models, never local files: give the model's registry name "
            "and version",
        )
    if isinstance(post, dict) and post.get("type") == "plugin":
        yield (
            ("postprocess", "type"),
            "desired state never names Python modules: plugin postprocessors are configured in agent.yaml",
        )
    video_uri = source.get("uri") if isinstance(source, dict) and source.get("type") == "video" else None
    if isinstance(video_uri, str) and is_gst_pipeline(video_uri):
        yield (
            ("source", "uri"),
            "desired state never runs GStreamer pipelines (their elements read and write any file): "
            "configure gst: sources in agent.yaml",
        )


# --- JSON ----------------------------------------------------------------------------------------


def _load_json(data: bytes, what: str, problems: Problems) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, no duplicate keys (a second reader could take the
    other value), at most MAX_NESTING levels."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.fail((), f"{what} is not UTF-8 text (byte {exc.start})")
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float)
    except json.JSONDecodeError as exc:
        problems.fail((), f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
    except RecursionError:
        problems.fail((), f"{what} nests too deeply (a document needs at most {MAX_NESTING} levels)")
    except ValueError as exc:  # from the hooks below, or an integer with too many digits
        problems.fail((), f"{what} is not valid JSON: {exc}")
    if _depth_exceeds(value, MAX_NESTING):
        problems.fail((), f"{what} nests more than {MAX_NESTING} levels deep")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {_short(key)} in an object")
        result[key] = value
    return result


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:30]} is out of range")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return json.dumps(value)  # a number, true, false or null


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
