"""Fleet updates over MQTT: desired state, the health window of a new version, remote commands."""

from __future__ import annotations

from pydantic import Field

from agent.config.base import StrictModel


class HealthWindowConfig(StrictModel):
    """How a pipeline version that came over desired state proves itself before it is kept: over
    its first `window_s` of running, judged against these limits; failing them rolls it back."""

    window_s: float = Field(30.0, ge=1, le=3600, description="How long a new version is watched.")
    max_error_rate: float = Field(
        0.2, ge=0, le=1, description="Most failed frames / frames in the window before it is unhealthy."
    )
    min_frames: int = Field(
        3,
        ge=1,
        description="Frames the new version must process in the window, else it is unhealthy "
        "(a stage that never runs is not healthy).",
    )
    max_latency_ms: float | None = Field(
        None,
        gt=0,
        description="Most median inference time in the window (judged on 5 frames or more); None: no limit.",
    )
    max_latency_ratio: float = Field(
        3.0,
        gt=1,
        description="Most new inference time over the previous version's: fastest runs side by side "
        "(else the new median over the figure recorded before the swap).",
    )
    nan_is_failure: bool = Field(True, description="A frame whose outputs hold NaN or inf counts as failed.")


class CommandsConfig(StrictModel):
    """Which commands on <prefix>/<device>/cmd/<name> this box answers (docs/fleet.md, Commands)."""

    enabled: bool = Field(True, description="Answer commands at all.")
    allow: list[str] | None = Field(None, description="Command names answered; None: every one.")
    deny: list[str] = Field(default_factory=list, description="Command names refused ('disallowed').")
    max_per_minute: int = Field(60, ge=1, description="More requests in a minute are refused ('busy').")


class FleetConfig(StrictModel):
    """Fleet updates over MQTT: desired state, health windows, commands (docs/fleet.md)."""

    enabled: bool = Field(True, description="Subscribe to desired state (this device's and its groups').")
    max_document_bytes: int = Field(
        65_536, ge=1024, le=1_048_576, description="Larger desired-state documents are refused unread."
    )
    health: HealthWindowConfig = Field(
        default_factory=HealthWindowConfig,
        description="The health window of pipelines whose document gives none.",
    )
    commands: CommandsConfig = Field(default_factory=CommandsConfig, description="Remote commands.")
    phase_timeout_s: float = Field(
        1800.0, ge=10, description="Deadline of each reconcile phase (pull, validate, build, health check)."
    )
