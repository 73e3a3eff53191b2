"""The motion gate in a running pipeline (agent/steps/motion.py, agent/processing/motion.py): rendered
clips of a textured static scene with a little camera noise, MJPG-compressed, played through the real
`Pipeline` with the real YOLOv8n face detector (nudenet's 320n.onnx) on the astronaut photo's face.

- a brightness jump (the whole frame +60 at once) is no motion: the background is learnt again and the
  model runs on no more than a couple of frames;
- a clock overlay (digits changing every frame) wakes the detector on every frame, and never once it is
  masked;
- a static scene goes to the model once every keepalive_s (of the clip's time), the other frames are
  gated and counted (status `steps.motion.frames_gated`, results' `frames_gated`);
- a face that walks into a zone and stands still there for 10 s keeps its track (the gate lets every
  frame on while a track is alive) and gets its dwell event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.config import (
    DetectionPostprocess,
    HealthWindowConfig,
    ModelRef,
    MotionConfig,
    PipelineConfig,
    PreprocessConfig,
    ResizeConfig,
    TrackConfig,
    VideoSourceConfig,
    ZoneConfig,
)
from agent.pipeline import Pipeline
from agent.stage import LoadedModel, Stage
from agent.supervisor.health import watch
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests import media_fixtures
from tests.media_fixtures import FACE_BOX, ListSink, astronaut_bgr, cls_artifact
from tests.waits import wait_until

yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels

W, H = 640, 360
FACE = 130  # the face crop's side in the clip
CLOCK = (0.7, 0.0, 1.0, 0.15)  # the clock overlay's corner: x1, y1, x2, y2 as fractions of the frame


def background() -> np.ndarray:
    """A textured scene (coarse blobs and fine grain), not a flat grey that hides every difference."""
    rng = np.random.default_rng(3)
    coarse = cv2.resize(rng.integers(40, 170, (H // 20, W // 20, 3), dtype=np.uint8), (W, H), cv2.INTER_CUBIC)
    grain = rng.integers(-12, 13, (H, W, 1))
    return np.clip(coarse.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def face_crop() -> np.ndarray:
    x1, y1, x2, y2 = FACE_BOX.astype(int)
    margin = 25
    crop = astronaut_bgr()[max(0, y1 - margin) : y2 + margin, max(0, x1 - margin) : x2 + margin]
    return cv2.resize(crop, (FACE, FACE))


def write_clip(path: Path, fps: float, frames: list[np.ndarray]) -> Path:
    """The frames with a camera's noise (a few grey levels, new every frame), MJPG at `fps`."""
    rng = np.random.default_rng(5)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (W, H))
    assert writer.isOpened()
    try:
        for frame in frames:
            noise = rng.integers(-3, 4, (*frame.shape[:2], 1))
            writer.write(np.clip(frame.astype(np.int16) + noise, 0, 255).astype(np.uint8))
    finally:
        writer.release()
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("motion")
    scene = background()
    brighter = np.clip(scene.astype(np.int16) + 60, 0, 255).astype(np.uint8)
    clocked = []
    for i in range(30):
        frame = scene.copy()
        x1, y1 = int(CLOCK[0] * W) + 8, int(CLOCK[3] * H) - 12
        cv2.putText(
            frame, f"12:00:{i:02d}.{i * 7 % 100:02d}", (x1, y1), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (255,) * 3, 2
        )
        clocked.append(frame)
    return {
        "jump": write_clip(folder / "jump.avi", 10, [scene] * 15 + [brighter] * 15),
        "clock": write_clip(folder / "clock.avi", 10, clocked),
        "static": write_clip(folder / "static.avi", 10, [scene] * 60),
        "walker": write_clip(folder / "walker.avi", WALK_FPS, walker_frames(scene)),
    }


# The walker: WALK_EMPTY frames of the empty scene, then the face walks in from the left over WALK_IN
# frames, into the zone (the right part of the frame), and stands there for STAY_S, face unchanged.
WALK_FPS, WALK_EMPTY, WALK_IN, STAY_S = 5, 5, 10, 10
STOP_X = 430  # where the face's left edge stops


def walker_frames(scene: np.ndarray) -> list[np.ndarray]:
    face = face_crop()
    frames = [scene] * WALK_EMPTY
    for i in range(WALK_IN + STAY_S * WALK_FPS):
        x = round(20 + (STOP_X - 20) * min(i, WALK_IN) / WALK_IN)
        frame = scene.copy()
        frame[110 : 110 + FACE, x : x + FACE] = face
        frames.append(frame)
    return frames


def config(
    clip: Path,
    labels: list[str],
    motion: MotionConfig,
    realtime: bool = False,
    loop: bool = False,
    **more: Any,
) -> PipelineConfig:
    return PipelineConfig(
        name="faces",
        model=ModelRef(path=str(clip)),  # not read: the test hands the pipeline its loaded model
        source=VideoSourceConfig(type="video", uri=str(clip), realtime=realtime, loop=loop),
        preprocess=PreprocessConfig(
            resize=ResizeConfig(width=320, height=320, mode="letterbox"), color="rgb", scale=1 / 255
        ),
        postprocess=DetectionPostprocess(type="detection", score_threshold=0.3, labels=labels),
        motion=motion,
        **more,
    )


@pytest.fixture
def run(yolo_loaded: LoadedModel) -> Iterator[Callable[[PipelineConfig], tuple[ListSink, dict[str, Any]]]]:
    """Play a config's clip to its end: the results and the gate's status."""
    started: list[Pipeline] = []

    def play(config: PipelineConfig) -> tuple[ListSink, dict[str, Any]]:
        sink = ListSink()
        pipeline = Pipeline(config, yolo_loaded, sink)
        started.append(pipeline)
        pipeline.start()
        wait_until(lambda: pipeline.finished, "the clip's end", timeout=120)
        pipeline.stop(timeout=30)
        return sink, dict(pipeline.status().steps["motion"])

    yield play
    for pipeline in started:
        pipeline.stop(timeout=30)


@pytest.mark.parametrize("method", ["average", "mog2"])
def test_a_brightness_jump_is_no_motion_and_no_detector_storm(
    clips: dict[str, Path], yolo_labels: list[str], run: Any, method: str
) -> None:
    sink, gate = run(config(clips["jump"], yolo_labels, MotionConfig(method=method, keepalive_s=60)))
    assert gate["relearned"] == 1  # the jump, once
    assert gate["last_motion_at"] is None and gate["motion"] is False
    assert sink.count() <= 2, f"the model ran on {sink.count()} of 30 frames"
    assert gate["frames_gated"] == 30 - sink.count()


@pytest.mark.parametrize("method", ["average", "mog2"])
def test_a_clock_overlay_wakes_the_detector_unless_it_is_masked(
    clips: dict[str, Path], yolo_labels: list[str], run: Any, method: str
) -> None:
    sink, gate = run(config(clips["clock"], yolo_labels, MotionConfig(method=method, keepalive_s=60)))
    assert sink.count() >= 28 and gate["last_motion_at"] is not None  # every frame but the first moves
    x1, y1, x2, y2 = CLOCK
    mask = {"points": [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]}
    masked = MotionConfig(method=method, keepalive_s=60, masks=[mask])
    sink, gate = run(config(clips["clock"], yolo_labels, masked))
    assert sink.count() == 1  # the first frame, which starts the background
    assert gate["last_motion_at"] is None and gate["frames_gated"] == 29


def test_a_static_scene_goes_to_the_model_once_every_keepalive_s_and_the_rest_is_counted(
    clips: dict[str, Path], yolo_labels: list[str], run: Any
) -> None:
    sink, gate = run(config(clips["static"], yolo_labels, MotionConfig(keepalive_s=1)))
    positions = [r["source"]["position_s"] for _, r in sink.results]
    # 60 frames at 10 fps: the frames at 0, 1, ... 5 s of the clip (its own time, not the decoder's).
    assert positions == pytest.approx([0, 1, 2, 3, 4, 5], abs=0.051)
    gated = [r["frames_gated"] for _, r in sink.results]
    assert gated == [0, 9, 9, 9, 9, 9]
    assert gate["frames_gated"] == 60 - 6 and gate["relearned"] == 0 and gate["last_motion_at"] is None


# A background that takes a still object in within ~1.5 s (at 5 fps): the face standing still is soon no
# motion at all, and only its track keeps the model running.
GATE_FAST = MotionConfig(keepalive_s=60, learning_rate=0.2)


def test_a_walker_who_stops_in_a_zone_keeps_its_track_and_gets_its_dwell_event(
    clips: dict[str, Path], yolo_labels: list[str], run: Any
) -> None:
    bench = ZoneConfig(
        name="bench", points=[(0.55, 0), (1, 0), (1, 1), (0.55, 1)], anchor="center", dwell_s=5
    )
    sink, gate = run(
        config(
            clips["walker"],
            yolo_labels,
            GATE_FAST,
            realtime=True,
            zones=[bench],
            track=TrackConfig(),
        )
    )
    events = [e for _, e in sink.events]
    kinds = [e["type"] for e in events if e["type"] != "update"]
    assert kinds == ["new", "enter", "dwell", "exit", "end"], events
    assert {e["object"]["id"] for e in events} == {1}
    assert events[-1]["reason"] == "stopped"  # not lost while it stood still: ended by the stop
    # The empty scene before it was gated; once it moved, every frame went on (the track stayed alive).
    assert gate["frames_gated"] >= WALK_EMPTY - 2
    frames = WALK_EMPTY + WALK_IN + STAY_S * WALK_FPS
    assert sink.count() >= frames - WALK_EMPTY - 2
    assert gate["motion"] is False  # it stands still: no motion for most of its stay
    assert gate["last_motion_at"] < sink.results[-1][1]["captured_at"] - STAY_S / 2


def test_the_background_and_the_counts_outlive_a_stage_swap(
    clips: dict[str, Path], yolo_path: Path, yolo_labels: list[str]
) -> None:
    gate = MotionConfig(keepalive_s=60)
    before = config(clips["static"], yolo_labels, gate, realtime=True, loop=True)
    # A session of its own: the stages swapped out close it with the last of them.
    session = OnnxRuntimeBackend().load(cls_artifact(yolo_path))
    loaded = LoadedModel(name="faces", version="1", sha256="cd" * 32, session=session)
    pipeline = Pipeline(before, loaded, ListSink())
    try:
        pipeline.start()
        wait_until(lambda: pipeline.motion.frames_gated >= 3, "gated frames", timeout=60)
        background = pipeline.motion.detector
        # A new model version with the same motion settings: the same background, the counts go on.
        version_2 = LoadedModel(name="faces", version="2", sha256="ef" * 32, session=loaded.session)
        assert pipeline.stages.swap_in(Stage(before, version_2), timeout=60)
        gated = pipeline.motion.frames_gated
        wait_until(
            lambda: pipeline.motion.frames_gated >= gated + 3, "gated frames after the swap", timeout=60
        )
        assert pipeline.motion.detector is background
        assert pipeline.status().steps["motion"]["frames_gated"] >= gated + 3
        # Other motion settings: a background of their own, learnt afresh.
        tuned = config(
            clips["static"], yolo_labels, MotionConfig(keepalive_s=60, threshold=40), realtime=True, loop=True
        )
        assert pipeline.stages.swap_in(Stage(tuned, loaded), timeout=60)
        wait_until(
            lambda: pipeline.motion.detector is not background, "the new settings' background", timeout=60
        )
        assert pipeline.motion.detector is not None and pipeline.motion.detector.config.threshold == 40
    finally:
        pipeline.stop(timeout=30)


def test_a_new_version_in_its_health_window_sees_every_frame_then_the_gate_closes_again(
    clips: dict[str, Path], yolo_loaded: LoadedModel, yolo_labels: list[str]
) -> None:
    # A static scene would give a new version one frame in keepalive_s: too few to judge it on.
    still = config(clips["static"], yolo_labels, MotionConfig(keepalive_s=60), realtime=True, loop=True)
    pipeline = Pipeline(still, yolo_loaded, ListSink())
    try:
        pipeline.start()
        wait_until(lambda: pipeline.motion.frames_gated >= 3, "gated frames", timeout=60)
        window = HealthWindowConfig(window_s=2, min_frames=10)
        assert watch(pipeline, window, threading.Event()) is None  # ~20 frames at 10 fps: healthy
        assert pipeline.stage.stats.frames >= 10
        gated = pipeline.motion.frames_gated
        wait_until(lambda: pipeline.motion.frames_gated >= gated + 3, "the gate closing again", timeout=60)
    finally:
        pipeline.stop(timeout=30)
