"""agent.yaml -> typed, validated config objects, one module per section.

Every model forbids unknown keys so a typo is an error, not a silently ignored setting.
Validators do no I/O: whether a file exists or a broker answers is checked when it is used,
so a config can be validated on a laptop for a box it will run on (password files too: they are
read when the connection is made, `read_password`).
Passwords are held as `SecretStr`: repr, logs and JSON dumps show `**********`, never the secret.
Loading (YAML with line numbers, ${ENV} interpolation, error formatting) lives in
`agent/config_loader.py`.

Sections: `base` (StrictModel, names, secrets, logins), `mqtt`, `registry` (and a pipeline's
model), `sources`, `processing` (pre/postprocess), `analytics` (zones and lines), `backends`
(selection and each backend's options), `pipeline`, `fleet`, `agent` (the whole file: AgentConfig).
Import from here.
"""

from agent.config.agent import (
    HA_OBJECT_ID_PATTERN,
    AgentConfig,
    DeviceConfig,
    HomeAssistantConfig,
    StateTopicsConfig,
    StoreConfig,
    TelemetryConfig,
)
from agent.config.analytics import (
    LineConfig,
    SnapshotRetentionConfig,
    SnapshotsConfig,
    TrackConfig,
    ZoneConfig,
    polygon_problem,
    zones_and_lines,
)
from agent.config.attributes import AttributeConfig, AttributeCrop, AttributeWhen
from agent.config.backends import (
    BackendChoiceConfig,
    SelectionConfig,
)
from agent.config.base import (
    NAME_PATTERN,
    REVEAL_SECRETS,
    Name,
    Secret,
    StrictModel,
    check_name,
    read_password,
)
from agent.config.clips import ClipsConfig
from agent.config.filters import FiltersConfig, ObjectMask, ObjectRule
from agent.config.fleet import CommandsConfig, FleetConfig, HealthWindowConfig
from agent.config.motion import MotionConfig, MotionMaskConfig
from agent.config.mqtt import CLIENT_ID_MAX, MqttConfig, OutboxConfig, TlsConfig, check_client_id
from agent.config.pipeline import HomeAutomationConfig, PipelineConfig, ReportConfig, check_watch_label
from agent.config.processing import (
    AnyPreprocessConfig,
    AudioPreprocessConfig,
    ClassificationPostprocess,
    DetectionPostprocess,
    PluginPostprocess,
    PostprocessConfig,
    PreprocessConfig,
    QuantizationConfig,
    RawPostprocess,
    RegionsPostprocess,
    ResizeConfig,
    StateLink,
    ThresholdPostprocess,
)
from agent.config.registry import LOCAL_VERSION, ModelRef, RegistryConfig, RegistryConnection, TrustedKey
from agent.config.sources import (
    GST_PREFIX,
    MAX_FPS,
    AudioSourceConfig,
    MqttSourceConfig,
    ReplaySourceConfig,
    SerialSourceConfig,
    SourceConfig,
    SourceUri,
    VideoSourceConfig,
    is_gst_pipeline,
)

__all__ = [
    "CLIENT_ID_MAX",
    "GST_PREFIX",
    "HA_OBJECT_ID_PATTERN",
    "LOCAL_VERSION",
    "MAX_FPS",
    "NAME_PATTERN",
    "REVEAL_SECRETS",
    "AgentConfig",
    "AnyPreprocessConfig",
    "AttributeConfig",
    "AttributeCrop",
    "AttributeWhen",
    "AudioPreprocessConfig",
    "AudioSourceConfig",
    "BackendChoiceConfig",
    "ClassificationPostprocess",
    "ClipsConfig",
    "CommandsConfig",
    "DetectionPostprocess",
    "DeviceConfig",
    "FiltersConfig",
    "FleetConfig",
    "HealthWindowConfig",
    "HomeAssistantConfig",
    "HomeAutomationConfig",
    "LineConfig",
    "ModelRef",
    "MotionConfig",
    "MotionMaskConfig",
    "MqttConfig",
    "MqttSourceConfig",
    "Name",
    "ObjectMask",
    "ObjectRule",
    "OutboxConfig",
    "PipelineConfig",
    "PluginPostprocess",
    "PostprocessConfig",
    "PreprocessConfig",
    "QuantizationConfig",
    "RawPostprocess",
    "RegionsPostprocess",
    "RegistryConfig",
    "RegistryConnection",
    "ReplaySourceConfig",
    "ReportConfig",
    "ResizeConfig",
    "Secret",
    "SelectionConfig",
    "SerialSourceConfig",
    "SnapshotRetentionConfig",
    "SnapshotsConfig",
    "SourceConfig",
    "SourceUri",
    "StateLink",
    "StateTopicsConfig",
    "StoreConfig",
    "StrictModel",
    "TelemetryConfig",
    "ThresholdPostprocess",
    "TlsConfig",
    "TrackConfig",
    "TrustedKey",
    "VideoSourceConfig",
    "ZoneConfig",
    "check_client_id",
    "check_name",
    "check_watch_label",
    "is_gst_pipeline",
    "polygon_problem",
    "read_password",
    "zones_and_lines",
]
