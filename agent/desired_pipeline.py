"""What `Supervisor.apply` takes: a pipeline the device should run, with where it came from. The
supervisor's own input type, so that it needs nothing of the fleet package that feeds it (agent.yaml
and reload give it too)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config import HealthWindowConfig, PipelineConfig


@dataclass(frozen=True)
class DesiredPipeline:
    """A pipeline the device should run, with where it came from (reported state names both)."""

    config: PipelineConfig
    layer: str = "yaml"  # "yaml", or the document's layer
    generation: int | None = None  # the document's generation; None for yaml
    # The window a new version must pass before it is kept: the document's, else fleet.health;
    # None for agent.yaml's pipelines (kept as soon as they run).
    health: HealthWindowConfig | None = None
