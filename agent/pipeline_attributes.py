"""A pipeline's attribute readings across its stages: which object was read when, on how good a
picture, and the answers the reader thread delivered that the next frame puts on the objects.

It belongs to the pipeline, not to a stage (as the scene does): a new stage (a changed zone, a new
version) keeps every object's readings, so no object is read again only because the config changed.

When an object is read (each attribute's `when`): once it is tracked and its box is whole (clear of the
frame's edge, when `crop.whole_only`) and large enough; again when its picture is `again_when_better`
times better than at the last reading (score x sqrt(area), as snapshots judge it), when its area changed
by `size_factor`, or every `interval_s`. An object is never read twice at once (one reading pending);
one the model failed on is read again RETRY_AFTER_FAILURE_S later.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.attribute_models import Reading
from agent.config import AttributeConfig
from agent.processing.scene import cut_by_edge, label_of, picture_quality

RETRY_AFTER_FAILURE_S = 1.0  # an object the model failed on is read again after this (not every frame)


@dataclass
class _Read:
    """One object's readings by one attribute."""

    pending: bool = False
    times: int = 0  # readings asked for
    at: float = 0.0  # capture time of the frame last read
    quality: float = 0.0  # its picture's quality then
    area: float = 0.0
    retry_at: float | None = None  # the model failed on it: read again from this capture time


@dataclass
class AttributeCounts:
    """What the pipeline's attributes did, for status."""

    asked: int = 0  # crops handed to the reader
    answered: int = 0  # answers put on objects
    unsure: int = 0  # answers below min_score, not put on objects
    failed: int = 0  # crops the model failed on
    late: int = 0  # answers whose track had ended
    busy: int = 0  # crops the reader's full queue refused (tried again later)
    tracks: int = 0  # tracks read at least once

    def to_dict(self) -> dict[str, Any]:
        reads_per_track = round(self.asked / self.tracks, 3) if self.tracks else None
        return {
            "asked": self.asked,
            "answered": self.answered,
            "unsure": self.unsure,
            "failed": self.failed,
            "late": self.late,
            "busy": self.busy,
            "tracks": self.tracks,
            "reads_per_track": reads_per_track,
        }


class PipelineAttributes:
    """One pipeline's readings (the module's docstring). The report thread plans and applies; the
    reader thread delivers."""

    def __init__(self) -> None:
        self._reads: dict[tuple[int, str], _Read] = {}
        self._inbox: list[Reading] = []
        self._lock = threading.Lock()
        self._delivered = threading.Condition(self._lock)  # an offline run waits on it (`wait_for_answers`)
        self.counts: dict[str, AttributeCounts] = {}

    def due(
        self,
        attribute: AttributeConfig,
        entry: dict[str, Any],
        now: float,
        width: int,
        height: int,
    ) -> bool:
        """Whether tracked `entry` (a box with its track_id) should be read by `attribute` in this frame
        (width x height), by its `labels`, `crop` and `when`."""
        track_id = entry.get("track_id")
        if track_id is None:
            return False
        if attribute.labels and label_of(entry) not in attribute.labels:
            return False
        x1, y1, x2, y2 = (float(v) for v in entry["box"])
        crop = attribute.crop
        if x2 - x1 < crop.min_width or y2 - y1 < crop.min_height:
            return False
        area, cut, quality = _picture(entry, width, height)
        if cut and crop.whole_only:
            return False
        read = self._reads.get((track_id, attribute.name))
        if read is None:
            return True
        if read.pending:
            return False
        if read.retry_at is not None:
            return now >= read.retry_at
        when = attribute.when
        if when.interval_s is not None and now - read.at >= when.interval_s:
            return True
        if when.size_factor is not None and read.area > 0:
            change = area / read.area
            if change >= when.size_factor or change <= 1 / when.size_factor:
                return True
        if when.again_when_better is not None:
            return quality > read.quality * when.again_when_better
        return False

    def asked(self, attribute: str, entry: dict[str, Any], now: float, width: int, height: int) -> None:
        """`entry` was handed to the reader for `attribute`."""
        track_id = int(entry["track_id"])
        read = self._reads.setdefault((track_id, attribute), _Read())
        read.area, _cut, read.quality = _picture(entry, width, height)
        read.pending, read.at = True, now
        read.times += 1
        counts = self.counts.setdefault(attribute, AttributeCounts())
        counts.asked += 1
        counts.tracks += read.times == 1

    def refused(self, attribute: str, track_id: int) -> None:
        """The reader's queue was full: the object is tried again at a later frame."""
        read = self._reads.get((track_id, attribute))
        if read is not None:
            read.pending, read.times, read.quality = False, read.times - 1, 0.0
        counts = self.counts.setdefault(attribute, AttributeCounts())
        if read is not None and read.times == 0:
            del self._reads[track_id, attribute]
            counts.tracks -= 1
        counts.asked -= 1
        counts.busy += 1

    def deliver(self, readings: list[Reading]) -> None:
        """The reader's answers (its thread): the next frame puts them on the objects."""
        with self._lock:
            self._inbox.extend(readings)
            self._delivered.notify_all()

    def take(self) -> list[Reading]:
        """The answers delivered since the last call; their objects may be read again from now on."""
        with self._lock:
            readings, self._inbox = self._inbox, []
        for reading in readings:
            read = self._reads.get((reading.track_id, reading.name))
            if read is not None:
                read.pending = False
                read.retry_at = None if reading.error is None else reading.captured_at + RETRY_AFTER_FAILURE_S
        return readings

    def pending(self) -> int:
        """Readings asked for whose answers were not taken yet."""
        return sum(read.pending for read in self._reads.values())

    def wait_for_answers(self, timeout: float) -> bool:
        """Wait at most `timeout` s for answers not taken yet; whether there are some. An offline run
        (`infer --track`) waits so at the clip's end: its last events carry every answer asked for."""
        with self._delivered:
            return self._delivered.wait_for(lambda: bool(self._inbox), timeout)

    def forget(self, alive: Iterable[int]) -> None:
        """Let go of the readings of tracks that ended (only those in `alive` are kept)."""
        keep = set(alive)
        for key in [key for key in self._reads if key[0] not in keep]:
            del self._reads[key]

    def status(self) -> dict[str, dict[str, Any]]:
        return {name: counts.to_dict() for name, counts in self.counts.items()}


def _picture(entry: dict[str, Any], width: int, height: int) -> tuple[float, bool, float]:
    """A tracked box's area, whether the frame's edge cuts it, and its picture quality (the score
    by the area, less when cut): what `due` compares and `asked` remembers."""
    x1, y1, x2, y2 = (float(v) for v in entry["box"])
    area = (x2 - x1) * (y2 - y1)
    cut = cut_by_edge((x1, y1, x2, y2), width, height)
    return area, cut, picture_quality(float(entry.get("score", 1.0)), area, cut)
