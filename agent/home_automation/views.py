"""What a pipeline shows: the `PipelineView` of a classification or detection pipeline, its entities,
and the `PipelineState` of its state topics (label, counts, ON/OFF per watched label)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.config import ClassificationPostprocess, DetectionPostprocess, PipelineConfig

ON, OFF = b"ON", b"OFF"
QOS = 1


@dataclass(frozen=True)
class PipelineView:
    """The part of a pipeline's config this module uses."""

    name: str
    kind: str  # "classification" | "detection"
    watch: tuple[str, ...]
    off_delay_s: float
    image: bool
    image_interval_s: float

    @classmethod
    def of(cls, config: PipelineConfig) -> PipelineView | None:
        """None for pipelines without labels (regions, threshold, raw, plugins): no state topics."""
        post = config.postprocess
        if isinstance(post, ClassificationPostprocess):
            kind = "classification"
        elif isinstance(post, DetectionPostprocess):
            kind = "detection"
        else:
            return None
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

    key: tuple[str, ...]  # topic levels under state/<pipeline>/: ("label",), ("seen", "person")
    platform: str  # sensor | binary_sensor | image
    name: str
    options: tuple[tuple[str, Any], ...] = ()


def entities(view: PipelineView) -> list[Entity]:
    """What `view`'s pipeline publishes, in a stable order."""
    p = view.name
    out: list[Entity] = []
    if view.kind == "classification":
        out.append(Entity(("label",), "sensor", f"{p} label", (("icon", "mdi:label-outline"),)))
    else:
        out.append(Entity(("count",), "sensor", f"{p} count", (("state_class", "measurement"),)))
        for label in view.watch:
            options = (("state_class", "measurement"),)
            out.append(Entity(("count", label), "sensor", f"{p} {label} count", options))
    out += [Entity(("seen", label), "binary_sensor", f"{p} {label}") for label in view.watch]
    if view.image:
        out.append(Entity(("image",), "image", f"{p} image", (("content_type", "image/jpeg"),)))
    return out


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
