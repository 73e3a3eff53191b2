"""`edge-agent infer MODEL CLIP --track`: every frame of a video file through the model as a pipeline
processes it, the boxes tracked by the daemon's own `Scene` (agent/processing/scene.py: ByteTrack
ids, zones, lines; docs/analytics.md) and its events handed over as they happen, then a summary.

The settings: the named pipeline's zones, lines and `track:` (its defaults when zones or lines turn
tracking on, or none of them at all); without a pipeline the tracker's defaults and no zones or
lines. The clock is the clip's: frame i is at i / fps seconds (each event carries that position
and its frame number, counted from 0 as --frame counts them), and an event's times (`at`, the
object's `first_seen`, ...) read as if the clip had started when infer did. At the clip's end every
open track ends (reason `end of clip`).

--draw writes the picture with the boxes (each track in its own colour, `label #id score`), the
zones and the lines drawn (agent/processing/drawing.py): a video name (.mp4, .avi) gets every frame
at the clip's fps and size; an image name the frame with the most tracked objects (the latest of
equals; the last frame when nothing was tracked).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.config import PipelineConfig, TrackConfig
from agent.config.processing import gives_boxes
from agent.errors import EdgeAgentError, ModelError
from agent.processing.drawing import draw_boxes, draw_zones
from agent.processing.scene import Event, Scene, boxes_of
from agent.processing.zones import LineShape, ZoneShape
from agent.stage import Stage
from agent.tools.infer.choice import Loaded, ResolvedModel, artifact_run
from agent.tools.infer.draw import write_picture
from agent.tools.infer.inputs import NAMED, input_kind, read_video_frame
from agent.tools.infer.run import InferRequest, latency, model_and_pipeline, on_model, ready_stage
from providers import BackendError

# Video files --draw writes with --track: suffix -> the FourCC OpenCV encodes it with (both are in
# every OpenCV build: no external codec library needed).
VIDEO_WRITERS = {".mp4": "mp4v", ".avi": "MJPG"}
MAX_FRAMES = 1_000_000  # a bound on the frames read (about 9 hours at 30 fps)
ASSUMED_FPS = 25.0  # for a video that does not say its frame rate
END_OF_CLIP = "end of clip"

OnEvent = Callable[[Event], None]


@dataclass
class TrackResult:
    """What `infer --track` gave: the model and backend, the clip, every event, and the summary."""

    model: str
    input: str
    pipeline: str | None
    backend: str
    precision: str
    artifact: str
    proven: bool
    backend_choice: str
    fps: float
    size: list[int]  # width, height
    frames: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)  # per frame, on average
    events: list[Event] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    drawn: str = ""  # what --draw wrote

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "input": self.input,
            "kind": "video",
            "pipeline": self.pipeline,
            "backend": self.backend,
            "precision": self.precision,
            "artifact": self.artifact,
            "proven": self.proven,
            "backend_choice": self.backend_choice,
            "latency_ms": self.latency_ms,
            "frames": self.frames,
            "fps": round(self.fps, 3),
            "size": self.size,
            "events": self.events,
            "tracking": self.summary,
        }
        if self.note:
            data["note"] = self.note
        return data


def check_track_draw(path: Path) -> None:
    """EdgeAgentError unless --draw can write `path` with --track (before the model runs): a video
    (.mp4, .avi) or an image type OpenCV writes, in a folder that exists and can be written to."""
    if path.is_dir():
        raise EdgeAgentError(f"--draw {path} is a folder: name the file to write")
    suffix = path.suffix.lower()
    if suffix not in VIDEO_WRITERS and not cv2.haveImageWriter(str(path)):
        what = f"cannot write {suffix!r} files" if suffix else "a name without a suffix says no file type"
        raise EdgeAgentError(
            f"--draw {path}: {what}",
            hint=f"name a video ({', '.join(VIDEO_WRITERS)}: the whole clip) or an image (.jpg, .png: "
            "the frame with the most tracked objects)",
        )
    folder = path.parent
    if not folder.is_dir():
        raise EdgeAgentError(f"--draw {path}: folder {folder} does not exist")
    existed = path.exists()
    try:  # opened for appending, so an existing file is left as it is until the run writes it
        with path.open("ab"):
            pass
    except OSError as exc:
        raise EdgeAgentError(f"--draw {path}: cannot write it: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


def track(
    request: InferRequest,
    *,
    draw: Path | None = None,
    on_start: Callable[[TrackResult], None] | None = None,
    on_event: OnEvent | None = None,
) -> TrackResult:
    """Run MODEL on every frame of the video INPUT and track what it finds (the module's docstring):
    `on_start` is called once the backend is loaded, `on_event` with each event as it happens."""
    input_path, pipeline = request.input_path, request.pipeline
    kind = input_kind(input_path)
    if kind != "video":
        raise EdgeAgentError(
            f"--track follows objects across a video's frames; {input_path} is {NAMED[kind]}"
        )
    if draw is not None:
        check_track_draw(draw)
    model, config, embedded = model_and_pipeline(request, kind)
    first = read_video_frame(input_path, 0)

    def run(completed: PipelineConfig, loaded: Loaded) -> TrackResult:
        tracker = _ClipTracker(completed, model, loaded, input_path, pipeline, draw, on_start, on_event)
        return tracker.run()

    return on_model(request, model, config, embedded, run, kind=kind, picture=first)


def boxes_problem(config: PipelineConfig) -> str | None:
    """Why this pipeline's output has no boxes to track, or None."""
    post = config.postprocess
    if gives_boxes(post):
        return None
    return (
        f"--track needs boxes, and a {post.type} postprocess gives none: tracking is for a detection "
        "(or regions) model"
    )


class _ClipTracker:
    """One clip through the stage and a Scene, frame by frame."""

    def __init__(
        self,
        config: PipelineConfig,
        model: ResolvedModel,
        loaded: Loaded,
        path: Path,
        pipeline: str | None,
        draw: Path | None,
        on_start: Callable[[TrackResult], None] | None,
        on_event: OnEvent | None,
    ) -> None:
        self.config, self.model, self.loaded, self.path = config, model, loaded, path
        self.pipeline, self.draw = pipeline, draw
        self.on_start, self.on_event = on_start, on_event
        zero = {"entries": 0, "exits": 0, "dwell": 0, "overcrowded": 0}
        self.counts: dict[str, dict[str, int]] = {zone.name: dict(zero) for zone in config.zones}
        self.writer: cv2.VideoWriter | None = None
        self.best: tuple[int, int, np.ndarray] | None = None  # tracked objects, frame, drawn picture
        self._size = (0, 0)  # the video writer's frame size

    def run(self) -> TrackResult:
        problem = boxes_problem(self.config)
        if problem:
            raise EdgeAgentError(
                f"{self.model.ref}: {problem}",
                hint="give --pipeline NAME -c CONFIG with a detection postprocess"
                if self.pipeline is None
                else f"pipeline {self.pipeline} has no boxes to track",
            )
        stage = ready_stage(self.config, self.model, self.loaded, defaults=self.pipeline is None)
        capture = cv2.VideoCapture(str(self.path))
        try:
            if not capture.isOpened():
                raise EdgeAgentError(
                    f"{self.path}: OpenCV cannot open this video (a damaged file, or no codec)"
                )
            return self._frames(stage, capture)
        finally:
            capture.release()
            if self.writer is not None:
                self.writer.release()

    def _frames(self, stage: Stage, capture: cv2.VideoCapture) -> TrackResult:
        session = self.loaded.session
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
        note = ""
        if not math.isfinite(fps) or fps <= 0 or fps > 1000:
            note = f"the video does not say its frame rate: {ASSUMED_FPS:g} fps assumed"
            fps = ASSUMED_FPS
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        result = TrackResult(
            model=self.model.ref,
            input=str(self.path),
            pipeline=self.pipeline,
            backend=session.backend,
            precision=session.precision,
            artifact=artifact_run(self.loaded, session.backend),
            proven=self.loaded.choice.proven,
            backend_choice=self.loaded.how,
            fps=fps,
            size=[width, height],
            note=note,
        )
        tracking = self.config.tracking or TrackConfig()
        scene = Scene(tracking, self.config.zones, self.config.lines)
        shapes: tuple[list[ZoneShape], list[LineShape]] | None = None
        started = time.time()  # the clip's frame 0, for the events' times
        totals = np.zeros(3)
        frames = 0
        position = 0.0
        for index in range(MAX_FRAMES):
            ok, picture = capture.read()
            if not ok or picture is None:
                break
            position = index / fps
            try:
                run = stage.run_frame(picture, gap=index == 0)
            except BackendError as exc:
                if index == 0:
                    raise  # the first frame: the candidates are proven on this input (on_model)
                raise ModelError(f"{self.model.ref}: frame {index}: {exc}") from None
            if index == 0 and self.on_start is not None:
                self.on_start(result)
            frames += 1
            totals += (run.preprocess_ms, run.inference_ms, run.postprocess_ms)
            entries = boxes_of(
                run.output
            )  # None: a plugin without boxes this frame (skipped, as in the daemon)
            height, width = picture.shape[:2]
            if entries is not None:
                scene.step(entries, started + position, width, height)
                self._events(scene.take_events(), result, index, position)
            if self.draw is not None:
                if shapes is None or result.size != [width, height]:
                    result.size = [width, height]
                    shapes = _shapes(self.config, width, height)
                self._draw(picture, entries or [], shapes, index, fps)
        else:
            result.note = "; ".join(filter(None, [result.note, f"stopped after {MAX_FRAMES} frames"]))
        if frames == 0:
            raise EdgeAgentError(f"{self.path}: OpenCV decoded no frame of this video")
        if scene.problems:  # pixel points outside the frame (the daemon logs them)
            result.note = "; ".join(filter(None, [result.note, *scene.problems]))
        open_at_end = scene.summary()
        scene.end_all(END_OF_CLIP, started + position)
        self._events(scene.take_events(), result, frames - 1, position, at_end=True)
        result.frames = frames
        result.latency_ms = latency(*(totals / frames))
        result.summary = self._summary(scene, open_at_end)
        result.drawn = self._finish_drawing(frames)
        return result

    def _events(
        self, events: list[Event], result: TrackResult, index: int, position: float, at_end: bool = False
    ) -> None:
        for event in events:
            event = {**event, "position_s": round(position, 3), "frame": index}
            kind, zone = event["type"], event.get("zone")
            if zone in self.counts and not at_end:
                key = {"enter": "entries", "exit": "exits", "dwell": "dwell"}.get(kind)
                if kind == "overcrowded" and event.get("state") == "start":
                    key = "overcrowded"
                if key is not None:
                    self.counts[zone][key] += 1
            result.events.append(event)
            if self.on_event is not None:
                self.on_event(event)

    def _summary(self, scene: Scene, open_at_end: dict[str, Any]) -> dict[str, Any]:
        """Tracks (all, and open when the clip ended), per zone entries, exits (before the clip's end),
        dwell and overcrowding events and who was inside at the end, per line crossings per direction."""
        zones = {}
        for name, counts in self.counts.items():
            inside = open_at_end["zones"].get(name, {})
            zones[name] = {
                **counts,
                "inside_at_end": inside.get("count", 0),
                "labels_at_end": inside.get("labels", {}),
            }
        return {
            "tracks": scene.started,
            "open_at_end": open_at_end["tracks"],
            "zones": zones,
            "lines": scene.summary()["lines"],
        }

    # --- --draw -----------------------------------------------------------------------------------

    def _draw(
        self,
        picture: np.ndarray,
        entries: list[dict[str, Any]],
        shapes: tuple[list[ZoneShape], list[LineShape]],
        index: int,
        fps: float,
    ) -> None:
        assert self.draw is not None
        video = self.draw.suffix.lower() in VIDEO_WRITERS
        tracked = sum(1 for entry in entries if entry.get("track_id") is not None)
        if not video and self.best is not None and tracked < self.best[0]:
            return  # not the frame an image keeps: no need to draw it
        zones, lines = shapes
        canvas = draw_zones(picture, zones, lines) if zones or lines else picture
        canvas = draw_boxes(canvas, entries)
        if not video:
            self.best = (tracked, index, canvas)
            return
        height, width = canvas.shape[:2]
        if self.writer is None:
            fourcc = cv2.VideoWriter.fourcc(*VIDEO_WRITERS[self.draw.suffix.lower()])
            self.writer = cv2.VideoWriter(str(self.draw), fourcc, fps, (width, height))
            if not self.writer.isOpened():
                raise EdgeAgentError(f"--draw {self.draw}: OpenCV cannot write this video here")
            self._size = (width, height)
        if (width, height) != self._size:  # a clip that changes size mid-way: the writer's size it is
            canvas = cv2.resize(canvas, self._size, interpolation=cv2.INTER_AREA)
        self.writer.write(canvas)

    def _finish_drawing(self, frames: int) -> str:
        if self.draw is None:
            return ""
        if self.draw.suffix.lower() in VIDEO_WRITERS:
            assert self.writer is not None
            self.writer.release()
            self.writer = None
            return f"{frames} frame(s) with the tracked boxes, zones and lines"
        assert self.best is not None
        tracked, index, canvas = self.best
        write_picture(self.draw, canvas)
        return f"frame {index}, {tracked} tracked object(s): the most in any frame (the latest of equals)"


def _shapes(config: PipelineConfig, width: int, height: int) -> tuple[list[ZoneShape], list[LineShape]]:
    return (
        [ZoneShape.from_config(zone, width, height) for zone in config.zones],
        [LineShape.from_config(line, width, height) for line in config.lines],
    )
