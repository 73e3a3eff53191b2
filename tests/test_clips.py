"""Event clips (agent/clips.py) in a running pipeline: a real face the real YOLOv8n finds crosses a
rendered video; its `new` and `end` name one H.264 MP4 that covers pre_s before the one to post_s after
the other; retention trims the oldest clips; an encoder that stops reading never stalls the pipeline;
the config refuses clips where they cannot work, at the line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from agent.clips import ClipRecorder, clip_path
from agent.config import (
    ClipsConfig,
    DetectionPostprocess,
    ModelRef,
    PipelineConfig,
    PreprocessConfig,
    ResizeConfig,
    TrackConfig,
    VideoSourceConfig,
)
from agent.config_loader import load_config
from agent.errors import ConfigError
from agent.pipeline import Pipeline
from agent.pipeline_tracking import PipelineTracking
from agent.stage import LoadedModel
from tests.config_cases import write
from tests.media_fixtures import ListSink
from tests.test_pipeline_tracking import FACE, face_crop
from tests.waits import wait_until

W, H, FPS = 640, 360, 10
BEFORE, CROSSING, AFTER = 15, 20, 25  # frames: empty, the face moving, empty (the track ends, post_s)
PRE_S, POST_S = 1.0, 1.0


class ClipSink(ListSink):
    """A ListSink that keeps clips, as the daemon's does beside its snapshots."""

    def __init__(self, clips_root: Path) -> None:
        super().__init__()
        self.clips_root = clips_root


@pytest.fixture(scope="module")
def visit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Empty frames, a face crossing from left to right (20 px a frame), empty frames: 6 s at 10 fps."""
    path = tmp_path_factory.mktemp("clips") / "visit.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (W, H))
    assert writer.isOpened()
    face = face_crop()
    for i in range(BEFORE + CROSSING + AFTER):
        frame = np.full((H, W, 3), 90, np.uint8)
        frame[::40, :] = 140  # some texture, so the empty frames are not trivial to encode
        if BEFORE <= i < BEFORE + CROSSING:
            x = 40 + 20 * (i - BEFORE)
            frame[110 : 110 + FACE, x : x + FACE] = face
        writer.write(frame)
    writer.release()
    return path


def config(
    video: Path, labels: list[str], clips: ClipsConfig, realtime: bool = True, loop: bool = False
) -> PipelineConfig:
    return PipelineConfig(
        name="faces",
        model=ModelRef(path=str(video)),  # not read: the test hands the pipeline its loaded model
        source=VideoSourceConfig(type="video", uri=str(video), realtime=realtime, loop=loop),
        preprocess=PreprocessConfig(
            resize=ResizeConfig(width=320, height=320, mode="letterbox"), color="rgb", scale=1 / 255
        ),
        postprocess=DetectionPostprocess(type="detection", score_threshold=0.1, labels=labels),
        track=TrackConfig(max_lost_s=0.5),
        clips=clips,
    )


def probe(path: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
         "stream=codec_name,pix_fmt,nb_frames,avg_frame_rate:format=duration,format_name", "-of", "json",
         str(path)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    data = json.loads(done.stdout)
    return {**data["streams"][0], **data["format"]}


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()


@dataclass
class Run:
    sink: ClipSink
    root: Path
    old: list[str]  # the clips there before, oldest first
    status: dict[str, Any]


@pytest.fixture(scope="module")
def run(
    visit: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    """The face's visit through a pipeline with clips (pre_s 1, post_s 1, at most 2 clips), whose clip
    directory holds three older clips and a temp file a crash left."""
    clips_root = tmp_path_factory.mktemp("state") / "clips"
    root = clips_root / "faces"
    root.mkdir(parents=True)
    old = [f"2020010{i}T000000Z-0000000{i}" for i in (1, 2, 3)]
    for clip_id in old:
        (root / f"{clip_id}.mp4").write_bytes(b"old clip")
    (root / "20200104T000000Z-00000004.mp4.tmp-abcd1234").write_bytes(b"half written")
    sink = ClipSink(clips_root)
    clips = ClipsConfig(enabled=True, pre_s=PRE_S, post_s=POST_S, max_clips=2)
    pipeline = Pipeline(config(visit, yolo_labels, clips), yolo_loaded, sink)
    pipeline.start()
    try:
        wait_until(lambda: pipeline.finished, "the video's end", timeout=120)
        clips = lambda: pipeline.status().steps["clips"]  # noqa: E731
        wait_until(lambda: clips()["clips"] >= 1, "the clip written", timeout=60)
        status = clips()
    finally:
        pipeline.stop(timeout=30)
    yield Run(sink, root, old, status)


def test_a_visit_gets_one_clip_from_pre_s_before_its_new_to_post_s_after_its_end(run: Run) -> None:
    events = [e for _, e in run.sink.events]
    new = [e for e in events if e["type"] == "new"]
    end = [e for e in events if e["type"] == "end"]
    assert len(new) == 1 and len(end) == 1 and end[0]["reason"] == "lost", events
    clip_id = new[0]["clip"]
    assert end[0]["clip"] == clip_id and all(e.get("clip") == clip_id for e in events)
    path = clip_path(run.root, clip_id)
    assert path is not None and path.is_file(), sorted(run.root.iterdir())
    info = probe(path)
    assert (info["codec_name"], info["pix_fmt"]) == ("h264", "yuv420p")
    assert "mp4" in info["format_name"]
    wanted = (at(end[0]) + POST_S) - (at(new[0]) - PRE_S)
    assert abs(float(info["duration"]) - wanted) <= 0.35, (info, wanted)
    assert run.status["clips"] == 1 and run.status["frames_dropped"] == 0 and run.status["failed"] == 0


def test_the_index_is_at_the_front_for_browsers(run: Run) -> None:
    (path,) = [p for p in run.root.iterdir() if p.name not in {f"{i}.mp4" for i in run.old}]
    head = path.read_bytes()[:4096]
    assert head.find(b"moov") != -1 and (head.find(b"mdat") == -1 or head.find(b"moov") < head.find(b"mdat"))


def test_retention_keeps_the_newest_clips_and_a_crash_s_temp_file_goes(run: Run) -> None:
    names = sorted(p.name for p in run.root.iterdir())
    new_id = next(e["clip"] for _, e in run.sink.events if e["type"] == "new")
    assert names == [f"{run.old[-1]}.mp4", f"{new_id}.mp4"]
    assert run.status["removed"] == 2 and run.status["kept"] == 2


def test_clip_names_outside_the_id_form_are_refused(tmp_path: Path) -> None:
    for bad in ("../x", "..%2fx", "20261129T071846Z-1a2b3c4d/../../etc", "", "a.mp4"):
        assert clip_path(tmp_path, bad) is None
    assert clip_path(tmp_path, "20261129T071846Z-1a2b3c4d") == tmp_path / "20261129T071846Z-1a2b3c4d.mp4"


def test_an_encoder_that_stops_reading_drops_clip_frames_and_never_stalls_the_pipeline(
    visit: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], tmp_path: Path
) -> None:
    sink = ClipSink(tmp_path / "clips")
    clips = ClipsConfig(enabled=True, pre_s=PRE_S, post_s=POST_S, fps=10)
    pipeline = Pipeline(config(visit, yolo_labels, clips, realtime=False, loop=True), yolo_loaded, sink)
    pipeline.start()
    stopped: int | None = None
    try:
        recorder = lambda: pipeline.tracking.clips  # noqa: E731
        encoding = lambda: (r := recorder()) is not None and r.encoder_pid is not None  # noqa: E731
        wait_until(encoding, "a clip's encoder", timeout=120)
        rec = recorder()
        assert rec is not None and rec.encoder_pid is not None
        stopped = rec.encoder_pid
        os.kill(stopped, signal.SIGSTOP)  # ffmpeg stops reading: its pipe fills, the writer blocks
        done = sink.count()
        frames = 2 * (BEFORE + CROSSING + AFTER)  # twice round the video, the encoder stopped all along
        wait_until(lambda: sink.count() >= done + frames, "results with the encoder stopped", timeout=120)
        assert rec.dropped > 0 and pipeline.status().steps["clips"]["frames_dropped"] == rec.dropped
        rec.stop(timeout=0.5)  # (the pipeline's stop does this with 5 s to finish the clip)
        assert not rec._thread.is_alive() and rec.failed == 1  # the stuck encoder killed, its clip lost
        with pytest.raises(ProcessLookupError):
            os.kill(stopped, 0)
        stopped = None
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        pipeline.stop(timeout=30)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            "track: {}\n    source: {type: mqtt, topic: t}\n    preprocess: {type: series}\n",
            "clips need pictures: a video source, not mqtt",
        ),
        ("source: {type: video, uri: /srv/v.mp4}\n", "clips follow tracked objects: turn tracking on"),
    ],
)
def test_clips_where_they_cannot_work_are_refused_at_their_line(
    tmp_path: Path, lines: str, message: str
) -> None:
    text = (
        "device: {id: box-1}\n"
        "pipelines:\n"
        "  - name: cam\n"
        "    model: {path: /srv/m.onnx}\n"
        "    postprocess: {type: detection}\n"
        f"    {lines}"
        "    clips:\n"
        "      enabled: true\n"
    )
    path = write(tmp_path, text)
    line = text.splitlines().index("      enabled: true") + 1
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"{path}:{line}: pipelines[0].clips.enabled: {message}" in str(caught.value)


def test_without_ffmpeg_the_pipeline_runs_on_without_clips_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no ffmpeg to be found
    recorder = ClipRecorder("faces", tmp_path / "clips" / "faces", ClipsConfig(enabled=True))
    try:
        events: list[dict[str, Any]] = [{"type": "new", "at": "x", "object": {"id": 1}}]
        recorder.frame(np.zeros((36, 64, 3), np.uint8), 1000.0, events)
        assert "clip" not in events[0]
        status = recorder.status()
        why = "no ffmpeg on PATH: clips need ffmpeg with libx264 (install ffmpeg)"
        assert status["encoder"] == f"unavailable: {why}"
        assert status["recording"] is None
        assert "pipeline faces: no event clips: no ffmpeg on PATH" in caplog.text
    finally:
        recorder.stop()


def test_an_encoder_that_dies_costs_its_clip_and_the_next_clip_is_written(
    visit: Path, yolo_loaded: LoadedModel, yolo_labels: list[str], tmp_path: Path
) -> None:
    sink = ClipSink(tmp_path / "clips")
    # post_s 0.2: each time round the video the clip closes before the face comes again
    clips = ClipsConfig(enabled=True, pre_s=PRE_S, post_s=0.2, fps=10)
    pipeline = Pipeline(config(visit, yolo_labels, clips, realtime=False, loop=True), yolo_loaded, sink)
    pipeline.start()
    try:
        recorder = lambda: pipeline.tracking.clips  # noqa: E731
        encoding = lambda: (r := recorder()) is not None and r.encoder_pid is not None  # noqa: E731
        wait_until(encoding, "a clip's encoder", timeout=60)
        rec = recorder()
        assert rec is not None and rec.encoder_pid is not None
        os.kill(rec.encoder_pid, signal.SIGKILL)
        failed_then_written = lambda: rec.failed >= 1 and rec.clips >= 1  # noqa: E731
        wait_until(failed_then_written, "a failed clip, then a written one", timeout=60)
        assert "ffmpeg failed" in (rec.last_error or "")
        written = sorted(p.name for p in (tmp_path / "clips" / "faces").iterdir())
        assert len(written) == rec.clips and all(name.endswith(".mp4") for name in written)
    finally:
        pipeline.stop(timeout=30)


def test_a_stage_without_clips_ends_the_recorder(visit: Path, yolo_labels: list[str], tmp_path: Path) -> None:
    sink = ClipSink(tmp_path / "clips")
    tracking = PipelineTracking("faces", sink)
    with_clips = config(visit, yolo_labels, ClipsConfig(enabled=True))
    recorder = tracking.clip_recorder(with_clips)
    assert recorder is not None and tracking.clip_recorder(with_clips) is recorder  # one per pipeline
    tracking.frame(config(visit, yolo_labels, ClipsConfig()), {"detections": []}, 1000.0, None, None)
    assert tracking.clips is None and not recorder._thread.is_alive()
