"""Live audio through ALSA for real: arecord (alsa-utils) records from an ALSA device defined in an
asoundrc, the `file` plugin playing recorded speech as its capture data (this machine has no sound
card; ALSA's own configuration is how one makes a capture device without one). The source reads
arecord's PCM, cuts windows and hands them on exactly; a device that does not exist, a recorder
that dies mid-stream and a missing arecord are clear errors, retried, and counted as outages.

ALSA's file plugin delivers as fast as it is read (no sound-card clock), so these tests take the
first windows, which a queue big enough keeps in order, rather than a whole paced recording."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from agent.config import AudioSourceConfig, PipelineConfig
from agent.pipeline import Pipeline
from agent.sources import AudioSource, Frame, FrameQueue
from agent.stage import LoadedModel
from providers import ModelArtifact, get_backend
from tests.media_fixtures import ListSink, silero
from tests.waits import wait_until

RATE = 16000


@pytest.fixture
def alsa_speech(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """ALSA device `speech` captures a known 16 kHz recording (a chirp with pauses); returns its samples."""
    t = np.arange(3 * RATE) / RATE
    chirp = np.sin(2 * np.pi * (200 + 300 * t) * t) * 0.4
    chirp[RATE : RATE + RATE // 2] = 0.0  # a pause, so windows differ from each other
    samples = (chirp * 32767).astype("<i2")
    raw = tmp_path / "speech.raw"
    raw.write_bytes(samples.tobytes())
    asoundrc = tmp_path / "asoundrc"
    asoundrc.write_text(
        f'pcm.speech {{ type file; slave.pcm "null"; file "/dev/null"; infile "{raw}"; format "raw" }}\n'
    )
    monkeypatch.setenv("ALSA_CONFIG_PATH", f"/usr/share/alsa/alsa.conf:{asoundrc}")  # arecord inherits it
    return samples.astype(np.float32) / 32768


def _capture(device: str, **settings: Any) -> tuple[AudioSource, FrameQueue]:
    config = AudioSourceConfig.model_validate(
        {"type": "audio", "uri": f"alsa:{device}", "reopen_min_s": 0.05, "reopen_max_s": 0.2, **settings}
    )
    queue = FrameQueue(config.max_queue)
    return AudioSource(config, "mic", queue), queue


def _take(queue: FrameQueue, count: int, timeout: float = 60.0) -> list[Frame]:
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count and time.monotonic() < deadline:
        frame = queue.get(timeout=0.1)
        if frame is not None:
            frames.append(frame)
    return frames


def _arecord() -> psutil.Process:
    found = [p for p in psutil.Process().children(recursive=True) if p.name() == "arecord"]
    assert len(found) == 1, found
    return found[0]


def test_windows_from_an_alsa_device_are_the_recorded_samples_in_order(
    alsa_speech: np.ndarray, sources: list[AudioSource]
) -> None:
    source, queue = _capture("speech", window=512, hop=256, max_queue=20_000)
    sources.append(source)
    source.start()
    frames = _take(queue, 150)  # 150 windows at hop 256: the first 2.4 s
    assert len(frames) == 150
    assert [f.index for f in frames] == list(range(1, 151))  # none skipped
    assert [f.gap for f in frames[:2]] == [True, False]  # a new stream: recurrent state starts afresh
    for frame in frames:
        start = (frame.index - 1) * 256
        assert np.array_equal(frame.data, alsa_speech[start : start + 512]), frame.index
    stats = source.stats()
    assert source.kind == "audio-capture" and stats.state == "streaming" and stats.error is None
    assert _arecord().cmdline()[1:] == ["-D", "speech", "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", "16000"]


def test_a_device_that_does_not_exist_is_named_retried_and_never_streams(sources: list[AudioSource]) -> None:
    source, _ = _capture("hw:9,0")
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.stats().reconnects >= 3, "retries", timeout=60)
    stats = source.stats()
    assert stats.state == "retrying" and stats.counters.windows == 0
    assert "audio capture from ALSA device 'hw:9,0': arecord exited with status 1" in stats.error
    assert "audio open error" in stats.error  # arecord's own reason


def test_a_recorder_that_dies_is_an_outage_and_capture_resumes(
    alsa_speech: np.ndarray, sources: list[AudioSource], caplog: pytest.LogCaptureFixture
) -> None:
    source, _ = _capture("speech", window=512, max_queue=50)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.state == "streaming", timeout=30)
    first = _arecord()
    first.kill()  # as when a USB microphone is pulled out: arecord ends
    assert wait_until(lambda: source.stats().outages == 1, "outage counted", timeout=30, state=source.stats)
    stats = source.stats()
    assert stats.reconnects >= 1 and stats.state == "streaming" and stats.error is None
    assert _arecord().pid != first.pid
    assert "audio capture from ALSA device 'speech': arecord was killed by signal 9" in caplog.text
    windows = stats.counters.windows
    assert wait_until(
        lambda: source.stats().counters.windows > windows, "windows after the outage", timeout=30
    )


def test_without_arecord_the_error_says_what_to_install(
    alsa_speech: np.ndarray, sources: list[AudioSource], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    source, _ = _capture("speech")
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.stats().reconnects >= 2, timeout=30)
    assert source.stats().error == "arecord is not installed (apt-get install alsa-utils)"
    monkeypatch.setenv("PATH", os.defpath)  # installed meanwhile: the retry finds it
    assert wait_until(lambda: source.state == "streaming", timeout=30, state=source.stats)


def test_a_pipeline_runs_the_vad_on_live_capture_and_counts_what_it_cannot_keep(
    alsa_speech: np.ndarray,
) -> None:
    """The sound card outpaces nothing in life; here ALSA's file plugin outpaces the model, so the
    bounded queue drops the oldest windows and says how many."""
    config = PipelineConfig.model_validate(
        {
            "name": "mic",
            "model": {"name": "silero-vad", "version": "6.2.3"},
            "source": {"type": "audio", "uri": "alsa:speech", "window": 512, "max_queue": 100},
            "preprocess": {"type": "audio", "context": 64, "constants": {"sr": RATE}},
            "state": [{"input": "state", "output": "stateN"}],
            "postprocess": {"type": "threshold", "on_score": 0.5, "off_score": 0.35},
        }
    )
    session = get_backend("onnxruntime/CPUExecutionProvider").load(
        ModelArtifact(silero("silero_vad.onnx"), "onnx", "0" * 64)
    )
    sink = ListSink()
    pipeline = Pipeline(config, LoadedModel("silero-vad", "6.2.3", "ab" * 32, session), sink)
    pipeline.start()
    try:
        # Wait for the drops too (not a fixed window of time): the file plugin outpaces the model.
        assert wait_until(
            lambda: sink.count() >= 50 and pipeline.status().source.frames_dropped > 0,
            "results and dropped windows",
            timeout=60,
            state=pipeline.status,
        )
        status = pipeline.status()
    finally:
        pipeline.stop(timeout=30)
        session.close()
    assert status.source.state == "streaming" and status.source.frames_dropped > 0
    assert status.counts.inferences >= 50 and status.counts.errors == 0
    first = sink.results[0][1]
    assert set(first["output"]) == {"active", "score", "event"} and 0.0 <= first["output"]["score"] <= 1.0
