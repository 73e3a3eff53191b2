"""LatestFrameSlot and VideoSource with real videos decoded by OpenCV. Every wait is bounded."""

from __future__ import annotations

import itertools
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.config import VideoSourceConfig
from agent.sources import Frame, LatestFrameSlot, VideoSource, redact_uri
from tests import media_fixtures
from tests.waits import free_port, wait_until

short_video = media_fixtures.short_video  # 30 frames at 20 fps: 1.5 s

SHORT_FRAMES, SHORT_FPS = 30, 20.0


def _frame(index: int) -> Frame:
    return Frame(data=np.full((2, 2, 3), index % 256, np.uint8), index=index, captured_at=time.time())


def _source(uri: str | Path, **kwargs: object) -> tuple[VideoSource, LatestFrameSlot]:
    config = VideoSourceConfig(type="video", uri=str(uri), **kwargs)  # type: ignore[arg-type]
    slot = LatestFrameSlot()
    return VideoSource(config, "cam", slot), slot


def _drain(source: VideoSource, slot: LatestFrameSlot, timeout: float, delay: float = 0.0) -> list[Frame]:
    """Read frames until the slot closes (the source ended) or `timeout`; sleep `delay` after each."""
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = slot.get(timeout=0.2)
        if frame is None:
            if slot.closed:
                break
            continue
        frames.append(frame)
        if delay:
            time.sleep(delay)
    return frames


# --- LatestFrameSlot -----------------------------------------------------------------------------


def test_slot_keeps_only_newest_and_counts_drops() -> None:
    slot = LatestFrameSlot()
    for i in range(1, 6):
        slot.put(_frame(i))
    assert slot.dropped == 4
    frame = slot.get(timeout=30.0)
    assert frame is not None and frame.index == 5
    slot.put(_frame(6))
    assert slot.dropped == 4  # the slot was empty: nothing was dropped
    got = slot.get(timeout=30.0)
    assert got is not None and got.index == 6


def test_slot_get_times_out_with_none() -> None:
    slot = LatestFrameSlot()
    started = time.monotonic()
    assert slot.get(timeout=0.1) is None
    elapsed = time.monotonic() - started
    assert 0.09 <= elapsed < 10.0  # waited its timeout, and then returned (generous for a busy machine)


def test_slot_wakes_a_blocked_reader_on_put() -> None:
    slot = LatestFrameSlot()
    timer = threading.Timer(0.05, slot.put, args=(_frame(1),))
    timer.start()
    try:
        started = time.monotonic()
        frame = slot.get(timeout=60.0)
        assert frame is not None and frame.index == 1
        # Woken by the put: a reader the put did not wake would sit out the whole 60 s.
        assert time.monotonic() - started < 30.0
    finally:
        timer.cancel()


def test_slot_close_wakes_a_blocked_reader() -> None:
    slot = LatestFrameSlot()
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(slot.get(timeout=60.0)), daemon=True)
    started = time.monotonic()
    reader.start()
    waiters = slot._cond._waiters  # type: ignore[attr-defined]
    assert wait_until(lambda: len(waiters) == 1, "the reader blocked in get")
    slot.close()
    reader.join(timeout=30.0)
    assert not reader.is_alive()
    assert result == [None]
    # Woken by the close: a reader it did not wake would sit out the whole 60 s.
    assert time.monotonic() - started < 30.0
    assert slot.closed


def test_slot_close_returns_what_is_left_then_none() -> None:
    slot = LatestFrameSlot()
    slot.put(_frame(1))
    slot.close()
    frame = slot.get(timeout=30.0)
    assert frame is not None and frame.index == 1
    started = time.monotonic()
    assert slot.get(timeout=60.0) is None
    assert time.monotonic() - started < 30.0  # closed and empty: no waiting (else the whole 60 s)


# --- redact_uri ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("rtsp://user:secret@127.0.0.1:1/x", "rtsp://user:***@127.0.0.1:1/x"),
        ("rtsp://admin:p%40ss@cam.local/stream?ch=1#f", "rtsp://admin:***@cam.local/stream?ch=1#f"),
        ("http://u:p@w@host:8080/video.mjpg", "http://u:***@host:8080/video.mjpg"),
        ("rtsp://user:secret@[fe80::1]:554/x", "rtsp://user:***@[fe80::1]:554/x"),
        ("rtsp://user:secret@[::1]/x", "rtsp://user:***@[::1]/x"),
        ("rtsp://onlyuser@cam/x", "rtsp://onlyuser@cam/x"),
        ("http://cam.local/video.mjpg", "http://cam.local/video.mjpg"),
        ("/srv/videos/a:b@c.mp4", "/srv/videos/a:b@c.mp4"),
        ("0", "0"),
        ("/dev/video2", "/dev/video2"),
    ],
)
def test_redact_uri(uri: str, expected: str) -> None:
    assert redact_uri(uri) == expected


def test_redact_uri_with_a_bad_port_still_hides_the_password() -> None:
    redacted = redact_uri("rtsp://user:secret@cam:99999/x")
    assert "secret" not in redacted
    assert redacted == "rtsp://user:***@cam:99999/x"


# --- VideoSource on files ------------------------------------------------------------------------


def test_file_plays_at_its_rate_and_finishes(short_video: tuple[Path, list], sources: list) -> None:
    path, _ = short_video
    source, slot = _source(path)
    sources.append(source)
    assert source.kind == "file" and source.state == "starting"
    started = time.monotonic()
    source.start()
    frames = _drain(source, slot, timeout=60)
    elapsed = time.monotonic() - started
    assert slot.closed
    assert wait_until(lambda: source.state == "finished", timeout=30)
    stats = source.stats()
    assert stats.state == "finished" and stats.error is None
    assert stats.counters.frames_decoded == SHORT_FRAMES
    assert stats.counters.frames_skipped_by_fps == 0
    assert len(frames) + slot.dropped == SHORT_FRAMES
    assert len(frames) >= SHORT_FRAMES * 0.7  # a fast reader sees (almost) every frame
    # Paced like a camera: not faster than the file's duration (it sleeps), not wildly slower (the
    # upper bound is generous for a busy machine: it only catches a pace off by 20x and more).
    duration = SHORT_FRAMES / SHORT_FPS
    assert 0.85 <= elapsed / duration < 20.0
    indices = [f.index for f in frames]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    for frame in frames:
        assert frame.data.shape == (80, 320, 3) and frame.data.dtype == np.uint8
        assert frame.position_s == pytest.approx((frame.index - 1) / SHORT_FPS, abs=1e-6)
    captured = [f.captured_at for f in frames]
    assert captured == sorted(captured)
    assert (captured[-1] - captured[0]) / ((frames[-1].index - frames[0].index) / SHORT_FPS) >= 0.85
    source.stop(timeout=30)
    assert source.state == "finished"  # stop after the end keeps the outcome


def test_fps_cap_reduces_delivered_frames(short_video: tuple[Path, list], sources: list) -> None:
    path, _ = short_video
    source, slot = _source(path, fps=5)
    sources.append(source)
    source.start()
    frames = _drain(source, slot, timeout=60)
    assert wait_until(lambda: source.state == "finished", timeout=30)
    stats = source.stats()
    handed = len(frames) + slot.dropped
    assert stats.counters.frames_decoded == SHORT_FRAMES
    assert stats.counters.frames_skipped_by_fps == SHORT_FRAMES - handed
    # 20 fps file capped at 5 fps: about a quarter of the frames reach the model.
    assert 0.2 <= handed / SHORT_FRAMES <= 0.34
    positions = [f.position_s for f in frames]
    assert all(p is not None for p in positions)
    gaps = np.diff(np.array(positions, dtype=float))
    assert (gaps >= 0.2 - 1e-6).all()  # never more often than the cap, on the video's timeline


# A rate no file plays at when its own rate (or a folder's fps) is replaced by the 25 fallback.
FAST_FRAMES, FAST_RATE = 600, 100.0


def _play_whole(source: VideoSource, slot: LatestFrameSlot) -> tuple[int, float]:
    """Play `source` to its end: (frames handed to the model, seconds from start to end)."""
    started = time.monotonic()
    source.start()
    frames = _drain(source, slot, timeout=120)  # the 25 fallback would take 24 s for 600 frames
    assert wait_until(lambda: source.state == "finished", timeout=60)
    elapsed = time.monotonic() - started
    return len(frames) + slot.dropped, elapsed


def test_a_1000_fps_file_with_fps_1000_plays_at_its_rate_not_25(tmp_path: Path, sources: list) -> None:
    """fps is a cap for files, which play at their own rate: a high-speed clip recorded at 1000 fps
    (the config's maximum) plays at up to 1000 frames a second, every frame handed on."""
    path = tmp_path / "fast.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 1000.0, (64, 48))
    for i in range(FAST_FRAMES):
        writer.write(np.full((48, 64, 3), i % 256, np.uint8))
    writer.release()
    probe = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    assert probe.get(cv2.CAP_PROP_FPS) == 1000.0  # the file says so
    probe.release()
    source, slot = _source(path, fps=1000)
    sources.append(source)
    handed, elapsed = _play_whole(source, slot)
    stats = source.stats()
    assert (
        stats.counters.frames_decoded == handed == FAST_FRAMES and stats.counters.frames_skipped_by_fps == 0
    )
    # Paced at 1000/s it takes 0.6 s; not faster than the file (it sleeps), far faster than 25/s.
    assert elapsed >= FAST_FRAMES / 1000.0 * 0.85
    assert FAST_FRAMES / elapsed > FAST_RATE, f"{FAST_FRAMES} frames took {elapsed:.2f} s"


def test_an_image_folder_with_fps_1000_plays_that_fast(tmp_path: Path, sources: list) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(FAST_FRAMES):
        assert cv2.imwrite(str(folder / f"f{i:04d}.png"), np.full((48, 64, 3), i % 256, np.uint8))
    source, slot = _source(folder, fps=1000)
    sources.append(source)
    assert source.kind == "folder"
    handed, elapsed = _play_whole(source, slot)
    assert source.stats().counters.frames_decoded == handed == FAST_FRAMES
    assert FAST_FRAMES / elapsed > FAST_RATE, f"{FAST_FRAMES} images took {elapsed:.2f} s"


def test_loop_keeps_going_past_the_end(tmp_path: Path, sources: list) -> None:
    path = tmp_path / "tiny.mp4"
    media_fixtures.demo_video_module().make_orientation_video(path, fps=30, seconds_per_sign=0.1)
    total = 18  # 6 signs x 3 frames
    source, slot = _source(path, loop=True)
    sources.append(source)
    source.start()
    frames: list[Frame] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and source.stats().counters.frames_decoded < 2.5 * total:
        frame = slot.get(timeout=0.2)
        if frame is not None:
            frames.append(frame)
    assert source.stats().counters.frames_decoded >= 2.5 * total
    assert source.state == "streaming"
    assert not slot.closed
    indices = [f.index for f in frames]
    assert indices == sorted(indices) and max(indices) > 2 * total  # frame numbers keep counting
    positions = [f.position_s for f in frames]
    assert any(b < a for a, b in itertools.pairwise(positions))  # rewound to the start
    assert max(p for p in positions if p is not None) < total / 30.0
    started = time.monotonic()
    source.stop(timeout=30)
    # The looping reader heard the stop: one that did not would keep the whole 30 s (and stay alive).
    assert time.monotonic() - started < 15.0
    assert source._thread is not None and not source._thread.is_alive()
    assert source.state == "stopped"
    assert slot.closed


def test_slow_consumer_gets_newest_frames_only(short_video: tuple[Path, list], sources: list) -> None:
    path, _ = short_video
    source, slot = _source(path)
    sources.append(source)
    source.start()
    frames = _drain(source, slot, timeout=60, delay=0.2)  # a model 4x slower than the camera
    assert wait_until(lambda: source.state == "finished", timeout=30)
    assert len(frames) + slot.dropped == SHORT_FRAMES  # nothing queued, nothing lost untracked
    assert slot.dropped >= SHORT_FRAMES / 2
    assert source.stats().frames_dropped == slot.dropped
    assert len(frames) < SHORT_FRAMES / 2
    indices = [f.index for f in frames]
    assert indices == sorted(indices)
    assert np.mean(np.diff(indices)) > 2  # it skips ahead to newer frames
    assert indices[-1] == SHORT_FRAMES  # the very last frame is still delivered
    # The slot never holds more than one frame: once closed, one get empties it for good.
    assert slot.get(timeout=0.5) is None


@pytest.mark.slow
def test_realtime_off_gives_a_slow_consumer_every_frame_in_order(
    short_video: tuple[Path, list], sources: list
) -> None:
    """A recording analysed: decoded just ahead of a model 4x slower than the file's rate, nothing
    dropped, nothing decoded beyond what the model took (and the one waiting for it)."""
    path, _ = short_video
    source, slot = _source(path, realtime=False)
    sources.append(source)
    source.start()
    frames = _drain(source, slot, timeout=60, delay=0.2)
    assert wait_until(lambda: source.state == "finished", timeout=30)
    assert [f.index for f in frames] == list(range(1, SHORT_FRAMES + 1))
    assert slot.dropped == 0 and source.stats().frames_dropped == 0
    positions = [f.position_s for f in frames]
    assert positions == pytest.approx([i / 20 for i in range(SHORT_FRAMES)], abs=1e-3)  # the file's timeline


def test_realtime_off_keeps_the_decoder_one_frame_ahead(
    short_video: tuple[Path, list], sources: list
) -> None:
    path, _ = short_video
    source, slot = _source(path, realtime=False)
    sources.append(source)
    source.start()
    assert wait_until(lambda: len(slot) == 1, timeout=30)
    decoded = source.stats().counters.frames_decoded
    first = slot.get(timeout=5)  # the model takes one: the next is decoded, then it waits again
    assert first is not None and first.index == 1
    assert wait_until(
        lambda: source.stats().counters.frames_decoded == decoded + 1 and len(slot) == 1, timeout=30
    )
    assert source.stats().counters.frames_decoded == decoded + 1 == 2


@pytest.mark.parametrize(
    "uri", ["rtsp://127.0.0.1:8554/cam", "0", "/dev/video2", "gst:videotestsrc ! appsink"]
)
def test_realtime_off_is_refused_for_a_live_source(uri: str) -> None:
    with pytest.raises(
        ValueError, match=r"realtime: false is for video files and image folders; .* is a live"
    ):
        VideoSourceConfig(type="video", uri=uri, realtime=False)


def test_slot_holds_one_frame_while_nobody_reads(short_video: tuple[Path, list], sources: list) -> None:
    path, _ = short_video
    source, slot = _source(path)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.state == "finished", timeout=60)
    assert slot.dropped == SHORT_FRAMES - 1
    last = slot.get(timeout=30.0)
    assert last is not None and last.index == SHORT_FRAMES
    assert slot.get(timeout=0.5) is None


def test_missing_file_retries_with_backoff_and_stops_promptly(
    tmp_path: Path, sources: list, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "nope.mp4"
    source, slot = _source(missing, reopen_min_s=0.05, reopen_max_s=0.2)
    sources.append(source)
    attempts: list[float] = []
    real_open = source._open

    def counting_open():  # type: ignore[no-untyped-def]
        attempts.append(time.monotonic())
        return real_open()

    source._open = counting_open  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="agent.sources.video")
    source.start()
    assert wait_until(lambda: len(attempts) >= 10, timeout=30)
    stats = source.stats()
    assert stats.state == "retrying"
    assert stats.error == f"video file {missing} does not exist"
    assert source.outage_started is not None
    gaps = np.diff(attempts[:10])
    # Delays double from 0.05 s and are capped at 0.2 s (waits never end early; they may run late).
    assert gaps[0] >= 0.045 and gaps[1] >= 0.09
    assert (gaps[2:] >= 0.18).all()
    # Capped: uncapped doubling would make these six 0.4, 0.8, ... 12.8 s. The least late of six
    # waits, so a busy machine that makes some of them late does not matter.
    assert gaps[3:].min() < 0.4
    # The same error is logged once, not once per attempt.
    assert sum("does not exist" in r.getMessage() for r in caplog.records) == 1
    started = time.monotonic()
    source.stop(timeout=30)
    stopped = time.monotonic()
    # Promptly: the backoff wait is cut short (a stop it did not hear would keep the whole 30 s).
    assert stopped - started < 15.0
    assert source._thread is not None and not source._thread.is_alive()
    assert source.state == "stopped"
    assert source.stats().error == f"video file {missing} does not exist"
    assert slot.closed and slot.get(timeout=0.1) is None
    assert source.stats().reconnects == len(attempts)  # every failed open is counted in status
    # No attempt after the stop: `_open` runs on the source's thread only, and that thread has ended
    # (joined by stop, checked above), so none can come after it returned.
    assert attempts[-1] < stopped, (stopped, attempts[-3:])


def test_refused_url_retries_with_clear_error(sources: list) -> None:
    port = free_port()
    uri = f"http://127.0.0.1:{port}/x.mjpg"
    source, slot = _source(uri, reopen_min_s=0.05, reopen_max_s=0.2)
    sources.append(source)
    assert source.kind == "url"
    source.start()
    assert wait_until(lambda: source.state == "retrying", timeout=30)
    stats = source.stats()
    # Why, too (agent/sources/diagnose.py): nobody listens on that port.
    refused = f"connection refused by 127.0.0.1:{port}: nothing listens there (wrong port, or service off)"
    assert stats.error == f"cannot open url source {uri}: {refused}"
    assert stats.counters.frames_decoded == 0
    assert slot.get(timeout=0.05) is None
    started = time.monotonic()
    source.stop(timeout=30)
    # Promptly: a stop it did not hear would keep the whole 30 s (and leave the thread alive).
    assert time.monotonic() - started < 15.0
    assert source._thread is not None and not source._thread.is_alive()
    assert source.state == "stopped"


def test_refused_url_does_not_leak_the_password(sources: list, caplog: pytest.LogCaptureFixture) -> None:
    uri = "rtsp://user:secret@127.0.0.1:1/x"
    caplog.set_level(logging.DEBUG, logger="agent.sources.video")
    source, _ = _source(uri, reopen_min_s=0.05, reopen_max_s=0.2)
    sources.append(source)
    assert source.display_uri == "rtsp://user:***@127.0.0.1:1/x"
    source.start()
    assert wait_until(lambda: source.state == "retrying", timeout=30)
    stats = source.stats()
    assert stats.error == (
        "cannot open url source rtsp://user:***@127.0.0.1:1/x: connection refused by 127.0.0.1:1: "
        "nothing listens there (wrong port, or service off)"
    )
    assert "secret" not in repr(stats)
    source.stop(timeout=30)
    assert "secret" not in repr(source.stats())
    assert caplog.records, "the failure is logged"
    assert all("secret" not in r.getMessage() for r in caplog.records)


def test_a_file_system_error_is_retried_not_fatal(tmp_path: Path) -> None:
    # A path too long for the file system makes the existence check itself raise (ENAMETOOLONG).
    uri = str(tmp_path / ("x" * 5000 + ".mp4"))
    config = VideoSourceConfig(type="video", uri=uri, reopen_min_s=0.05, reopen_max_s=0.1)
    source = VideoSource(config, "long-name", LatestFrameSlot())
    source.start()
    try:
        assert wait_until(lambda: source.stats().reconnects >= 3, timeout=30)
        stats = source.stats()
        assert stats.state == "retrying"
        assert "unexpected error reading" in str(stats.error) and "File name too long" in str(stats.error)
    finally:
        source.stop(timeout=30)
    assert source.state == "stopped"


def test_backoff_doubles_is_capped_and_never_overflows() -> None:
    from agent.retry import backoff_delay

    assert [backoff_delay(n, 1.0, 30.0) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(0, 0.5, 10.0) == 0.5
    assert backoff_delay(10**6, 10.0, 600.0) == 600.0  # a pipeline retried for months


# --- image folders -----------------------------------------------------------------------------------


def test_image_folder_plays_in_name_order_at_fps_and_skips_bad_files(tmp_path: Path, sources: list) -> None:
    folder = tmp_path / "frames"
    media_fixtures.sign_folder(folder, 4)
    (folder / "frame-001b.jpg").write_bytes(b"not a jpeg")  # sorts between 1 and 2: skipped
    (folder / "notes.txt").write_text("not an image at all")  # not an image suffix: ignored
    # 4 a second: the reader would miss one (the slot keeps the newest) only if 0.25 s late.
    source, slot = _source(folder, fps=4)
    sources.append(source)
    assert source.kind == "folder"
    source.start()
    frames = _drain(source, slot, timeout=60)
    assert [f.index for f in frames] == [1, 2, 3, 4]
    assert [f.position_s for f in frames] == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert all(f.data.shape == (80, 320, 3) for f in frames)
    assert source.state == "finished" and source.stats().counters.frames_decoded == 4


def test_an_empty_image_folder_is_retried_with_a_clear_error(tmp_path: Path, sources: list) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    source, _ = _source(folder, reopen_min_s=0.05, reopen_max_s=0.2)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.state == "retrying", timeout=30)
    assert source.stats().error.startswith(f"image folder {folder} has no images (")
    media_fixtures.sign_folder(folder / "late", 1)  # images in a subfolder do not count
    assert wait_until(lambda: source.stats().reconnects >= 3, timeout=30)
    assert source.state == "retrying"


# --- HTTP: MJPEG from ffmpeg, and a URL that is no stream ---------------------------------------


def test_http_mjpeg_stream_from_ffmpeg(short_video: tuple[Path, list], sources: list) -> None:
    path, _ = short_video
    port = free_port()
    url = f"http://127.0.0.1:{port}/cam.mjpg"
    server = subprocess.Popen(
        ["ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", str(path),
         "-f", "mpjpeg", "-q:v", "5", "-listen", "1", url],
    )  # fmt: skip
    try:
        source, slot = _source(url, reopen_min_s=0.2, reopen_max_s=0.5)
        sources.append(source)
        source.start()
        frames = []
        deadline = time.monotonic() + 60
        while len(frames) < 10 and time.monotonic() < deadline:
            frame = slot.get(timeout=0.5)
            if frame is not None:
                frames.append(frame)
        assert len(frames) == 10, source.stats()
        assert source.state == "streaming" and source.kind == "url"
        assert all(f.position_s is None for f in frames)  # live: no position in a file
        assert all(f.data.shape == (80, 320, 3) for f in frames)
        assert len({f.index for f in frames}) == 10
    finally:
        server.kill()
        server.wait(30)


def test_a_url_that_serves_a_web_page_is_not_a_stream(tmp_path: Path, sources: list) -> None:
    (tmp_path / "index.html").write_text("<html><body>camera admin page</body></html>")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _listening(port), timeout=60)
        url = f"http://127.0.0.1:{port}/index.html"
        source, slot = _source(url, reopen_min_s=0.1, reopen_max_s=0.3)
        sources.append(source)
        source.start()
        assert wait_until(lambda: source.stats().reconnects >= 2, timeout=60), source.stats()
        assert source.state == "retrying" and slot.get(timeout=0.05) is None
        not_video = "the camera answers (HTTP 200 OK) but no stream could be decoded (text/html)"
        errors = (f"cannot open url source {url}: {not_video}: OpenCV could not decode it as video",
                  f"{url} stopped delivering frames")  # fmt: skip
        assert source.stats().error in errors
    finally:
        server.kill()
        server.wait(30)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
