"""`edge-agent infer MODEL CLIP --track`: every frame of a video file through the model as a pipeline
processes it, the boxes tracked by the daemon's own `Scene` (agent/processing/scene.py: ByteTrack
ids, zones, lines; docs/analytics.md) and its events handed over as they happen, then a summary.

The settings: the named pipeline's zones, lines and `track:` (its defaults when zones or lines turn
tracking on, or none of them at all); without a pipeline the tracker's defaults and no zones or
lines. The clock is the clip's: frame i is at i / fps seconds (each event carries that position
and its frame number, counted from 0 as --frame counts them), and an event's times (`at`, the
object's `first_seen`, ...) read as if the clip had started when infer did. At the clip's end every
open track ends (reason `end of clip`).

INPUT may also be a camera or stream (rtsp://, http(s)://, /dev/videoN, gst:...): its frames for
`seconds` (10 by default), each at its capture time; or one image: one frame, which is all there is,
so a track is confirmed and a zone entered on it (min_hits, min_frames 1, min_seconds 0).

A pipeline with `attributes:` has its second models read the tracked objects as the daemon's step does
(agent/tools/infer/attributes.py): each answer is an object's `update`, later events carry it, and the
readings still out at the clip's end are waited for before its last tracks end.

--draw writes the picture (agent/processing/drawing.py `draw_scene`): the boxes (each track in its own
colour, `label #id score`, then what its attributes read) with the anchor points the zones and lines
count by, the zones coloured by state with their live counts, the lines with their counts per
direction. A video name (.mp4: H.264, .webm: VP8, .avi: MJPEG; agent/tools/infer/video.py) gets every
frame at the clip's fps and size (a camera's frames at their capture times on a DRAW_CAMERA_FPS grid);
an image name the frame with the most tracked objects (the latest of equals; the last frame when
nothing was tracked).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from agent.attribute_models import AttributeSet
from agent.config import PipelineConfig, TrackConfig
from agent.config.processing import gives_boxes
from agent.errors import EdgeAgentError, ModelError
from agent.processing.drawing import draw_scene
from agent.processing.scene import Event, Scene, boxes_of
from agent.processing.zones import LineShape, ZoneShape
from agent.stage import Stage
from agent.tools.infer.attributes import ClipAttributes, attributes_note, load_attributes
from agent.tools.infer.camera import camera_frames
from agent.tools.infer.choice import Loaded, ResolvedModel, artifact_run, settings_for, state_or_scratch
from agent.tools.infer.draw import write_picture
from agent.tools.infer.inputs import NAMED, input_kind, read_image, read_video_frame
from agent.tools.infer.run import (
    InferRequest,
    filters_note,
    latency,
    model_and_pipeline,
    on_model,
    ready_stage,
)
from agent.tools.infer.video import REFUSED, VIDEO_FORMATS, VideoWriter, is_video_name, video_problem
from providers import BackendError

MAX_FRAMES = 1_000_000  # a bound on the frames read (about 9 hours at 30 fps)
ASSUMED_FPS = 25.0  # for a video that does not say its frame rate
DRAW_CAMERA_FPS = 10.0  # a camera's drawn video: its frames placed at their capture times on this grid
CAMERA_SECONDS = 10.0  # how long --track reads a camera without --seconds
END_OF_CLIP = "end of clip"
ONE_IMAGE = (
    "one image: a track is confirmed and a zone entered on its one frame (min_hits, min_frames 1, "
    "min_seconds 0)"
)

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
    kind: str = "video"  # video, camera or image
    # The pipeline's second models (`attributes:`): per attribute its model, backend and what it read.
    attributes: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "input": self.input,
            "kind": self.kind,
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
        if self.attributes is not None:
            data["attributes"] = self.attributes
        if self.note:
            data["note"] = self.note
        return data


def check_track_draw(path: Path, kind: str = "video") -> None:
    """EdgeAgentError unless --draw can write `path` with --track (before the model runs): a video
    (VIDEO_FORMATS, whose encoder is here) or an image type OpenCV writes, in a folder that exists
    and can be written to. `kind` "image" (one frame): an image only."""
    if path.is_dir():
        raise EdgeAgentError(f"--draw {path} is a folder: name the file to write")
    suffix = path.suffix.lower()
    videos = ", ".join(VIDEO_FORMATS)
    if kind == "image" and (is_video_name(path) or suffix in REFUSED):
        raise EdgeAgentError(
            f"--draw {path}: the input is one image, so is the picture", hint="name a .jpg or .png"
        )
    problem = video_problem(path)
    if problem:
        playable = [suffix for suffix in VIDEO_FORMATS if video_problem(Path(f"out{suffix}")) is None]
        raise EdgeAgentError(
            f"--draw {path}: {problem}",
            hint=f"name a video ({', '.join(playable)}: the whole clip) or an image (.jpg, .png: the frame "
            "with the most tracked objects)",
        )
    if not is_video_name(path) and not cv2.haveImageWriter(str(path)):
        what = f"cannot write {suffix!r} files" if suffix else "a name without a suffix says no file type"
        raise EdgeAgentError(
            f"--draw {path}: {what}",
            hint=f"name a video ({videos}: the whole clip) or an image (.jpg, .png: the frame with the "
            "most tracked objects)",
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
    seconds: float | None = None,
    on_start: Callable[[TrackResult], None] | None = None,
    on_event: OnEvent | None = None,
) -> TrackResult:
    """Run MODEL on every frame of INPUT (a video file, a camera, or one image) and track what it
    finds (the module's docstring): `seconds` bounds the clip's time (a camera's: CAMERA_SECONDS by
    default); `on_start` is called once the backend is loaded, `on_event` with each event as it
    happens."""
    input_path = request.input_path
    camera: Iterator[Frame] | None = None
    if request.camera is not None:
        kind = "camera"
        camera = _camera_clip(request.camera, seconds or CAMERA_SECONDS)
        first = next(camera)  # the camera answers (or says why) before the model loads
    else:
        kind = input_kind(input_path)
        if kind not in ("video", "image"):
            raise EdgeAgentError(
                f"--track follows objects across a video's frames; {input_path} is {NAMED[kind]}"
            )
        first = Frame(read_image(input_path) if kind == "image" else read_video_frame(input_path, 0), 0, 0.0)
    if draw is not None:
        check_track_draw(draw, kind)
    model, config, embedded = model_and_pipeline(request, "image" if kind == "camera" else kind)
    if kind == "image":
        config = _one_frame(config)

    def clip() -> Iterator[Frame]:
        """The frames from the first (again, where `on_model` runs the body again on other backends;
        a camera goes on from where it is)."""
        if camera is not None:
            return itertools.chain([first], camera)
        return iter([first]) if kind == "image" else _file_clip(input_path, seconds)

    def run(completed: PipelineConfig, loaded: Loaded) -> TrackResult:
        tracker = _ClipTracker(completed, model, loaded, request, kind, draw, on_start, on_event)
        return tracker.run(clip())

    try:
        return on_model(request, model, config, embedded, run, kind="image" if kind == "camera" else kind,
                        picture=first.data)  # fmt: skip
    finally:
        close = getattr(camera, "close", None)
        if close is not None:
            close()  # the camera stopped now, not when the generator is collected


@dataclass(frozen=True)
class Frame:
    """One frame of the clip: the picture, its number (from 0) and its position in seconds."""

    data: np.ndarray
    index: int
    position: float
    fps: float = 0.0  # the clip's rate where the clip says it (files; 0: a camera or an image)
    note: str = ""


def _file_clip(path: Path, seconds: float | None) -> Iterator[Frame]:
    """A video file's frames in order, frame i at i / fps (ASSUMED_FPS where the file says none)."""
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise EdgeAgentError(f"{path}: OpenCV cannot open this video (a damaged file, or no codec)")
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
        note = ""
        if not math.isfinite(fps) or fps <= 0 or fps > 1000:
            note = f"the video does not say its frame rate: {ASSUMED_FPS:g} fps assumed"
            fps = ASSUMED_FPS
        for index in range(MAX_FRAMES):
            ok, picture = capture.read()
            if not ok or picture is None or (seconds is not None and index / fps >= seconds):
                return
            yield Frame(picture, index, index / fps, fps, note)
    finally:
        capture.release()


def _camera_clip(uri: str, seconds: float) -> Iterator[Frame]:
    """A camera's frames for `seconds` after its first, each at its capture time from the first."""
    began: float | None = None
    for index, frame in enumerate(camera_frames(uri, seconds)):
        began = frame.captured_at if began is None else began
        yield Frame(frame.data, index, max(0.0, frame.captured_at - began))
        if index + 1 >= MAX_FRAMES:
            return


def _one_frame(config: PipelineConfig) -> PipelineConfig:
    """The pipeline's settings for one image: a track confirmed and a zone entered on one frame."""
    tracking = (config.tracking or TrackConfig()).model_copy(update={"min_hits": 1})
    zones = [zone.model_copy(update={"min_frames": 1, "min_seconds": 0.0}) for zone in config.zones]
    return config.model_copy(update={"track": tracking, "zones": zones})


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
        request: InferRequest,
        kind: str,
        draw: Path | None,
        on_start: Callable[[TrackResult], None] | None,
        on_event: OnEvent | None,
    ) -> None:
        self.config, self.model, self.loaded, self.request = config, model, loaded, request
        self.pipeline, self.kind, self.draw = request.pipeline, kind, draw
        self.on_start, self.on_event = on_start, on_event
        zero = {"entries": 0, "exits": 0, "dwell": 0, "overcrowded": 0}
        self.counts: dict[str, dict[str, int]] = {zone.name: dict(zero) for zone in config.zones}
        self.limits = {zone.name: zone.max_objects for zone in config.zones}
        self.writer: VideoWriter | None = None
        self.best: tuple[int, int, np.ndarray] | None = None  # tracked objects, frame, drawn picture

    def run(self, frames: Iterator[Frame]) -> TrackResult:
        problem = boxes_problem(self.config)
        if problem:
            raise EdgeAgentError(
                f"{self.model.ref}: {problem}",
                hint="give --pipeline NAME -c CONFIG with a detection postprocess"
                if self.pipeline is None
                else f"pipeline {self.pipeline} has no boxes to track",
            )
        stage = ready_stage(self.config, self.model, self.loaded, defaults=self.pipeline is None)
        head = next(frames, None)  # the clip's own first frame: its rate and size
        if head is None:
            raise EdgeAgentError(f"{self.request.input_name}: OpenCV decoded no frame of this video")
        with state_or_scratch(self.request.state_dir) as states:
            models = None
            if self.config.attributes:  # second models, loaded where this box runs them
                settings = settings_for(self.request.agent, states)
                models = load_attributes(self.config, self.request.store, settings)
            try:
                result = self._frames(stage, itertools.chain([head], frames), head, models)
            except BaseException:
                if self.writer is not None:
                    self.writer.abort()
                    self.writer = None
                    if self.draw is not None:
                        self.draw.unlink(missing_ok=True)
                raise
            finally:
                if models is not None:
                    models.release()  # the reader stops, the sessions close
        return result

    def _frames(
        self, stage: Stage, frames: Iterator[Frame], first: Frame, models: AttributeSet | None
    ) -> TrackResult:
        session = self.loaded.session
        # A camera's rate is what it gives (known at the end); its drawn video is on a grid.
        fps = first.fps or (DRAW_CAMERA_FPS if self.kind == "camera" else 1.0)
        height, width = first.data.shape[:2]
        result = TrackResult(
            model=self.model.ref,
            input=self.request.input_name,
            pipeline=self.pipeline,
            backend=session.backend,
            precision=session.precision,
            artifact=artifact_run(self.loaded, session.backend),
            proven=self.loaded.choice.proven,
            backend_choice=self.loaded.how,
            fps=fps,
            size=[width, height],
            kind=self.kind,
            note="; ".join(filter(None, [first.note, ONE_IMAGE if self.kind == "image" else ""])),
        )
        tracking = self.config.tracking or TrackConfig()
        scene = Scene(tracking, self.config.zones, self.config.lines)
        reader = ClipAttributes(self.config, models, scene) if models is not None else None
        if reader is not None:
            result.attributes = reader.status()  # (on_start says where each runs)
        shapes: tuple[list[ZoneShape], list[LineShape]] | None = None
        started = time.time()  # the clip's frame 0, for the events' times
        totals = np.zeros(3)
        frames_run = 0
        position = 0.0
        for frame in frames:
            picture, index, position = frame.data, frame.index, frame.position
            try:
                run = stage.run_frame(picture, gap=index == 0)
            except BackendError as exc:
                if index == 0:
                    raise  # the first frame: the candidates are proven on this input (on_model)
                raise ModelError(f"{self.model.ref}: frame {index}: {exc}") from None
            if index == 0 and self.on_start is not None:
                self.on_start(result)
            frames_run += 1
            totals += (run.preprocess_ms, run.inference_ms, run.postprocess_ms)
            # None: a plugin without boxes this frame (skipped, as in the daemon)
            entries = boxes_of(run.output)
            height, width = picture.shape[:2]
            if entries is not None:
                scene.step(entries, started + position, width, height)
                self._events(scene.take_events(), result, index, position)
                if reader is not None:  # answers put on their objects, objects due a reading asked
                    assert run.output is not None
                    self._events(reader.frame(index, picture, run.output, started + position), result, index,
                                 position)  # fmt: skip
            if self.draw is not None:
                if shapes is None or result.size != [width, height]:
                    result.size = [width, height]
                    shapes = _shapes(self.config, width, height)
                self._draw(picture, entries or [], shapes, scene, index, position, fps)
            if frames_run >= MAX_FRAMES:
                result.note = "; ".join(filter(None, [result.note, f"stopped after {MAX_FRAMES} frames"]))
                break
        if frames_run == 0:
            raise EdgeAgentError(f"{result.input}: OpenCV decoded no frame of this video")
        if self.kind == "camera":
            result.fps = (frames_run - 1) / position if position > 0 else 0.0
            result.note = "; ".join(filter(None, [result.note, f"{frames_run} frame(s) in {position:.1f} s"]))
        if scene.problems:  # pixel points outside the frame (the daemon logs them)
            result.note = "; ".join(filter(None, [result.note, *scene.problems]))
        result.note = "; ".join(filter(None, [result.note, filters_note(stage)]))
        if reader is not None:  # the readings still out, on their objects before the tracks end
            self._events(reader.drain(frames_run - 1, started + position), result, frames_run - 1, position)
            result.attributes = reader.status()
            said = attributes_note(result.attributes, reader.unread)
            result.note = "; ".join(filter(None, [result.note, said]))
        open_at_end = scene.summary()
        scene.end_all(END_OF_CLIP, started + position)
        self._events(scene.take_events(), result, frames_run - 1, position, at_end=True)
        result.frames = frames_run
        result.latency_ms = latency(*(totals / frames_run))
        result.summary = self._summary(scene, open_at_end)
        result.drawn = self._finish_drawing(frames_run)
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
        scene: Scene,
        index: int,
        position: float,
        fps: float,
    ) -> None:
        assert self.draw is not None
        video = is_video_name(self.draw)
        tracked = sum(1 for entry in entries if entry.get("track_id") is not None)
        if not video and self.best is not None and tracked < self.best[0]:
            return  # not the frame an image keeps: no need to draw it
        zones, lines = shapes
        now = scene.summary() if zones or lines else {"zones": {}, "lines": {}}
        canvas = draw_scene(
            picture,
            with_attributes(entries, scene),
            zones,
            lines,
            occupancy=now["zones"],
            limits=self.limits,
            counts=now["lines"],
        )
        if not video:
            self.best = (tracked, index, canvas)
            return
        if self.writer is None:
            height, width = canvas.shape[:2]
            self.writer = VideoWriter(self.draw, fps, (width, height))
        # Each frame held until the next one's time: one a frame for a file (frame i at i / fps), a
        # camera's at their capture times (repeated over a gap, left out when two share a tick).
        due = math.floor(position * fps + 0.5) + 1 - self.writer.frames
        for _ in range(min(max(due, 1 if self.writer.frames == 0 else 0), 10 * math.ceil(fps))):
            self.writer.write(canvas)

    def _finish_drawing(self, frames: int) -> str:
        if self.draw is None:
            return ""
        if is_video_name(self.draw):
            assert self.writer is not None
            writer, self.writer = self.writer, None
            writer.close()
            shown = f"{writer.frames} frame(s)"
            if self.kind == "camera":
                shown += f" at {writer.fps:g} fps ({frames} from the camera, each at its time)"
            return f"{shown} with the tracked boxes, zones and lines"
        assert self.best is not None
        tracked, index, canvas = self.best
        write_picture(self.draw, canvas)
        return f"frame {index}, {tracked} tracked object(s): the most in any frame (the latest of equals)"


def with_attributes(entries: list[dict[str, Any]], scene: Scene) -> list[dict[str, Any]]:
    """The entries, each tracked one with its object's attributes read so far (drawn by its caption)."""
    drawn = []
    for entry in entries:
        obj = scene.objects.get(entry["track_id"]) if entry.get("track_id") is not None else None
        drawn.append({**entry, "attributes": obj.attributes} if obj is not None and obj.attributes else entry)
    return drawn


def _shapes(config: PipelineConfig, width: int, height: int) -> tuple[list[ZoneShape], list[LineShape]]:
    return (
        [ZoneShape.from_config(zone, width, height) for zone in config.zones],
        [LineShape.from_config(line, width, height) for line in config.lines],
    )
