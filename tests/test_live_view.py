"""The live view (agent/live_view.py, agent/steps/live.py) on a real pipeline: a real detector (nudenet's
YOLOv8n) on a rendered clip of a face crossing a line (tests/test_pipeline_tracking.py's).

Unwatched, nothing is copied or encoded; watched, JPEGs of the right size with the tracked face's box
drawn arrive at most max_fps a second; the last viewer leaving stops them; a viewer that never reads
(and an encoder that cannot keep up) costs the pipeline no frame.
"""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np

from agent.config import PipelineConfig, VideoSourceConfig
from agent.live_view import LiveFrame, LiveView, draw_live_frame
from agent.pipeline import Pipeline
from agent.processing.drawing import MOTION_COLOUR, track_colour
from agent.stage import LoadedModel, Stage
from agent.steps.live import LiveViewStep
from tests.media_fixtures import ListSink
from tests.test_pipeline_tracking import (  # noqa: F401  (fixtures)
    FRAMES,
    RIGHT,
    H,
    W,
    config,
    crossing_clip,
)
from tests.waits import wait_until


def fast(clip: Path, labels: list[str]) -> PipelineConfig:
    """The clip's 40 frames, every one to the model as fast as it takes them."""
    return config(clip, labels, source=VideoSourceConfig(type="video", uri=str(clip), realtime=False))


def step_runs(pipeline: Pipeline) -> int:
    steps = [s for thread in pipeline.stages.plan.steps.values() for s in thread if s.name == "live_view"]
    assert len(steps) == 1
    return steps[0].stats.runs


def test_unwatched_the_step_runs_on_every_frame_and_copies_and_encodes_nothing(
    crossing_clip: Path,  # noqa: F811
    yolo_loaded: LoadedModel,
    yolo_labels: list[str],
    started: list[Pipeline],
) -> None:
    pipeline = Pipeline(fast(crossing_clip, yolo_labels), yolo_loaded, ListSink())
    started.append(pipeline)
    pipeline.start()
    wait_until(lambda: pipeline.finished, "the clip's end", timeout=60)
    assert step_runs(pipeline) == FRAMES
    view = pipeline.live_view
    assert (view.taken, view.encodes) == (0, 0)
    assert view._thread is None  # no encoder thread either
    # Nor are the frames' pixels kept past the model for it (they are while someone watches).
    assert not pipeline.stages.plan.keeps_pixels


def test_a_viewer_gets_drawn_jpegs_at_most_max_fps_and_leaving_stops_them(
    crossing_clip: Path,  # noqa: F811
    yolo_loaded: LoadedModel,
    yolo_labels: list[str],
    started: list[Pipeline],
) -> None:
    sink = ListSink()
    pipeline = Pipeline(config(crossing_clip, yolo_labels, loop=True), yolo_loaded, sink)  # 10 fps, looped
    started.append(pipeline)
    view = pipeline.live_view
    assert view.max_fps == 2
    pipeline.start()
    shown: list[tuple[int, bytes, float]] = []
    with view.watch() as viewer:
        began = time.monotonic()
        seq = 0
        for _ in range(20):  # bounded: 4 pictures at 2 a second take ~2 s
            got = viewer.latest(after_seq=seq, timeout=10)
            assert got is not None, "no live frame within 10 s"
            seq = got[0]
            shown.append(got)
            if len(shown) == 4:
                break
        elapsed = time.monotonic() - began
        assert [s[0] for s in shown] == sorted({s[0] for s in shown})  # each newer than the last
        # At most max_fps: the first at once, then one each 1/2 s (a picture may be dropped, never added).
        assert view.taken <= 1 + view.max_fps * (time.monotonic() - began) + 1
        assert elapsed >= (len(shown) - 1) / view.max_fps - 0.1
    # Each picture: the frame's size, the tracked face's box in its track's colour where the result
    # of the same frame put it.
    by_time = {r["captured_at"]: r for _, r in sink.results}
    checked = 0
    for _, jpeg, captured_at in shown:
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (H, W, 3)
        result = by_time.get(captured_at)
        faces = [d for d in (result or {}).get("output", {}).get("detections", []) if d.get("track_id")]
        if not faces:
            continue  # (the first frames of the loop: not confirmed as a track yet)
        x1, y1, _, y2 = (round(v) for v in faces[0]["box"])
        colour = np.array(track_colour(faces[0]["track_id"]), np.int32)
        # The box's left edge, away from its caption (above) and its anchor (bottom): each row's pixel
        # nearest the track's colour, within JPEG's blur of a 2-pixel line.
        strip = image[y1 + 10 : y2 - 10, max(x1 - 2, 0) : x1 + 3].astype(np.int32)
        nearest = np.abs(strip - colour).sum(axis=2).min(axis=1)
        assert np.median(nearest) < 90, (captured_at, np.median(nearest))
        assert np.abs(np.array([90, 90, 90]) - colour).sum() > 2 * 90  # (the grey background would not pass)
        checked += 1
    assert checked >= 2
    # The last viewer left: the encoder thread ends and no frame is taken any more.
    wait_until(lambda: view._thread is not None and not view._thread.is_alive(), "the encoder thread ends")
    taken, frames = view.taken, step_runs(pipeline)
    wait_until(lambda: step_runs(pipeline) >= frames + 10, "ten more frames", timeout=30)
    assert view.taken == taken


def test_a_viewer_that_never_reads_and_a_slow_encoder_cost_the_pipeline_no_frame(
    crossing_clip: Path,  # noqa: F811
    yolo_loaded: LoadedModel,
    yolo_labels: list[str],
    started: list[Pipeline],
) -> None:
    def run(watched: bool) -> tuple[int, float, LiveView]:
        sink = ListSink()
        pipeline = Pipeline(fast(crossing_clip, yolo_labels), yolo_loaded, sink)
        started.append(pipeline)
        view = pipeline.live_view
        view.max_fps = 1e9  # every frame taken: more than the encoder keeps up with
        viewer = view.watch() if watched else None
        began = time.monotonic()
        pipeline.start()
        wait_until(lambda: pipeline.finished, "the clip's end", timeout=60)
        elapsed = time.monotonic() - began
        if viewer is not None:
            viewer.close()  # (never read a picture)
            wait_until(lambda: view._thread is not None and not view._thread.is_alive(), "the encoder ends")
        return len(sink.results), elapsed, view

    frames_alone, alone_s, _ = run(False)
    frames_watched, watched_s, view = run(True)
    assert frames_alone == frames_watched == FRAMES  # every frame of the clip reported, watched or not
    assert view.taken == FRAMES and view.encodes >= 1
    assert view.encodes + view.dropped == view.taken  # each frame taken was encoded or dropped unseen
    # (A shared box: a wide margin; scripts/bench_live_view.py measures it side by side.)
    assert watched_s < 2 * alone_s + 2, (alone_s, watched_s)


def test_motion_areas_are_outlined_under_the_boxes_and_a_viewer_without_news_gets_none_in_time() -> None:
    pixels = np.full((120, 160, 3), 40, np.uint8)
    frame = LiveFrame(pixels, 1.0, [{"box": [20, 20, 60, 60], "label": "face", "track_id": 3}],
                      motion_areas=[(80, 30, 150, 100)])  # fmt: skip
    drawn = draw_live_frame(frame)
    assert (drawn[30, 100] == MOTION_COLOUR).all() and (drawn[60, 80] == MOTION_COLOUR).all()
    assert (drawn[40, 20] == track_colour(3)).all()
    assert (pixels == 40).all()  # the frame itself is left alone
    view = LiveView("p")
    with view.watch() as viewer:
        assert viewer.latest(after_seq=0, timeout=0.05) is None  # nothing encoded yet: none, in time
        view.offer(frame)
        got = viewer.latest(after_seq=0, timeout=10)
        assert got is not None and got[0] == 1 and got[2] == 1.0
        assert viewer.latest(after_seq=1, timeout=0.05) is None
    assert not view.watched and not view.due()
    with view.watch() as again:  # a later viewer is not shown the picture of back then
        assert again.latest(after_seq=0, timeout=0.05) is None
    view.close()  # (the pipeline stopped): a viewer waits no more, and no encoder starts
    with view.watch() as viewer:
        began = time.monotonic()
        assert viewer.latest(after_seq=1, timeout=10) is None and time.monotonic() - began < 5
        assert view._thread is not None and not view._thread.is_alive()


def test_a_swapped_in_stage_draws_for_the_same_live_view(
    crossing_clip: Path,  # noqa: F811
    yolo_loaded: LoadedModel,
    yolo_labels: list[str],
    started: list[Pipeline],
) -> None:
    pipeline = Pipeline(config(crossing_clip, yolo_labels), yolo_loaded, ListSink())
    started.append(pipeline)
    swapped = pipeline._plan_of(Stage(config(crossing_clip, yolo_labels, zones=[RIGHT]), yolo_loaded))
    steps = [s for s in swapped.steps["report"] if isinstance(s, LiveViewStep)]
    assert len(steps) == 1 and steps[0].view is pipeline.live_view  # viewers keep watching across it
    assert [z.name for z in steps[0].config.zones] == ["right"]  # ... the new stage's zones drawn
