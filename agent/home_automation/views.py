"""What a pipeline shows: the `PipelineView` of a pipeline, its entities, and the `PipelineState` of
its state topics (label, counts, ON/OFF per watched label of a classification or detection pipeline;
the frame rate and the serving backend of every pipeline), and the box's own (`DEVICE`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.config import ClassificationPostprocess, DetectionPostprocess, PipelineConfig

ON, OFF = b"ON", b"OFF"
QOS = 1
# The state-topic level of the box's own values (`<prefix>/<device>/state/_device/...`): no pipeline
# name starts with "_" (agent/config/base.py NAME_PATTERN), so it never clashes with one.
DEVICE = "_device"


@dataclass(frozen=True)
class PipelineView:
    """The part of a pipeline's config this module uses."""

    name: str
    kind: str  # "classification" | "detection" | "other" (no labels: regions, threshold, raw, plugins)
    watch: tuple[str, ...]
    off_delay_s: float
    image: bool
    image_interval_s: float

    @classmethod
    def of(cls, config: PipelineConfig) -> PipelineView:
        """Pipelines without labels ("other") have only the frame rate and backend topics."""
        post = config.postprocess
        if isinstance(post, ClassificationPostprocess):
            kind = "classification"
        elif isinstance(post, DetectionPostprocess):
            kind = "detection"
        else:
            kind = "other"
        home = config.home_automation
        return cls(
            config.name,
            kind,
            tuple(home.watch),
            home.off_delay_s,
            home.image and kind == "detection",
            home.image_interval_s,
        )


@dataclass(frozen=True)
class Entity:
    """One state topic and, for Home Assistant, the component that shows it."""

    key: tuple[str, ...]  # topic levels under state/<pipeline>/: ("label",), ("seen", "person"), ("fps",)
    platform: str  # sensor | binary_sensor | image
    name: str
    options: tuple[tuple[str, Any], ...] = ()


def entities(view: PipelineView) -> list[Entity]:
    """What `view`'s pipeline publishes, in a stable order."""
    p = view.name
    out: list[Entity] = []
    if view.kind == "classification":
        out.append(Entity(("label",), "sensor", f"{p} label", (("icon", "mdi:label-outline"),)))
    elif view.kind == "detection":
        out.append(Entity(("count",), "sensor", f"{p} count", (("state_class", "measurement"),)))
        for label in view.watch:
            options = (("state_class", "measurement"),)
            out.append(Entity(("count", label), "sensor", f"{p} {label} count", options))
    out += [Entity(("seen", label), "binary_sensor", f"{p} {label}") for label in view.watch]
    if view.image:
        out.append(Entity(("image",), "image", f"{p} image", (("content_type", "image/jpeg"),)))
    fps = (("state_class", "measurement"), ("unit_of_measurement", "fps"), ("suggested_display_precision", 1))
    out.append(Entity(("fps",), "sensor", f"{p} fps", (*fps, ("icon", "mdi:speedometer"))))
    diagnostic = (("entity_category", "diagnostic"),)
    out.append(Entity(("backend",), "sensor", f"{p} backend", (("icon", "mdi:chip"), *diagnostic)))
    return out


# The box's connectivity, read from its retained status ({"status": "online" | "offline", ...}).
CONNECTIVITY = Entity(
    ("online",),
    "binary_sensor",
    "online",
    (
        ("device_class", "connectivity"),
        ("entity_category", "diagnostic"),
        ("value_template", "{{ value_json.status }}"),
        ("payload_on", "online"),
        ("payload_off", "offline"),
    ),
)


def device_entities() -> list[Entity]:
    """The box's own values under state/_device/ (its connectivity reads the status topic)."""
    pending = (("state_class", "measurement"), ("unit_of_measurement", "messages"), ("icon", "mdi:tray-full"))
    return [
        Entity(("outbox_pending",), "sensor", "outbox backlog", (*pending, ("entity_category", "diagnostic")))
    ]


def health_values(pipeline: Mapping[str, Any]) -> dict[tuple[str, ...], bytes]:
    """A pipeline's frame rate (1 decimal) and serving backend from its status (agent/supervisor/:
    `fps`, `backend`); what it does not know yet is left out."""
    values: dict[tuple[str, ...], bytes] = {}
    if pipeline.get("fps") is not None:
        values[("fps",)] = f"{float(pipeline['fps']):.1f}".encode()
    if pipeline.get("backend"):
        values[("backend",)] = str(pipeline["backend"]).encode()
    return values


def label_of(entry: Mapping[str, Any]) -> str:
    """A result entry's label; its class index as text when the model has no labels."""
    label = entry.get("label")
    return str(label) if label is not None else str(entry.get("index"))


class PipelineState:
    """A pipeline's current state-topic values (topic levels -> payload), from its published results."""

    def __init__(self, view: PipelineView) -> None:
        self.view = view
        self.values: dict[tuple[str, ...], bytes] = {}
        self.present: set[str] = set()  # watched labels in the last result
        self.last_seen: dict[str, float] = {}  # watched label -> when it was last in a result (monotonic)

    def update(self, output: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        """Take a published result's `output`; returns its detections (for the image)."""
        detections: list[dict[str, Any]] = []
        if self.view.kind == "other":
            return detections
        if self.view.kind == "classification":
            top = output.get("top") or []
            if not top:
                return detections
            label = label_of(top[0])
            self.values[("label",)] = label.encode()
            labels = [label]
        else:
            detections = list(output.get("detections") or [])
            labels = [label_of(d) for d in detections]
            self.values[("count",)] = str(len(detections)).encode()
            for watched in self.view.watch:
                self.values[("count", watched)] = str(labels.count(watched)).encode()
        self.present = {label for label in labels if label in self.view.watch}
        for watched in self.view.watch:
            if watched in self.present:
                self.last_seen[watched] = now
                self.values[("seen", watched)] = ON
            elif self._off_due(watched, now):
                self.values[("seen", watched)] = OFF
        return detections

    def expire(self, now: float) -> None:
        """Turn OFF what has been missing for off_delay_s (called every tick)."""
        for watched in self.view.watch:
            on = self.values.get(("seen", watched)) == ON
            if on and watched not in self.present and self._off_due(watched, now):
                self.values[("seen", watched)] = OFF

    def _off_due(self, label: str, now: float) -> bool:
        seen = self.last_seen.get(label)
        return seen is None or now - seen >= self.view.off_delay_s
