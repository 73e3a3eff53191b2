"""What a pipeline's tracked objects do in its zones and across its lines, as events (docs/analytics.md,
docs/results.md "Events"). Pure logic, no I/O: the pipeline feeds it each frame's boxes and hands
the events it makes to the result sink, which writes them to the outbox.

One `Scene` per pipeline, kept across stage swaps: a changed zone or line (`use`) keeps every track,
and a changed zone keeps who is in it (see `use`).
Per frame (`step`):
- the tracker (agent/processing/tracking.py) gives each box a track id, written into the box's
  entry as `track_id` (null while the track is tentative);
- a track's first confirmed frame makes a `new` event, its end an `end` event (with a reason);
- zones: an object enters once it has been inside `min_frames` frames in a row and `min_seconds`;
  it leaves once it has been outside `min_frames` frames in a row (the same inertia both ways, so a
  box flickering on the edge neither enters nor leaves). A lost object (not seen this frame, its
  track not ended yet) stays where it was. Entering and leaving make `enter`/`exit` events and an
  `update` of the object; staying longer than `dwell_s` a `dwell` event (once per stay); more than
  `max_objects` inside an `overcrowded` event when it starts and when it ends;
- lines: each object's anchor point's path from its last position off the line to now; a crossing
  makes a `cross` event and an `update` of the object;
- snapshots: the best picture of each object so far (score, size, not cut by the frame's edge) is
  wanted when it is clearly better than the last one taken (`snapshots_wanted`); the pipeline takes
  it and says so (`snapshot_taken`), which makes an `update`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.clock import iso_utc
from agent.config import LineConfig, TrackConfig, ZoneConfig
from agent.processing.tracking import Tracker
from agent.processing.zones import LineGroup, LineShape, ZoneGroup, ZoneShape, frame_problems

Event = dict[str, Any]

NO_LABEL = "object"  # the label of boxes that have none (regions, detections without labels)
MAX_CROSSINGS_KEPT = 20  # an object's event lists its last crossings (and counts them all)
_EDGE_PX = 2.0  # a box this close to the frame's edge is cut by it
_SNAPSHOT_GAIN = 1.1  # a new snapshot needs a picture this much better than the last one
_SNAPSHOTS_PER_FRAME = 2  # JPEG encodes per frame at most: 50 new objects do not stall the pipeline


@dataclass
class TrackedObject:
    """One confirmed track and what it did."""

    id: int
    label: str
    first_seen: float
    last_seen: float
    score: float
    box: list[float]
    best_score: float = 0.0
    zones: dict[str, float] = field(default_factory=dict)  # current zones: entered at
    entered_zones: list[str] = field(default_factory=list)  # every zone it entered, in order
    crossings: list[dict[str, Any]] = field(default_factory=list)  # the last MAX_CROSSINGS_KEPT
    crossings_total: int = 0
    snapshot: str | None = None
    snapshot_quality: float = 0.0
    snapshot_at: float = -math.inf
    # What second models read on it (agent/steps/attributes.py): name -> {value, score, at, runs}.
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def brief(self) -> dict[str, Any]:
        """The object as zone and line events name it: its id and label (and attributes, once read)."""
        brief: dict[str, Any] = {"id": self.id, "label": self.label}
        if self.attributes:
            brief["attributes"] = {name: dict(value) for name, value in self.attributes.items()}
        return brief

    def describe(self) -> dict[str, Any]:
        """The object as its events carry it."""
        return {
            "id": self.id,
            "label": self.label,
            "first_seen": iso_utc(self.first_seen),
            "last_seen": iso_utc(self.last_seen),
            "score": round(self.score, 4),
            "best_score": round(self.best_score, 4),
            "box": [round(v, 1) for v in self.box],
            "zones": sorted(self.zones),
            "entered_zones": list(self.entered_zones),
            "dwell_s": {name: round(self.last_seen - since, 3) for name, since in sorted(self.zones.items())},
            "crossings": list(self.crossings),
            "crossings_total": self.crossings_total,
            "snapshot": self.snapshot,
            "attributes": {name: dict(value) for name, value in self.attributes.items()},
        }


@dataclass
class _Zone:
    """A zone's shape and who is in it."""

    config: ZoneConfig
    shape: ZoneShape
    members: set[int] = field(default_factory=set)  # entered and not left
    pending: dict[int, tuple[int, float]] = field(default_factory=dict)  # inside, not entered: frames, since
    leaving: dict[int, int] = field(default_factory=dict)  # entered, outside this many frames in a row
    dwelt: set[int] = field(default_factory=set)  # entered ones whose dwell event was sent
    overcrowded: bool = False


@dataclass
class _Line:
    config: LineConfig
    shape: LineShape
    counts: dict[str, int] = field(default_factory=dict)  # crossings per direction name


@dataclass(frozen=True)
class SnapshotWanted:
    """A picture the pipeline should take now: object `track_id` at `box` in this frame."""

    track_id: int
    label: str
    box: list[float]
    quality: float
    replaces: str | None = None  # the object's snapshot so far: an object keeps only its best
    # What second models had read on it by then (name -> {value, score, at, runs}): its caption.
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)


class Scene:
    """One pipeline's tracks, zones and lines (the module's docstring)."""

    def __init__(
        self,
        track: TrackConfig,
        zones: list[ZoneConfig],
        lines: list[LineConfig],
        next_id: int = 1,
        line_counts: dict[str, dict[str, int]] | None = None,
    ):
        """`line_counts`: crossings per line and direction to count on from (kept by whoever outlives
        this scene: the daemon's, so a rebuilt pipeline's counts go on); the scene adds to it."""
        self.tracker = Tracker(track, next_id)
        self.track = track
        self.objects: dict[int, TrackedObject] = {}
        self._zone_configs, self._line_configs = zones, lines
        self._line_counts = line_counts if line_counts is not None else {}
        self._zones: list[_Zone] = []
        self._lines: list[_Line] = []
        self._zone_group = ZoneGroup([])
        self._line_group = LineGroup([])
        # Each object's last anchor off each line (L, 2), NaN where none yet: where a crossing starts.
        self._line_last: dict[int, npt.NDArray[np.float64]] = {}
        self._size: tuple[int, int] | None = None  # the frame size the shapes are in
        self._label_codes: dict[str, int] = {}
        self._events: list[Event] = []
        self._updated: dict[int, set[str]] = {}  # objects changed this frame: what changed
        self._wanted: list[SnapshotWanted] = []
        self.problems: list[str] = []  # pixel points outside the frame, found at the first frame (the log)
        self._new: set[int] = set()  # confirmed since the last take_events: their `new` says it all
        self._removed: list[_Zone] = []  # zones removed while objects were in them: exits at the next frame
        self.started = 0  # tracks confirmed
        self.ended = 0

    # --- configuration ---------------------------------------------------------------------------

    def use(self, track: TrackConfig, zones: list[ZoneConfig], lines: list[LineConfig]) -> None:
        """A changed pipeline's tracking, zones and lines, keeping every track. A zone keeps who is in
        it (with their entry times, dwell and crowding) when its config changes: an edge moved while a
        person waits must not make them leave and enter again. From the next frame each object is
        placed by the new shape and rules with the zone's usual inertia (`min_frames`), so one inside
        both the old and the new shape stays in, and only those the change puts out or in get an
        `exit` or `enter`. A removed zone lets its objects out on the next frame (`exit`, reason "zone
        removed"), so whoever counts enters and exits stays right, then is forgotten. A line keeps its
        counts; a moved one starts its objects' paths afresh."""
        self.tracker.config = self.track = track
        self._zone_configs, self._line_configs = zones, lines
        if self._size is not None:
            self._shape(*self._size)

    def _shape(self, width: int, height: int) -> None:
        same_size = self._size == (width, height)
        old_zones = {z.config.name: z for z in self._zones}
        old_lines = {line.config.name: (i, line) for i, line in enumerate(self._lines)}
        kept_names = {config.name for config in self._zone_configs}
        self._removed += [z for name, z in old_zones.items() if name not in kept_names and z.members]
        self._zones = []
        for config in self._zone_configs:
            kept = old_zones.get(config.name)
            if kept is None:
                kept = _Zone(config, ZoneShape.from_config(config, width, height))
            elif kept.config != config or not same_size:
                # Who is in (or on the way in or out) stays: the next frames judge them by the new shape.
                kept = replace(kept, config=config, shape=ZoneShape.from_config(config, width, height))
                if config.dwell_s is None:
                    kept.dwelt.clear()  # nobody dwells in a zone without dwell_s
            self._zones.append(kept)
        self._lines, moved_from = [], []
        for line_config in self._line_configs:
            index, old = old_lines.get(line_config.name, (-1, None))
            unchanged = old is not None and old.config == line_config and same_size
            shape = (
                old.shape
                if old is not None and unchanged
                else LineShape.from_config(line_config, width, height)
            )
            # A moved line keeps its counts; a new one counts on from a rebuilt pipeline's.
            counts = old.counts if old is not None else self._line_counts.setdefault(line_config.name, {})
            self._lines.append(_Line(line_config, shape, counts))
            moved_from.append(index if unchanged else -1)
        # Where each object last was off each line: kept for unchanged lines, afresh for the others.
        for track_id, last in self._line_last.items():
            fresh = np.full((len(self._lines), 2), np.nan)
            for new_index, old_index in enumerate(moved_from):
                if old_index >= 0:
                    fresh[new_index] = last[old_index]
            self._line_last[track_id] = fresh
        self._zone_group = ZoneGroup([z.shape for z in self._zones])
        self._line_group = LineGroup([line.shape for line in self._lines])
        names = {z.config.name: z for z in (*self._removed, *self._zones)}
        for obj in self.objects.values():
            for name in list(obj.zones):
                zone = names.get(name)
                if zone is None or obj.id not in zone.members:  # removed
                    del obj.zones[name]
        for name_codes in (z.shape.labels for z in self._zones):
            for label in name_codes or ():
                self._label_codes.setdefault(label, len(self._label_codes))
        for line_shape in self._line_group.lines:
            for label in line_shape.labels or ():
                self._label_codes.setdefault(label, len(self._label_codes))
        self.problems = frame_problems(self._zone_configs, self._line_configs, width, height)
        self._size = (width, height)

    # --- one frame -------------------------------------------------------------------------------

    def step(self, boxes: list[dict[str, Any]], now: float, width: int, height: int) -> None:
        """One frame's boxes (the postprocessor's entries: box, score, label or index) at capture time
        `now`; sets each entry's `track_id` and queues the frame's events (`take_events`)."""
        if self._size != (width, height):
            self._shape(width, height)
        self._let_out_of_removed_zones(now)
        count = len(boxes)
        coords = np.array([b["box"] for b in boxes], dtype=np.float64).reshape(count, 4)
        scores = np.array([float(b.get("score", 1.0)) for b in boxes], dtype=np.float64)
        labels = [label_of(b) for b in boxes]
        codes = np.array([self._label_codes.setdefault(name, len(self._label_codes)) for name in labels])
        result = self.tracker.update(coords, scores, codes.reshape(count), now)
        ids = [int(i) for i in result.ids]
        for entry, track_id in zip(boxes, ids, strict=True):
            entry["track_id"] = track_id if track_id >= 0 else None

        seen = [(i, track_id) for i, track_id in enumerate(ids) if track_id >= 0]
        for i, track_id in seen:
            obj = self.objects.get(track_id)
            if obj is None:
                obj = self.objects[track_id] = TrackedObject(
                    track_id, labels[i], now, now, scores[i], boxes[i]["box"]
                )
                self.started += 1
                self._new.add(track_id)
                self._emit("new", now, object=obj)  # described at the frame's end (`take_events`)
            obj.last_seen, obj.score, obj.box, obj.label = (
                now,
                float(scores[i]),
                list(boxes[i]["box"]),
                labels[i],
            )
            obj.best_score = max(obj.best_score, obj.score)
        if seen:
            rows = np.array([i for i, _ in seen])
            seen_ids = [track_id for _, track_id in seen]
            if self._zones:
                self._zone_step(coords[rows], seen_ids, codes[rows], now)
            if self._lines:
                self._line_step(coords[rows], seen_ids, codes[rows], now)
            if self.track.snapshots.enabled:
                self._want_snapshots(coords[rows], seen_ids, width, height, now)
        for zone in self._zones:
            self._dwell_and_crowding(zone, now)
        for track_id in result.ended:
            self._end(track_id, "lost", now)

    def _let_out_of_removed_zones(self, now: float) -> None:
        removed, self._removed = self._removed, []
        for zone in removed:
            for track_id in sorted(zone.members):
                obj = self.objects.get(track_id)
                if obj is not None and zone.config.name in obj.zones:
                    self._leave(zone, obj, now, "zone removed")

    def end_all(self, reason: str, now: float) -> None:
        """End every open track (the pipeline stops, tracking is turned off), saying why."""
        self._let_out_of_removed_zones(now)
        self.tracker.end_all()
        for track_id in list(self.objects):
            self._end(track_id, reason, now)

    def take_events(self) -> list[Event]:
        """The events made since the last call, in order (each object's `update` once per frame, after
        the zone and line events that caused it)."""
        for track_id, changed in self._updated.items():
            obj = self.objects.get(track_id)
            if obj is not None and track_id not in self._new:
                self._events.append(
                    {
                        "type": "update",
                        "at": iso_utc(obj.last_seen),
                        "changed": sorted(changed),
                        "object": obj,
                    }
                )
        self._updated.clear()
        self._new.clear()
        events = []
        for event in self._events:
            obj = event.get("object")
            events.append({**event, "object": obj.describe()} if isinstance(obj, TrackedObject) else event)
        self._events = []
        return events

    def snapshots_wanted(self) -> list[SnapshotWanted]:
        """Pictures to take from this frame (at most _SNAPSHOTS_PER_FRAME; the best gains first)."""
        wanted, self._wanted = self._wanted, []
        return wanted

    def snapshot_taken(self, track_id: int, snapshot_id: str, quality: float, now: float) -> None:
        obj = self.objects.get(track_id)
        if obj is None:
            return
        obj.snapshot, obj.snapshot_quality, obj.snapshot_at = snapshot_id, quality, now
        self._updated.setdefault(track_id, set()).add("snapshot")

    def set_attribute(self, track_id: int, name: str, value: dict[str, Any]) -> bool:
        """A second model's answer on an object (an `update` with changed ["attributes"] at the frame's
        end); False when the track has ended meanwhile (the answer came too late for it)."""
        obj = self.objects.get(track_id)
        if obj is None:
            return False
        obj.attributes[name] = value
        self._updated.setdefault(track_id, set()).add("attributes")
        return True

    # --- status ----------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Occupancy per zone (and per label), crossings per line and direction, open tracks. Before
        the first frame (no frame size yet: no shapes) the configured zones and lines show zeros."""
        if self._size is None:
            empty = {"count": 0, "labels": {}, "dwelling": 0, "overcrowded": False}
            return {
                "tracks": 0,
                "started": self.started,
                "ended": self.ended,
                "zones": {zone.name: dict(empty) for zone in self._zone_configs},
                "lines": {line.name: {line.in_: 0, line.out: 0} for line in self._line_configs},
            }
        zones = {}
        for zone in self._zones:
            inside = [self.objects[i] for i in self._inside(zone)]
            per_label: dict[str, int] = {}
            for obj in inside:
                per_label[obj.label] = per_label.get(obj.label, 0) + 1
            zones[zone.config.name] = {
                "count": len(inside),
                "labels": dict(sorted(per_label.items())),
                "dwelling": len(zone.dwelt),
                "overcrowded": zone.overcrowded,
            }
        lines = {
            line.config.name: {d: line.counts.get(d, 0) for d in (line.config.in_, line.config.out)}
            for line in self._lines
        }
        return {
            "tracks": len(self.objects),
            "started": self.started,
            "ended": self.ended,
            "zones": zones,
            "lines": lines,
        }

    # --- internals -------------------------------------------------------------------------------

    def _emit(self, kind: str, now: float, **fields: Any) -> None:
        self._events.append({"type": kind, "at": iso_utc(now), **fields})

    def _changed(self, track_id: int, what: str) -> None:
        self._updated.setdefault(track_id, set()).add(what)

    def _inside(self, zone: _Zone) -> list[int]:
        return sorted(zone.members)

    def _allowed(
        self, shapes: Iterable[ZoneShape | LineShape], codes: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_] | bool:
        """(N, K): whether each object's label passes each zone's or line's label filter (True: no
        filters, every object passes)."""
        shapes = list(shapes)
        if all(shape.labels is None for shape in shapes):
            return True
        columns = []
        for shape in shapes:
            if shape.labels is None:
                columns.append(np.ones(len(codes), bool))
            else:
                columns.append(np.isin(codes, [self._label_codes[label] for label in shape.labels]))
        return np.stack(columns, axis=1) if columns else np.zeros((len(codes), 0), bool)

    def _matching(
        self, configs: Sequence[ZoneConfig | LineConfig], ids: list[int]
    ) -> npt.NDArray[np.bool_] | bool:
        """(N, K): whether each object's attributes match each zone's or line's `attributes:` condition
        (True: no conditions, every object passes)."""
        if not any(config.attributes for config in configs):
            return True
        matching = np.ones((len(ids), len(configs)), bool)
        for j, config in enumerate(configs):
            if config.attributes:
                for k, track_id in enumerate(ids):
                    matching[k, j] = attributes_match(config.attributes, self.objects[track_id].attributes)
        return matching

    def _zone_step(
        self, boxes: npt.NDArray[np.float64], ids: list[int], codes: npt.NDArray[np.int64], now: float
    ) -> None:
        inside_now = self._zone_group.contains(boxes)
        allowed = _both(
            self._allowed(self._zone_group.zones, codes), self._matching([z.config for z in self._zones], ids)
        )
        if allowed is not True:
            inside_now &= allowed
        row_of = {track_id: k for k, track_id in enumerate(ids)}
        for z, zone in enumerate(self._zones):
            config, name = zone.config, zone.config.name
            column = inside_now[:, z]
            # Only objects inside now or already in the zone's books can change anything.
            rows = set(np.flatnonzero(column).tolist())
            rows.update(row_of[i] for i in (*zone.members, *zone.pending) if i in row_of)
            for k in sorted(rows):
                track_id, inside = ids[k], bool(column[k])
                obj = self.objects[track_id]
                if track_id in zone.members:
                    if inside:
                        zone.leaving.pop(track_id, None)
                        continue
                    outside = zone.leaving.get(track_id, 0) + 1
                    passes = True if isinstance(allowed, bool) else bool(allowed[k, z])
                    if outside < config.min_frames and passes:  # (another label now: out at once)
                        zone.leaving[track_id] = outside
                        continue
                    self._leave(zone, obj, now, "left")
                elif inside:
                    frames, since = zone.pending.get(track_id, (0, now))
                    frames += 1
                    if frames >= config.min_frames and now - since >= config.min_seconds:
                        zone.pending.pop(track_id, None)
                        zone.members.add(track_id)
                        obj.zones[name] = now
                        if name not in obj.entered_zones:
                            obj.entered_zones.append(name)
                        self._emit("enter", now, zone=name, object=obj.brief())
                        self._changed(track_id, "zones")
                    else:
                        zone.pending[track_id] = (frames, since)
                else:
                    zone.pending.pop(track_id, None)

    def _leave(self, zone: _Zone, obj: TrackedObject, now: float, why: str) -> None:
        name = zone.config.name
        since = obj.zones.pop(name)
        zone.members.discard(obj.id)
        zone.leaving.pop(obj.id, None)
        zone.dwelt.discard(obj.id)
        stayed = round(now - since, 3)
        self._emit("exit", now, zone=name, object=obj.brief(), stayed_s=stayed, reason=why)
        self._changed(obj.id, "zones")

    def _dwell_and_crowding(self, zone: _Zone, now: float) -> None:
        config, name = zone.config, zone.config.name
        inside = self._inside(zone)
        if config.dwell_s is not None:
            for track_id in inside:
                obj = self.objects[track_id]
                if track_id not in zone.dwelt and now - obj.zones[name] >= config.dwell_s:
                    zone.dwelt.add(track_id)
                    stayed = round(now - obj.zones[name], 3)
                    self._emit("dwell", now, zone=name, object=obj.brief(), stayed_s=stayed)
        if config.max_objects is not None or zone.overcrowded:  # (max_objects removed: it ends)
            crowded = config.max_objects is not None and len(inside) > config.max_objects
            if crowded != zone.overcrowded:
                zone.overcrowded = crowded
                state = "start" if crowded else "end"
                self._emit(
                    "overcrowded",
                    now,
                    zone=name,
                    state=state,
                    count=len(inside),
                    max_objects=config.max_objects,
                )

    def _line_step(
        self, boxes: npt.NDArray[np.float64], ids: list[int], codes: npt.NDArray[np.int64], now: float
    ) -> None:
        group = self._line_group
        points = group.anchors(boxes)  # (N, L, 2)
        nowhere = np.full((len(self._lines), 2), np.nan)
        before = np.stack([self._line_last.get(track_id, nowhere) for track_id in ids])
        crossed, sides = group.crossings(before, points)
        allowed = _both(
            self._allowed(group.lines, codes), self._matching([x.config for x in self._lines], ids)
        )
        if allowed is not True:
            crossed *= allowed
        for k, j in zip(*np.nonzero(crossed), strict=True):
            line = self._lines[j]
            self._cross(line, self.objects[ids[k]], line.shape.direction(int(crossed[k, j])), now)
        off_line = (sides != 0)[..., None]
        last = np.where(off_line, points, before)
        for k, track_id in enumerate(ids):
            self._line_last[track_id] = last[k]

    def _cross(self, line: _Line, obj: TrackedObject, direction: str, now: float) -> None:
        name = line.config.name
        line.counts[direction] = line.counts.get(direction, 0) + 1
        obj.crossings = [*obj.crossings, {"line": name, "direction": direction, "at": iso_utc(now)}][
            -MAX_CROSSINGS_KEPT:
        ]
        obj.crossings_total += 1
        self._emit(
            "cross",
            now,
            line=name,
            direction=direction,
            object=obj.brief(),
            count=line.counts[direction],
        )
        self._changed(obj.id, "crossings")

    def _want_snapshots(
        self, boxes: npt.NDArray[np.float64], ids: list[int], width: int, height: int, now: float
    ) -> None:
        area = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
        cut = (
            (boxes[:, 0] <= _EDGE_PX)
            | (boxes[:, 1] <= _EDGE_PX)
            | (boxes[:, 2] >= width - _EDGE_PX)
            | (boxes[:, 3] >= height - _EDGE_PX)
        )
        interval = self.track.snapshots.interval_s
        candidates = []
        for k, track_id in enumerate(ids):
            obj = self.objects[track_id]
            quality = picture_quality(obj.score, float(area[k]), bool(cut[k]))
            if quality <= 0 or now - obj.snapshot_at < interval:
                continue
            if obj.snapshot is None or quality > obj.snapshot_quality * _SNAPSHOT_GAIN:
                gain = quality / obj.snapshot_quality if obj.snapshot_quality > 0 else math.inf
                candidates.append(
                    (
                        gain,
                        SnapshotWanted(
                            track_id,
                            obj.label,
                            [float(v) for v in boxes[k]],
                            quality,
                            obj.snapshot,
                            {name: dict(value) for name, value in obj.attributes.items()},
                        ),
                    )
                )
        candidates.sort(key=lambda c: -c[0])
        self._wanted = [wanted for _, wanted in candidates[:_SNAPSHOTS_PER_FRAME]]

    def _end(self, track_id: int, reason: str, now: float) -> None:
        obj = self.objects.get(track_id)
        if obj is None:
            return
        for zone in self._zones:
            if zone.config.name in obj.zones:
                self._leave(zone, obj, now, "track ended")
            zone.pending.pop(track_id, None)
            zone.leaving.pop(track_id, None)
        self._line_last.pop(track_id, None)
        self._updated.pop(track_id, None)
        # Its pending `update` would describe it after its end: the end carries all of it.
        self._events.append({"type": "end", "at": iso_utc(now), "reason": reason, "object": obj.describe()})
        del self.objects[track_id]
        self.ended += 1


def _both(a: npt.NDArray[np.bool_] | bool, b: npt.NDArray[np.bool_] | bool) -> npt.NDArray[np.bool_] | bool:
    """Two (N, K) filters together (True: no filter)."""
    if a is True:
        return b
    return a if b is True else np.logical_and(a, b)


def attribute_text(value: Any) -> str:
    """An attribute's value as conditions match it and the state topics show it: text as it is, any
    other value (a number, a plugin's mapping, an embedding) as JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def attributes_match(condition: Mapping[str, str], attributes: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether an object's `attributes` (name -> {value, ...}) meet a zone's or line's condition (name ->
    regular expression, searched in the value as text): every named attribute read and matching. (re
    caches the compiled patterns.)"""
    for name, pattern in condition.items():
        read = attributes.get(name)
        if read is None or re.search(pattern, attribute_text(read.get("value"))) is None:
            return False
    return True


def picture_quality(score: float, area: float, cut: bool) -> float:
    """How good a picture of an object a box is: its score times its size (the square root of its area
    in pixels), halved when the frame's edge cuts it. Snapshots keep the best; second models read
    again when a much better one comes (agent/pipeline_attributes.py)."""
    return score * math.sqrt(max(area, 0.0)) * (0.5 if cut else 1.0)


def cut_by_edge(box: Sequence[float], width: int, height: int) -> bool:
    """Whether the frame's edge cuts this box (x1, y1, x2, y2 in pixels): part of the object is outside."""
    x1, y1, x2, y2 = box
    return x1 <= _EDGE_PX or y1 <= _EDGE_PX or x2 >= width - _EDGE_PX or y2 >= height - _EDGE_PX


def boxes_of(output: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The entries a postprocessed output gives the scene: its detections or regions (None: this
    output has no boxes, e.g. a plugin's frame without any)."""
    entries = output.get("detections", output.get("regions"))
    return entries if isinstance(entries, list) else None


def label_of(entry: Mapping[str, Any]) -> str:
    label = entry.get("label")
    if label is not None:
        return str(label)
    index = entry.get("index")
    return str(index) if index is not None else NO_LABEL
