"""Audio for real: speech made by espeak-ng with silences between, read from a WAV at 22050 Hz,
resampled to 16 kHz, cut into 32 ms windows, through the real silero VAD model with its recurrent
state fed back window to window, and a hysteresis threshold: speech start/end events where the
speech is (within 0.3 s of the energy ground truth), on onnxruntime and on OpenVINO (with the
silero variant OpenVINO reads). Plus the audio reader, the window queue and bad input."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import AudioSourceConfig, PipelineConfig, ReportConfig
from agent.config_loader import parse_config
from agent.errors import ConfigError, EdgeAgentError, ModelError
from agent.pipeline import Pipeline
from agent.processing.feed import build_feeder
from agent.sources import AudioSource, FrameQueue, read_wav
from agent.stage import LoadedModel
from providers import ModelArtifact, TensorSpec, get_backend
from tests import media_fixtures
from tests.cpu_precision import exact_options
from tests.media_fixtures import ListSink, silero, write_wav
from tests.waits import wait_until

speech_wav = media_fixtures.speech_wav
TOLERANCE_S = 0.3


def _vad_pipeline(uri: Path, model: str, **preprocess: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "speech",
            "model": {"name": "silero-vad", "version": "6.2.3"},
            "source": {"type": "audio", "uri": str(uri), "window": 512, "realtime": False},
            "preprocess": {"type": "audio", "context": 64, **preprocess},
            "state": [{"input": "state", "output": "stateN"}],
            "postprocess": {"type": "threshold", "on_score": 0.5, "off_score": 0.35},
            "report": ReportConfig(on_change=True).model_dump(),
        }
    )


@pytest.mark.parametrize(
    ("backend", "model", "constants"),
    [
        ("onnxruntime/CPUExecutionProvider", "silero_vad.onnx", {"sr": 16000}),
        ("openvino/CPU", "silero_vad_openvino_16k.onnx", {}),  # OpenVINO cannot read the If-node variant
    ],
)
def test_speech_start_and_end_events_where_the_speech_is(
    speech_wav: tuple[Path, list[tuple[float, float]]], backend: str, model: str, constants: dict[str, int]
) -> None:
    path, truth = speech_wav
    assert len(truth) == 2, truth  # two sentences (the comma pause is under 320 ms)
    # f32 on every backend: the events' timing is the point, not bf16 on some CPUs.
    session = get_backend(backend).load(
        ModelArtifact(silero(model), "onnx", "0" * 64), exact_options(backend)
    )
    sink = ListSink()
    config = _vad_pipeline(path, model, constants=constants)
    pipeline = Pipeline(config, LoadedModel("silero-vad", "6.2.3", "ab" * 32, session), sink)
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, timeout=120, interval=0.05)
    finally:
        pipeline.stop(timeout=30)
        session.close()

    status = pipeline.status()
    windows = int(status.source.counters.windows)
    assert windows == (len(read_wav(path, 16000)) - 512) // 512 + 1  # every full window of the file
    assert status.counts.inferences == windows and status.source.frames_dropped == 0  # lossless
    results = [r for _, r in sink.results]
    events = [(r["output"]["event"], r["source"]["position_s"]) for r in results if r["output"]["event"]]
    starts = [t for kind, t in events if kind == "start"]
    ends = [t for kind, t in events if kind == "end"]
    assert [kind for kind, _ in events] == ["start", "end"] * (len(events) // 2), events  # alternating
    for begin, finish in truth:  # each sentence starts and ends with an event near it
        assert any(abs(t - begin) <= TOLERANCE_S for t in starts), (begin, events)
        assert any(abs(t - finish) <= TOLERANCE_S for t in ends), (finish, events)
    for _, t in events:  # and nothing fires in the silences
        assert any(begin - TOLERANCE_S <= t <= finish + TOLERANCE_S for begin, finish in truth), (t, events)
    # on_change: the first (idle) result, then only the changes were published.
    assert results[0]["output"] == {"active": False, "score": results[0]["output"]["score"], "event": None}
    assert len(results) == 1 + len(events)
    held = sum(int(r["held_back"]) for r in results) + pipeline.stage.rules.held_since_last
    assert held == windows - len(results)


# --- the pieces --------------------------------------------------------------------------------------


def test_read_wav_resamples_and_scales_every_pcm_width(tmp_path: Path) -> None:
    tone = np.sin(2 * np.pi * 440 * np.arange(22050) / 22050)  # 1 s at 22050 Hz
    write_wav(tmp_path / "s16.wav", (tone * 16384).astype(np.int16), 22050)
    audio = read_wav(tmp_path / "s16.wav", 16000)
    assert audio.dtype == np.float32 and len(audio) == 16000  # 1 s at the model's rate
    assert abs(float(np.abs(audio[100:-100]).max()) - 0.5) < 0.02
    spectrum = np.abs(np.fft.rfft(audio))
    assert abs(int(spectrum.argmax()) - 440) <= 1  # still 440 Hz after resampling

    write_wav(tmp_path / "u8.wav", (tone * 64 + 128).astype(np.uint8), 22050, width=1)
    assert abs(float(np.abs(read_wav(tmp_path / "u8.wav", 22050)).max()) - 0.5) < 0.02
    stereo = np.stack([(tone * 16384).astype(np.int16), np.zeros_like(tone, np.int16)], axis=1)
    write_wav(tmp_path / "stereo.wav", stereo, 22050, channels=2)
    assert np.allclose(read_wav(tmp_path / "stereo.wav", 22050), tone * 0.5, atol=1e-3)  # the first channel
    s24 = (tone * (1 << 22)).astype(np.int32)
    packed = np.stack([(s24 >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8)
    write_wav(tmp_path / "s24.wav", packed, 22050, width=3)
    assert np.allclose(read_wav(tmp_path / "s24.wav", 22050), tone * 0.5, atol=1e-4)


def test_bad_audio_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError, match=r"audio file .*missing.wav does not exist"):
        read_wav(tmp_path / "missing.wav", 16000)
    (tmp_path / "text.wav").write_text("this is not audio")
    with pytest.raises(EdgeAgentError, match=r"text.wav is not a PCM WAV file"):
        read_wav(tmp_path / "text.wav", 16000)


def _audio_source(path: Path, **settings: Any) -> tuple[AudioSource, FrameQueue]:
    config = AudioSourceConfig.model_validate({"type": "audio", "uri": str(path), **settings})
    queue = FrameQueue(config.max_queue)
    return AudioSource(config, "mic", queue), queue


def test_windows_with_hop_lose_nothing_within_the_queue_bound(
    tmp_path: Path, sources: list[AudioSource]
) -> None:
    samples = (np.arange(16000) % 1000).astype(np.int16)
    write_wav(tmp_path / "ramp.wav", samples, 16000)
    source, queue = _audio_source(tmp_path / "ramp.wav", window=400, hop=200, realtime=False, max_queue=1000)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.state == "finished", timeout=30)
    frames = []
    while (frame := queue.get(timeout=0.1)) is not None:
        frames.append(frame)
    assert len(frames) == (16000 - 400) // 200 + 1 == source.stats().counters.windows
    assert queue.dropped == 0
    assert [f.position_s for f in frames[:3]] == [0.0, 0.0125, 0.025]
    assert [f.gap for f in frames[:2]] == [True, False]
    expected = samples[200:600].astype(np.float32) / 32768
    assert np.array_equal(frames[1].data, expected)  # the second window, exactly


def test_a_full_queue_drops_the_oldest_and_counts_them(tmp_path: Path, sources: list[AudioSource]) -> None:
    write_wav(tmp_path / "tone.wav", np.zeros(16000, np.int16), 16000)
    source, queue = _audio_source(tmp_path / "tone.wav", window=160, realtime=False, max_queue=10)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.state == "finished", timeout=30)  # nobody read meanwhile
    assert queue.dropped == 100 - 10 and len(queue) == 10
    assert [queue.get(0.1).index for _ in range(10)] == list(range(91, 101))  # type: ignore[union-attr]


def test_realtime_plays_at_the_recorded_pace(tmp_path: Path, sources: list[AudioSource]) -> None:
    write_wav(tmp_path / "half.wav", np.zeros(8000, np.int16), 16000)  # 0.5 s
    source, queue = _audio_source(tmp_path / "half.wav", window=1600)
    sources.append(source)
    started = time.monotonic()
    source.start()
    assert wait_until(lambda: source.state == "finished", timeout=30)
    assert time.monotonic() - started >= 0.45 and len(queue) == 5


def test_a_missing_file_is_retried_and_reported(tmp_path: Path, sources: list[AudioSource]) -> None:
    source, _ = _audio_source(tmp_path / "later.wav", reopen_min_s=0.05, reopen_max_s=0.1)
    sources.append(source)
    source.start()
    assert wait_until(lambda: source.stats().reconnects >= 2, timeout=30)
    assert source.state == "retrying" and "later.wav does not exist" in str(source.stats().error)
    write_wav(tmp_path / "later.wav", np.zeros(1600, np.int16), 16000)
    assert wait_until(lambda: source.state == "finished", timeout=30)
    assert source.stats().outages == 1


def test_audio_feeder_checks_the_model_inputs() -> None:
    inputs = [
        TensorSpec("input", (None, None), "float32"),
        TensorSpec("state", (2, None, 128), "float32"),
        TensorSpec("sr", (), "int64"),
    ]
    outputs = [TensorSpec("output", (None, 1), "float32")]
    outputs.append(TensorSpec("stateN", (None, None, None), "float32"))
    config = _vad_pipeline(Path("x.wav"), "m", constants={"sr": 16000})
    feeder = build_feeder(config, inputs, outputs)
    feeds, _ = feeder.feeds(np.ones(512, np.float32), gap=True)
    assert feeds["input"].shape == (1, 576) and float(feeds["input"][0, :64].sum()) == 0.0  # no context yet
    assert feeds["sr"].dtype == np.int64 and int(feeds["sr"]) == 16000
    assert feeds["state"].shape == (2, 1, 128)
    feeder.seen({"output": np.ones((1, 1), np.float32), "stateN": np.full((2, 1, 128), 7, np.float32)})
    again, _ = feeder.feeds(np.full(512, 2.0, np.float32))
    assert float(again["input"][0, :64].mean()) == 1.0 and float(again["state"].mean()) == 7.0
    reset, _ = feeder.feeds(np.zeros(512, np.float32), gap=True)  # the stream restarted
    assert float(reset["state"].sum()) == 0.0 and float(reset["input"][0, :64].sum()) == 0.0

    with pytest.raises(ModelError, match=r"model inputs \['sr'\] are not fed"):
        build_feeder(_vad_pipeline(Path("x.wav"), "m"), inputs, outputs)
    fixed = [TensorSpec("input", (1, 576), "float32"), *inputs[1:]]
    with pytest.raises(ModelError, match="takes 576 samples, but context 32 \\+ window 512 = 544"):
        build_feeder(_vad_pipeline(Path("x.wav"), "m", context=32, constants={"sr": 16000}), fixed, outputs)
    bad_state = config.model_copy(update={"state": [config.state[0].model_copy(update={"output": "hN"})]})
    with pytest.raises(ModelError, match="state output 'hN' is not a model output"):
        build_feeder(bad_state, inputs, outputs)


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            "source: {type: audio, uri: a.wav}\n    postprocess: {type: threshold}",
            "pipelines[0]: an audio source needs preprocess.type: audio or series",
        ),
        (
            "source: {type: video, uri: '0'}\n    preprocess: {type: audio}\n"
            "    postprocess: {type: threshold}",
            "pipelines[0]: preprocess.type: audio needs an audio, mqtt, replay or serial source",
        ),
        (
            "source: {type: audio, uri: a.wav}\n    preprocess: {type: audio}\n"
            "    postprocess: {type: threshold, on_score: 0.3, off_score: 0.6}",
            "pipelines[0].postprocess: off_score (0.6) must not be above on_score (0.3)",
        ),
        (
            "source: {type: audio, uri: a.wav, window: 0}\n    preprocess: {type: audio}\n"
            "    postprocess: {type: threshold}",
            "pipelines[0].source.window: Input should be greater than or equal to 1",
        ),
        (
            "source: {type: audio, uri: a.wav}\n    preprocess: {type: audio, contxt: 64}\n"
            "    postprocess: {type: threshold}",
            "pipelines[0].preprocess.contxt: unknown key",
        ),
    ],
)
def test_bad_audio_pipeline_configs(pipeline: str, message: str) -> None:
    text = (
        "device: {id: a}\nregistry: {url: 'file:///r'}\npipelines:\n"
        f"  - name: p\n    model: {{name: m, version: '1'}}\n    {pipeline}\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, environ={})
    assert message in str(caught.value), caught.value
