"""A pipeline's live view: its latest frame drawn (boxes, track ids, zones, lines, motion) as a JPEG,
made only while someone watches.

Each `Pipeline` owns one `LiveView` (`pipeline.live_view`), kept across stage swaps as it keeps its
tracking. The web server reaches it through the supervisor:

    pipeline = supervisor.pipeline(name)  # (agent/supervisor/__init__.py; EdgeAgentError: none)
    with pipeline.live_view.watch() as viewer:  # a viewer: frames are made while any is registered
        seq = 0
        while client_connected:
            shown = viewer.latest(after_seq=seq, timeout=5.0)  # blocks until a newer JPEG (or timeout)
            if shown is not None:
                seq, jpeg, captured_at = shown
                send(jpeg)
            elif pipeline.live_view.closed:  # the pipeline stopped, or was rebuilt (a new source):
                break  # look it up again (a rebuilt one has a new LiveView)

`watch(plain=True)` registers a viewer of the frame as the camera gave it, without the drawings (the
zone editor's background to draw on): the encoder makes that JPEG too, from the same copy of the
pixels, only while a plain viewer is registered (`LiveView.plain_viewers`); each kind of viewer gets
its own kind of picture, numbered by one sequence (a frame's plain and drawn pictures share a seq).
The web page serves both (agent/web/live.py: `/live/<pipeline>/frame.jpg?after=<seq>[&plain=1]`).

With nobody watching, the pipeline's live-view step (agent/steps/live.py) returns at once: no copy, no
drawing, no encoding. While watched, at most `max_fps` frames a second have their pixels copied and
handed, with what to draw on them, to a small encoder thread through a latest-only slot: a slow encode
drops older frames, the pipeline never waits. The encoder thread runs only while watched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from agent.processing.drawing import draw_motion_areas, draw_scene, encode_jpeg
from agent.processing.zones import LineShape, ZoneShape
from agent.threads import named_thread

log = logging.getLogger(__name__)

DEFAULT_MAX_FPS = 2.0
DEFAULT_QUALITY = 80
# The encoder thread, with nothing to do, looks again this often whether its viewers left.
_IDLE_CHECK_S = 0.5


@dataclass(frozen=True)
class LiveFrame:
    """A frame to draw and encode: its own copy of the pixels and of what goes on them."""

    pixels: np.ndarray  # BGR uint8, the encoder's own
    captured_at: float
    entries: list[dict[str, Any]]  # detections / regions, with track_id where tracked
    zones: Sequence[ZoneShape] = ()
    lines: Sequence[LineShape] = ()
    occupancy: Mapping[str, Mapping[str, Any]] | None = None  # Scene.summary()["zones"]
    limits: Mapping[str, int | None] | None = None  # each zone's max_objects
    counts: Mapping[str, Mapping[str, int]] | None = None  # Scene.summary()["lines"]
    motion_areas: list[tuple[int, int, int, int]] = field(default_factory=list)


class Viewer:
    """One registered viewer (`LiveView.watch`): a context manager; leaving it unregisters."""

    def __init__(self, view: LiveView, plain: bool = False) -> None:
        self._view = view
        self.plain = plain  # this viewer's pictures are the frames without the drawings
        self._open = True

    def latest(self, after_seq: int = 0, timeout: float = 5.0) -> tuple[int, bytes, float] | None:
        """The newest JPEG once one newer than `after_seq` exists: (seq, jpeg, captured_at: the frame's
        wall-clock capture time, epoch seconds); None after `timeout` s without one, or at once when
        the view is closed (`LiveView.closed`)."""
        return self._view.latest(after_seq, timeout, self.plain)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._view._leave(self.plain)

    def __enter__(self) -> Viewer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LiveView:
    """One pipeline's live view (the module's docstring)."""

    def __init__(self, name: str, max_fps: float = DEFAULT_MAX_FPS, quality: int = DEFAULT_QUALITY) -> None:
        if not max_fps > 0:
            raise ValueError(f"live view max_fps {max_fps} must be above 0")
        self.name = name
        self.max_fps = max_fps
        self.quality = quality
        self._changed = threading.Condition()
        self._viewers = 0  # every viewer, plain ones included
        self._plain_viewers = 0
        self._pending: LiveFrame | None = None  # latest-only: a newer frame replaces it
        self._seq = 0
        self._jpeg: tuple[int, bytes, float] | None = None
        self._plain: tuple[int, bytes, float] | None = None  # the same frame without the drawings
        self._thread: threading.Thread | None = None
        self._last_taken: float | None = None  # monotonic time the step last took a frame
        self.taken = 0  # frames the step copied for the encoder
        self.encodes = 0  # frames encoded (a plain and a drawn JPEG of one frame: one)
        self.dropped = 0  # frames replaced in the slot (or left there by the last viewer) unencoded
        self.failures = 0
        self.closed = False  # the pipeline stopped: nothing newer will come

    @property
    def watched(self) -> bool:
        """Anyone watching (read without the lock: the step asks on every frame)."""
        return self._viewers > 0

    def due(self, now: float | None = None) -> bool:
        """Whether the step should take this frame: watched, and 1/max_fps since the last one taken."""
        if self._viewers <= 0:
            return False
        now = time.monotonic() if now is None else now
        return self._last_taken is None or now - self._last_taken >= 1.0 / self.max_fps

    def offer(self, frame: LiveFrame) -> None:
        """Hand a frame to the encoder; never waits for it (an older frame not yet encoded is dropped)."""
        with self._changed:
            self._last_taken = time.monotonic()
            self.taken += 1
            if self._pending is not None:
                self.dropped += 1
            self._pending = frame
            self._changed.notify_all()

    @property
    def plain_viewers(self) -> int:
        """Viewers of the frames without the drawings (the encoder makes those only while any)."""
        return self._plain_viewers

    @property
    def seq(self) -> int:
        """The number of the newest picture made (0: none yet): a viewer's `after_seq` above it
        came from another LiveView (the pipeline was rebuilt)."""
        return self._seq

    def watch(self, plain: bool = False) -> Viewer:
        """Register a viewer (frames are made from the next one on); use it as a context manager.
        `plain`: of the frames without the drawings."""
        with self._changed:
            self._viewers += 1
            self._plain_viewers += plain
            if not self.closed and (self._thread is None or not self._thread.is_alive()):
                self._thread = named_thread(self._encode_loop, f"live-view-{self.name}")
                self._thread.start()
        return Viewer(self, plain)

    def _leave(self, plain: bool) -> None:
        with self._changed:
            if self._viewers > 0:  # (0 already: the pipeline closed the view)
                self._viewers -= 1
                self._plain_viewers = max(0, self._plain_viewers - plain)
            # The last viewer of a kind gone: the next one waits for a fresh picture, not one from back then.
            if self._plain_viewers == 0:
                self._plain = None
            if self._viewers == self._plain_viewers:
                self._jpeg = None
            if self._viewers == 0:
                self._drop_pending()  # nobody will see it
                self._last_taken = None
            self._changed.notify_all()

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self.dropped += 1
            self._pending = None

    def latest(
        self, after_seq: int = 0, timeout: float = 5.0, plain: bool = False
    ) -> tuple[int, bytes, float] | None:
        """See `Viewer.latest` (`plain`: the picture without the drawings)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                shown = self._plain if plain else self._jpeg
                if shown is not None and shown[0] > after_seq:
                    return shown
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self._changed.wait(left)

    def _encode_loop(self) -> None:
        while True:
            with self._changed:
                while self._pending is None:
                    if self._viewers <= 0:
                        return  # the last viewer left: the thread goes, a new viewer starts another
                    self._changed.wait(_IDLE_CHECK_S)
                frame, self._pending = self._pending, None
                # Each kind only while someone watches it (read once: a viewer may come meanwhile).
                drawn, plain = self._viewers > self._plain_viewers, self._plain_viewers > 0
            try:
                jpeg = encode_jpeg(draw_live_frame(frame), self.quality) if drawn else None
                bare = encode_jpeg(frame.pixels, self.quality) if plain else None
            except Exception:  # a bad frame costs its own picture, never the view
                log.exception("pipeline %s: cannot draw the live view's frame", self.name)
                self.failures += 1
                continue
            with self._changed:
                self.encodes += 1
                self._seq += 1
                if jpeg is not None:  # (no max_bytes: always encoded)
                    self._jpeg = (self._seq, jpeg, frame.captured_at)
                if bare is not None:
                    self._plain = (self._seq, bare, frame.captured_at)
                self._changed.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """The pipeline stopped: viewers get nothing newer; the encoder thread ends."""
        with self._changed:
            self.closed = True
            self._viewers = self._plain_viewers = 0
            self._drop_pending()
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._changed:
            return {
                "viewers": self._viewers,
                "plain_viewers": self._plain_viewers,
                "max_fps": self.max_fps,
                "taken": self.taken,
                "encodes": self.encodes,
                "dropped": self.dropped,
                "failures": self.failures,
            }


def draw_live_frame(frame: LiveFrame) -> np.ndarray:
    """The live view's picture: motion areas under the zones, lines, boxes and anchors."""
    canvas = draw_motion_areas(frame.pixels, frame.motion_areas) if frame.motion_areas else frame.pixels
    return draw_scene(
        canvas,
        frame.entries,
        frame.zones,
        frame.lines,
        occupancy=frame.occupancy,
        limits=frame.limits,
        counts=frame.counts,
    )
