"""The whole agent.yaml: the device, its sections and its pipelines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from agent.config.analytics import SnapshotRetentionConfig
from agent.config.backends import SelectionConfig
from agent.config.base import TOPIC_SPECIALS, Name, StrictModel
from agent.config.fleet import FleetConfig
from agent.config.mqtt import MqttConfig
from agent.config.pipeline import PipelineConfig
from agent.config.registry import RegistryConfig
from agent.config.web import WebConfig
from agent.logfmt import LogFormat, LogLevel
from agent.state_dir import DEFAULT_STATE_DIR


class DeviceConfig(StrictModel):
    id: Name = Field(description="Unique id of this box; used in every MQTT topic.")
    groups: list[Name] = Field(default_factory=list, description="Fleet groups this box belongs to.")

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == "groups":
            raise ValueError("'groups' is reserved: <prefix>/groups/... carries fleet group topics")
        return value


class TelemetryConfig(StrictModel):
    """Periodic health on <prefix>/<device>/telemetry (QoS 0, not retained)."""

    interval_s: float = Field(
        60.0,
        ge=0,
        le=86_400,
        description="Seconds between reports; 0 turns telemetry off. While the broker is away reports are "
        "skipped (and counted), never queued: the next one says how things are; results keep the outbox.",
        json_schema_extra={"anyOf": [{"const": 0}, {"minimum": 1}]},  # `_not_too_often`
    )

    @field_validator("interval_s")
    @classmethod
    def _not_too_often(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError("must be 0 (off) or at least 1 second")
        return value


class StoreConfig(StrictModel):
    """What the local model store keeps (`edge-agent models gc` and the daemon after each pull).
    A version a configured pipeline names is never removed."""

    keep_versions: int = Field(
        3, ge=1, description="Versions kept per model, newest installed first (for instant rollback)."
    )
    max_bytes: int | None = Field(
        None, ge=0, description="Remove the oldest unused versions while the store holds more than this."
    )
    max_age_days: float | None = Field(
        None, gt=0, description="Remove unused versions installed longer ago than this."
    )


# Home Assistant's discovery topic allows only these in its object id (homeassistant/device/<id>/config).
HA_OBJECT_ID_PATTERN = r"^[A-Za-z0-9_-]+$"


def _check_topic_prefix(value: str) -> str:
    levels = value.split("/")
    if not value or any(not level for level in levels):
        raise ValueError(f"{value!r} is not a topic prefix: no empty levels (nor a leading or trailing '/')")
    bad = [c for c in TOPIC_SPECIALS if c in value.replace("/", "")]
    if bad:
        raise ValueError(f"{value!r} holds {', '.join(repr(c) for c in bad)}: not allowed in a topic")
    return value


class StateTopicsConfig(StrictModel):
    """Retained per pipeline state on simple topics under <prefix>/<device>/state/<pipeline>/ (last
    label, counts, ON/OFF per watched label), published on change: Home Assistant sensors and Node-RED
    flows read them without templates (docs/integrations.md)."""

    enabled: bool = Field(False, description="Publish them (home_assistant.enabled turns them on too).")


class HomeAssistantConfig(StrictModel):
    """Home Assistant MQTT discovery: one device per box, entities per pipeline (docs/integrations.md)."""

    enabled: bool = Field(
        False,
        description="Publish the device discovery config (retained) and the state topics it names; "
        "turning it off removes the device from Home Assistant.",
    )
    discovery_prefix: Annotated[str, AfterValidator(_check_topic_prefix)] = Field(
        "homeassistant", description="Home Assistant's discovery prefix (its MQTT integration's setting)."
    )
    object_id: str | None = Field(
        None,
        pattern=HA_OBJECT_ID_PATTERN,
        description="The device's id in the discovery topic <discovery_prefix>/device/<object_id>/config: "
        "letters, digits, '_' and '-'. Default: device.id (which the broker ACL expects).",
    )
    device_name: str | None = Field(
        None, min_length=1, description="The device's name in Home Assistant; default: device.id."
    )
    support_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Shown by Home Assistant as where to get help with this agent (origin support URL).",
    )


def _registry_when_a_pipeline_names_one(schema: dict[str, Any]) -> None:
    """AgentConfig's JSON Schema says what `_check` decides: a pipeline whose model is no file on the
    box (no string `path`) needs a registry."""
    a_file = {"required": ["path"], "properties": {"path": {"type": "string"}}}
    registry_model = {"properties": {"model": {"not": a_file}}}
    schema["if"] = {"properties": {"pipelines": {"contains": registry_model}}, "required": ["pipelines"]}
    schema["then"] = {"required": ["registry"], "properties": {"registry": {"type": "object"}}}


class AgentConfig(StrictModel):
    model_config = ConfigDict(json_schema_extra=_registry_when_a_pipeline_names_one)

    device: DeviceConfig
    state_dir: Path = Field(DEFAULT_STATE_DIR, description="Model store, outbox and decisions.")
    log_level: LogLevel = "info"
    log_format: LogFormat = Field(
        "text", description="text: plain lines (no time under journald); json: one JSON object per line."
    )
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    registry: RegistryConfig | None = Field(None, description="Where models are pulled from.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="What the model store keeps.")
    backends: SelectionConfig = Field(default_factory=SelectionConfig, description="Backend selection.")
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, description="Periodic health reports."
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig, description="Fleet updates over MQTT (docs/fleet.md)."
    )
    state_topics: StateTopicsConfig = Field(
        default_factory=StateTopicsConfig,
        description="Retained per pipeline state on simple topics (docs/integrations.md).",
    )
    home_assistant: HomeAssistantConfig = Field(
        default_factory=HomeAssistantConfig,
        description="Home Assistant MQTT discovery (docs/integrations.md).",
    )
    snapshots: SnapshotRetentionConfig = Field(
        default_factory=SnapshotRetentionConfig,
        description="How many tracked objects' snapshots the state dir keeps (docs/analytics.md).",
    )
    web: WebConfig = Field(
        default_factory=WebConfig, description="The optional local web page (docs/web.md); off by default."
    )
    pipelines: list[PipelineConfig] = Field(default_factory=list)

    @field_validator("pipelines")
    @classmethod
    def _unique_names(cls, pipelines: list[PipelineConfig]) -> list[PipelineConfig]:
        seen: set[str] = set()
        for pipeline in pipelines:
            if pipeline.name in seen:
                raise ValueError(f"pipeline name {pipeline.name!r} is used twice")
            seen.add(pipeline.name)
        return pipelines

    @model_validator(mode="after")
    def _check(self) -> AgentConfig:
        if self.registry is None and any(p.model.path is None for p in self.pipelines):
            raise ValueError("pipelines name registry models, so a registry is required (or give model.path)")
        ha = self.home_assistant
        if ha.enabled and ha.object_id is None and not re.fullmatch(HA_OBJECT_ID_PATTERN, self.device.id):
            raise ValueError(
                f"home_assistant: device.id {self.device.id!r} cannot be Home Assistant's object id "
                "(letters, digits, '_' and '-' only): set home_assistant.object_id"
            )
        return self

    @property
    def state_topics_on(self) -> bool:
        """The state topics are published: asked for, or needed by Home Assistant discovery."""
        return self.state_topics.enabled or self.home_assistant.enabled
