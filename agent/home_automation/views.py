"""What a pipeline shows: the `PipelineView` of a pipeline, its entities, and the `PipelineState` of
its state topics (label, counts, ON/OFF per watched label of a classification or detection pipeline;
motion ON/OFF of a pipeline with a motion gate;
a tracking pipeline's objects, zone occupancy (per label too), stays, dwell, overcrowding, line
crossings (per label too), the last value read on an object through each zone and line (a pipeline
with attributes) and snapshots; the frame rate and the serving backend of every pipeline),
and the box's own (`DEVICE`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.config import ClassificationPostprocess, DetectionPostprocess, PipelineConfig
from agent.config.base import TOPIC_SPECIALS
from agent.processing.scene import attribute_text
from agent.status import PipelineStatus

ON, OFF = b"ON", b"OFF"
QOS = 1
# The state-topic level of the box's own values (`<prefix>/<device>/state/_device/...`): no pipeline
# name starts with "_" (agent/config/base.py NAME_PATTERN), so it never clashes with one.
DEVICE = "_device"
STAYS_KEPT = 20  # a zone's mean stay is over its last this many stays (exits)
MAX_STATE_CHARS = 255  # Home Assistant keeps a sensor's state to this many characters


@dataclass(frozen=True)
class ZoneView:
    """A zone's state topics: its count (and per label), its stays, and its dwell and overcrowding
    states where configured. Its shape is not part of it: a moved edge changes no topic (the scene
    keeps who is in the zone)."""

    name: str
    dwell: bool  # dwell_s is set: state/<pipeline>/zone/<name>/dwelling
    crowd: bool  # max_objects is set: state/<pipeline>/zone/<name>/overcrowded
    labels: tuple[str, ...] = ()  # its label filter's (those that can be topic levels): count/<label>
    attributes: tuple[str, ...] = ()  # the pipeline's attributes shown: zone/<name>/last/<attribute>


@dataclass(frozen=True)
class LineView:
    name: str
    directions: tuple[str, str]  # its `in` and `out` names: state/<pipeline>/line/<name>/<direction>
    labels: tuple[str, ...] = ()  # its label filter's: line/<name>/<direction>/<label>
    attributes: tuple[str, ...] = ()  # line/<name>/last/<attribute>


def _shown_attributes(config: PipelineConfig) -> tuple[str, ...]:
    """The attributes whose last value a zone's and a line's sensor shows: all but embeddings (a vector
    of hundreds of numbers is no sensor state)."""
    return tuple(a.name for a in config.attributes if a.postprocess.type != "embedding")


def _level_labels(labels: Sequence[str] | None) -> tuple[str, ...]:
    """A zone's or line's filter labels that can be a topic level (per-label topics)."""
    return tuple(label for label in labels or () if label_level_ok(label))


@dataclass(frozen=True)
class TrackingView:
    """A tracking pipeline's part (PipelineConfig.tracking): its zones, lines and snapshots."""

    zones: tuple[ZoneView, ...]
    lines: tuple[LineView, ...]
    snapshots: bool
    clips: bool = False  # clips.enabled: state/<pipeline>/clip, the latest event's clip id
    clip_urls: bool = False  # and the web page is on: state/<pipeline>/clip_url, its path there

    @classmethod
    def of(cls, config: PipelineConfig, web: bool = False) -> TrackingView | None:
        """`web`: the agent's web page is enabled (it serves the clips: /clips/<pipeline>/<id>)."""
        track = config.tracking
        if track is None:
            return None
        shown = _shown_attributes(config)
        zones = tuple(
            ZoneView(z.name, z.dwell_s is not None, z.max_objects is not None, _level_labels(z.labels), shown)
            for z in config.zones
        )
        lines = tuple(
            LineView(
                line.name,
                (line.in_, line.out),
                _level_labels(line.labels),
                # A direction named "last" has its per-label counts on line/<name>/last/<label>: an
                # attribute named like one of those labels would share its topic, and goes without.
                tuple(a for a in shown if "last" not in (line.in_, line.out) or a not in (line.labels or ())),
            )
            for line in config.lines
        )
        clips = config.clips.enabled
        return cls(zones, lines, track.snapshots.enabled, clips, clips and web)


@dataclass(frozen=True)
class PipelineView:
    """The part of a pipeline's config this module uses."""

    name: str
    kind: str  # "classification" | "detection" | "other" (no labels: regions, threshold, raw, plugins)
    watch: tuple[str, ...]
    off_delay_s: float
    image: bool
    image_interval_s: float
    tracking: TrackingView | None = None  # a tracking pipeline's zones, lines and snapshots
    results: bool = True  # report.results: the label, count and image follow the published results
    motion: bool = False  # the pipeline runs a motion gate: state/<pipeline>/motion ON/OFF

    @classmethod
    def of(cls, config: PipelineConfig, web: bool = False) -> PipelineView:
        """Pipelines without labels ("other") have only the frame rate and backend topics. `web`: the
        agent's web page is enabled."""
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
            TrackingView.of(config, web),
            config.report.results,
            config.motion_gate is not None,
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
    # The label and counts follow the published results: none without them (report.results: false).
    if view.results and view.kind == "classification":
        out.append(Entity(("label",), "sensor", f"{p} label", (("icon", "mdi:label-outline"),)))
    elif view.results and view.kind == "detection":
        out.append(Entity(("count",), "sensor", f"{p} count", (("state_class", "measurement"),)))
        for label in view.watch:
            options = (("state_class", "measurement"),)
            out.append(Entity(("count", label), "sensor", f"{p} {label} count", options))
    out += [Entity(("seen", label), "binary_sensor", f"{p} {label}") for label in view.watch]
    if view.image:
        out.append(Entity(("image",), "image", f"{p} image", (("content_type", "image/jpeg"),)))
    if view.tracking is not None:
        out += tracking_entities(p, view.tracking)
    if view.motion:
        out.append(Entity(("motion",), "binary_sensor", f"{p} motion", (("device_class", "motion"),)))
    fps = (("state_class", "measurement"), ("unit_of_measurement", "fps"), ("suggested_display_precision", 1))
    out.append(Entity(("fps",), "sensor", f"{p} fps", (*fps, ("icon", "mdi:speedometer"))))
    diagnostic = (("entity_category", "diagnostic"),)
    out.append(Entity(("backend",), "sensor", f"{p} backend", (("icon", "mdi:chip"), *diagnostic)))
    return out


def tracking_entities(p: str, tracking: TrackingView) -> list[Entity]:
    """A tracking pipeline's: objects tracked now; per zone its count (and per label of its filter),
    its last stay and mean stay (seconds), dwelling and overcrowded where configured; per line and
    direction (and label of its filter) its crossings since the agent started (total_increasing: Home
    Assistant reads the drop to 0 at a restart as a reset); per zone and line and attribute the value
    read on the object that last entered or crossed it; its latest snapshot where snapshots are on."""
    measurement = (("state_class", "measurement"),)
    stay = (
        ("device_class", "duration"),
        ("unit_of_measurement", "s"),
        *measurement,
        ("suggested_display_precision", 1),
    )
    out = [Entity(("tracks",), "sensor", f"{p} tracks", (*measurement, ("icon", "mdi:crosshairs-gps")))]
    for zone in tracking.zones:
        z = zone.name
        icon = (("icon", "mdi:vector-polygon"),)
        out.append(Entity(("zone", z, "count"), "sensor", f"{p} zone {z} count", (*measurement, *icon)))
        for label in zone.labels:
            of_label = ("zone", z, "count", label)
            out.append(Entity(of_label, "sensor", f"{p} zone {z} {label} count", (*measurement, *icon)))
        out.append(Entity(("zone", z, "stayed_s"), "sensor", f"{p} zone {z} last stay", stay))
        out.append(Entity(("zone", z, "mean_stayed_s"), "sensor", f"{p} zone {z} mean stay", stay))
        if zone.dwell:
            dwell = (("device_class", "occupancy"),)
            out.append(Entity(("zone", z, "dwelling"), "binary_sensor", f"{p} zone {z} dwelling", dwell))
        if zone.crowd:
            crowd = (("device_class", "problem"),)
            out.append(
                Entity(("zone", z, "overcrowded"), "binary_sensor", f"{p} zone {z} overcrowded", crowd)
            )
        out += _last_values(p, "zone", z, zone.attributes)
    for line in tracking.lines:
        total = (("state_class", "total_increasing"), ("icon", "mdi:counter"))
        for direction in line.directions:
            key = ("line", line.name, direction)
            out.append(Entity(key, "sensor", f"{p} line {line.name} {direction}", total))
            for label in line.labels:
                name = f"{p} line {line.name} {direction} {label}"
                out.append(Entity((*key, label), "sensor", name, total))
        out += _last_values(p, "line", line.name, line.attributes)
    if tracking.snapshots:
        out.append(Entity(("snapshot",), "image", f"{p} snapshot", (("content_type", "image/jpeg"),)))
    if tracking.clips:
        out.append(Entity(("clip",), "sensor", f"{p} last clip", (("icon", "mdi:filmstrip"),)))
    if tracking.clip_urls:
        out.append(Entity(("clip_url",), "sensor", f"{p} last clip path", (("icon", "mdi:link-variant"),)))
    return out


def _last_values(p: str, kind: str, name: str, attributes: Sequence[str]) -> list[Entity]:
    """A zone's or line's sensors of the last value read (e.g. the last plate through the gate)."""
    icon = (("icon", "mdi:text-recognition"),)
    return [
        Entity((kind, name, "last", attribute), "sensor", f"{p} {kind} {name} last {attribute}", icon)
        for attribute in attributes
    ]


def label_level_ok(label: str) -> bool:
    """Whether `label` can be a topic level (state/<pipeline>/snapshot/<label>, .../count/<label>)."""
    return bool(label) and not any(c in label for c in TOPIC_SPECIALS)


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


def health_values(pipeline: PipelineStatus | None) -> dict[tuple[str, ...], bytes]:
    """A pipeline's frame rate (1 decimal) and serving backend from its status (agent/status.py);
    what it does not know yet (nothing runs, no frame yet) is left out."""
    values: dict[tuple[str, ...], bytes] = {}
    run = None if pipeline is None else pipeline.run
    if run is None:
        return values
    if run.counts.fps is not None:
        values[("fps",)] = f"{float(run.counts.fps):.1f}".encode()
    if run.stage.serving.backend:
        values[("backend",)] = run.stage.serving.backend.encode()
    return values


def _count(value: Any) -> bytes:
    return str(int(value or 0)).encode()


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
        # A tracking pipeline's zone -> its last stays (exits' stayed_s), for the mean stay.
        self.stays: dict[str, deque[float]] = {}
        # (line, direction) -> the scene's crossings that way when last told (a `cross` event's `count`,
        # the summary's): the per-label counts start again with the scene's (a pipeline restart).
        self.crossed: dict[tuple[str, str], int] = {}
        # ("zone" | "line", name) -> the object that last entered or crossed it: a reading that comes
        # later is its value too (read after it passed), one of an object before it is not.
        self.last_through: dict[tuple[str, str], object] = {}  # (a track id)

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

    def take_scene(self, summary: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> None:
        """A tracking pipeline's counts after a frame (agent/processing/scene.py Scene.summary) and that
        frame's `events` (the stays and per-label crossings come from its `exit` and `cross` events);
        zones and lines the view does not have (yet, or any more) are left out."""
        tracking = self.view.tracking
        if tracking is None:
            return
        self._take_events(tracking, events)
        values = self.values
        if summary.get("tracks") is not None:
            values[("tracks",)] = _count(summary["tracks"])
        zones = summary.get("zones") or {}
        for zone in tracking.zones:
            got = zones.get(zone.name)
            if not isinstance(got, Mapping):
                continue
            values[("zone", zone.name, "count")] = _count(got.get("count"))
            per_label = got.get("labels")
            per_label = per_label if isinstance(per_label, Mapping) else {}
            for label in zone.labels:
                values[("zone", zone.name, "count", label)] = _count(per_label.get(label))
            if zone.dwell:
                values[("zone", zone.name, "dwelling")] = ON if got.get("dwelling") else OFF
            if zone.crowd:
                values[("zone", zone.name, "overcrowded")] = ON if got.get("overcrowded") else OFF
        lines = summary.get("lines") or {}
        for line in tracking.lines:
            counts = lines.get(line.name)
            if not isinstance(counts, Mapping):
                continue
            for direction in line.directions:
                if counts.get(direction) is not None:
                    values[("line", line.name, direction)] = _count(counts[direction])
                    if int(counts[direction]) < self.crossed.get((line.name, direction), 0):
                        self._crossings_again(line, direction, int(counts[direction]))

    def _take_events(self, tracking: TrackingView, events: Sequence[Mapping[str, Any]]) -> None:
        zones = {zone.name for zone in tracking.zones}
        lines = {line.name: line for line in tracking.lines}
        for event in events:
            kind = event.get("type")
            self._take_attributes(tracking, event)
            clip = event.get("clip")
            if tracking.clips and isinstance(clip, str):  # (an id: agent/clips.py, safe in a path)
                self.values[("clip",)] = clip.encode()
                if tracking.clip_urls:  # the web page's (agent/web/events.py)
                    self.values[("clip_url",)] = f"/clips/{self.view.name}/{clip}".encode()
            if kind == "exit" and event.get("zone") in zones and event.get("stayed_s") is not None:
                name = str(event["zone"])
                stays = self.stays.setdefault(name, deque(maxlen=STAYS_KEPT))
                stays.append(float(event["stayed_s"]))
                self.values[("zone", name, "stayed_s")] = f"{stays[-1]:.1f}".encode()
                self.values[("zone", name, "mean_stayed_s")] = f"{sum(stays) / len(stays):.1f}".encode()
            elif kind == "cross" and event.get("line") in lines:
                line, direction = lines[str(event["line"])], str(event.get("direction"))
                if direction not in line.directions:
                    continue
                count = int(event.get("count") or 0)
                if count <= self.crossed.get((line.name, direction), 0):  # the scene counts afresh
                    self._crossings_again(line, direction, 0)
                self.crossed[(line.name, direction)] = count
                label = (event.get("object") or {}).get("label")
                if label in line.labels:
                    key = ("line", line.name, direction, str(label))
                    self.values[key] = str(int(self.values.get(key, b"0")) + 1).encode()

    def _take_attributes(self, tracking: TrackingView, event: Mapping[str, Any]) -> None:
        """The last value read through each zone and line: what the object carries as it enters a zone or
        crosses a line, and what is read on it later while it is still the last one through."""
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            return
        kind, track_id = event.get("type"), obj.get("id")
        if kind in ("enter", "cross"):
            place = ("zone", str(event.get("zone"))) if kind == "enter" else ("line", str(event.get("line")))
            self.last_through[place] = track_id
            places = [place]
        elif kind == "update" and "attributes" in (event.get("changed") or ()):
            places = [place for place, last in self.last_through.items() if last == track_id]
        else:
            return
        shown = {("zone", zone.name): zone.attributes for zone in tracking.zones}
        shown.update({("line", line.name): line.attributes for line in tracking.lines})
        read = obj.get("attributes")
        read = read if isinstance(read, Mapping) else {}
        for where, name in places:
            for attribute in shown.get((where, name), ()):
                value = read.get(attribute)
                if isinstance(value, Mapping) and "value" in value:
                    text = attribute_text(value["value"])[:MAX_STATE_CHARS]
                    self.values[(where, name, "last", attribute)] = text.encode()

    def _crossings_again(self, line: LineView, direction: str, count: int) -> None:
        """The scene's crossings of `line` that way started again (a pipeline restart): its per-label
        counts too."""
        self.crossed[(line.name, direction)] = count
        for label in line.labels:
            self.values[("line", line.name, direction, label)] = b"0"

    def seed(self) -> None:
        """Give a tracking pipeline's values that have none yet what a scene starts with: no objects,
        zones empty, nobody dwelling, not overcrowded, no crossings (called once its pipeline runs)."""
        tracking = self.view.tracking
        if tracking is None:
            return
        self.values.setdefault(("tracks",), b"0")
        for zone in tracking.zones:
            self.values.setdefault(("zone", zone.name, "count"), b"0")
            for label in zone.labels:
                self.values.setdefault(("zone", zone.name, "count", label), b"0")
            if zone.dwell:
                self.values.setdefault(("zone", zone.name, "dwelling"), OFF)
            if zone.crowd:
                self.values.setdefault(("zone", zone.name, "overcrowded"), OFF)
        for line in tracking.lines:
            for direction in line.directions:
                self.values.setdefault(("line", line.name, direction), b"0")
                for label in line.labels:
                    self.values.setdefault(("line", line.name, direction, label), b"0")

    def take_motion(self, moving: bool) -> None:
        """The motion gate's verdict on the pipeline's latest frame (its `PipelineMotion.moving`)."""
        if self.view.motion:
            self.values[("motion",)] = ON if moving else OFF

    def take_snapshot(self, label: str, jpeg: bytes) -> list[tuple[str, ...]]:
        """A new snapshot of a `label` object: the pipeline's latest and, when `label` can be a topic
        level, the label's latest; returns the keys it set (none when snapshots are off)."""
        if self.view.tracking is None or not self.view.tracking.snapshots:
            return []
        keys: list[tuple[str, ...]] = [("snapshot",)]
        if label_level_ok(label):
            keys.append(("snapshot", label))
        for key in keys:
            self.values[key] = jpeg
        return keys

    def carry(self, old: PipelineState) -> None:
        """After a config change, keep what `old` (this pipeline's state under its previous view) knew of
        the scene, which the pipeline keeps: the tracks, zones by name (a changed zone keeps who is in
        it, and its stays), lines by name (a moved line keeps its counts) and the snapshots while they
        stay on; only the values the new view still has."""
        new, before = self.view.tracking, old.view.tracking
        if new is None or before is None:
            return
        kept = {entity.key for entity in tracking_entities(self.view.name, new)}
        for key, value in old.values.items():
            if key in kept or (key[0] == "snapshot" and new.snapshots):  # (snapshot/<label>: no entity)
                self.values.setdefault(key, value)
        zones = {zone.name for zone in new.zones}
        self.stays.update({name: stays for name, stays in old.stays.items() if name in zones})
        lines = {(line.name, d) for line in new.lines for d in line.directions}
        self.crossed.update({key: count for key, count in old.crossed.items() if key in lines})
        self.last_through.update(old.last_through)

    def expire(self, now: float) -> None:
        """Turn OFF what has been missing for off_delay_s (called every tick)."""
        for watched in self.view.watch:
            on = self.values.get(("seen", watched)) == ON
            if on and watched not in self.present and self._off_due(watched, now):
                self.values[("seen", watched)] = OFF

    def _off_due(self, label: str, now: float) -> bool:
        seen = self.last_seen.get(label)
        return seen is None or now - seen >= self.view.off_delay_s
