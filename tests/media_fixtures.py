"""Shared media helpers: the demo video renderer, the real cls model loaded, bounded waits.

Test modules re-export the fixtures they use (`demo_video = media_fixtures.demo_video`) so
they work whether or not this module is listed in conftest's pytest_plugins.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import onnx
import psutil
import pytest
from skimage import data as skimage_data

from agent.config import PreprocessConfig, ResizeConfig
from agent.pipeline import Pipeline
from agent.results import Result
from agent.stage import LoadedModel
from providers import BackendError, ModelArtifact, Session, TensorSpec
from providers.onnxruntime_backend import OnnxRuntimeBackend

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
# The PP-OCR direction classifier's own preprocessing: BGR, 48x192, (img/255 - 0.5) / 0.5.
CLS_PREPROCESS = PreprocessConfig(
    color="bgr", mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], resize=ResizeConfig(width=192, height=48)
)
CLS_LABELS = ["upright", "upside-down"]


def demo_video_module() -> ModuleType:
    """scripts/make_demo_video.py, imported as a module (render_sign, make_orientation_video, truth_at)."""
    if str(SCRIPTS_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPTS_DIR))
    import make_demo_video

    return make_demo_video


def cls_artifact(path: Path) -> ModelArtifact:
    return ModelArtifact(path=path, format="onnx", sha256="0" * 64)


@pytest.fixture(scope="module")
def short_video(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """A 1.5 s, 20 fps (30 frames) rendering of the demo signs, with its ground truth."""
    path = tmp_path_factory.mktemp("media") / "short.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=20, seconds_per_sign=0.25)
    return path, truth


class FlakySession(Session):
    """The real session, except that every `every`-th run raises (or every run, with every=1)."""

    def __init__(self, inner: Session, every: int, message: str = "simulated device hiccup") -> None:
        self.inner = inner
        self.message = message
        self.every = every
        self.backend = inner.backend
        self.precision = inner.precision
        self.calls = 0
        self.failures = 0

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.inner.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.inner.outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.calls % self.every == 0:
            self.failures += 1
            raise BackendError(f"{self.backend}: run failed: {self.message} on call {self.calls}")
        return self.inner.run(feeds)


class ListSink:
    """A pipeline's result sink that keeps every result, for tests (the daemon's is the outbox)."""

    def __init__(self) -> None:
        self.results: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []  # tracking pipelines' events, in order
        self.snapshots: list[tuple[str, int, np.ndarray]] = []  # (pipeline, track id, the frame)
        self.crossings: dict[str, dict[str, dict[str, int]]] = {}  # pipeline -> line -> direction: count
        self._lock = threading.Lock()

    def submit(self, result: Result) -> None:
        with self._lock:
            if result.publish:
                self.results.append((result.pipeline, {"captured_at": result.captured_at, **result.fields()}))
            self.events += [(result.pipeline, dict(e)) for e in result.events]

    def write_events(self, pipeline: str, events: list[dict[str, Any]]) -> None:
        with self._lock:
            self.events += [(pipeline, dict(e)) for e in events]

    def open_tracks(self, pipeline: str) -> int:
        return 1

    def line_counts(self, pipeline: str) -> dict[str, dict[str, int]]:
        return self.crossings.setdefault(pipeline, {})

    def save_snapshot(
        self, pipeline: str, wanted: Any, frame: np.ndarray, captured_at: float, config: Any
    ) -> str:
        with self._lock:
            self.snapshots.append((pipeline, wanted.track_id, frame))
            return f"{wanted.track_id}-{len(self.snapshots)}"

    def count(self) -> int:
        with self._lock:
            return len(self.results)


HELPER_PROGRAMS = ("arecord", "gst-launch-1.0")  # what live audio and GStreamer sources run


@pytest.fixture
def sources() -> Iterator[list[Any]]:
    """Sources a test started; each is stopped (bounded) at teardown even if the test failed, and no
    helper program a source ran (arecord, gst-launch-1.0) may outlive it."""
    started: list[Any] = []
    yield started
    for source in started:
        source.stop(timeout=30)  # generous: a loaded machine may be slow to end the reader
    if started:
        left = [p.name() for p in psutil.Process().children(recursive=True) if p.name() in HELPER_PROGRAMS]
        assert not left, f"helper programs outlived their sources: {left}"


def sign_folder(folder: Path, count: int) -> list[str]:
    """`count` rendered signs as PNG files (alternately upside down), in name order; their orientations."""
    folder.mkdir()
    render = demo_video_module().render_sign
    rng = np.random.default_rng(11)
    orientations = []
    for i in range(count):
        upside_down = i % 2 == 1
        assert cv2.imwrite(str(folder / f"frame-{i:03d}.png"), render(f"BAY {i}", upside_down, rng))
        orientations.append("upside-down" if upside_down else "upright")
    return orientations


SPEECH = ("The quick brown fox jumps over the lazy dog.", "Hello camera, start recording now.")
SILENCES_S = (1.0, 1.5, 1.0)  # before, between and after the two sentences


def speak(text: str, path: Path) -> None:
    """espeak-ng (Debian) renders `text` to a 22050 Hz mono 16-bit WAV."""
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text], check=True, timeout=60)


def speech_spans(samples: np.ndarray, rate: int) -> list[tuple[float, float]]:
    """Ground truth by energy: 512-sample frames with RMS > 0.01 are speech; gaps under 320 ms merge."""
    frames = len(samples) // 512
    rms = np.sqrt((samples[: frames * 512].reshape(frames, 512).astype(np.float64) ** 2).mean(axis=1))
    spans: list[list[float]] = []
    for i in np.flatnonzero(rms > 0.01):
        start, end = i * 512 / rate, (i + 1) * 512 / rate
        if spans and start - spans[-1][1] < 0.32:
            spans[-1][1] = end
        else:
            spans.append([start, end])
    return [(a, b) for a, b in spans]


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[float, float]]]:
    """Two spoken sentences with silence around and between them (22050 Hz, as espeak-ng writes),
    and where the speech is, by energy."""
    folder = tmp_path_factory.mktemp("speech")
    pieces = []
    rate = 22050
    for i, text in enumerate(SPEECH):
        spoken = folder / f"s{i}.wav"
        speak(text, spoken)
        with wave.open(str(spoken), "rb") as wav:
            rate = wav.getframerate()
            pieces.append(np.frombuffer(wav.readframes(wav.getnframes()), np.int16))
    silence = [np.zeros(round(s * rate), np.int16) for s in SILENCES_S]
    audio = np.concatenate([silence[0], pieces[0], silence[1], pieces[1], silence[2]])
    path = folder / "speech.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(audio.tobytes())
    return path, speech_spans(audio.astype(np.float32) / 32768, rate)


def write_wav(path: Path, samples: np.ndarray, rate: int, width: int = 2, channels: int = 1) -> None:
    """`samples` (already of the sample width's integer type; channels interleaved) as a PCM WAV."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(samples.tobytes())


def silero(file: str) -> Path:
    """A file of the silero-vad wheel's data/ (its VAD models), located without importing it."""
    spec = importlib.util.find_spec("silero_vad")  # located, never imported (its __init__ wants torch)
    assert spec is not None and spec.submodule_search_locations, "silero-vad==6.2.3 is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / file
    assert path.is_file(), path
    return path


# --- the trained YOLOv8n detector (nudenet, AGPL: a test input only) and its photo ---------------------

FACE_BOX = np.array([173, 82, 274, 180], dtype=np.float64)  # the astronaut's face, 512x512 photo


@pytest.fixture(scope="module")
def yolo_path() -> Path:
    spec = importlib.util.find_spec("nudenet")  # located only; the model file is what we need
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("nudenet==3.4.2 is not installed; scripts/setup.sh installs its model file")
    path = Path(next(iter(spec.submodule_search_locations))) / "320n.onnx"
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def yolo_labels(yolo_path: Path) -> list[str]:
    """Class names from the model's own metadata: {0: 'FEMALE_GENITALIA_COVERED', 1: 'FACE_FEMALE', ...}."""
    metadata = {p.key: p.value for p in onnx.load(str(yolo_path), load_external_data=False).metadata_props}
    names: dict[int, str] = ast.literal_eval(metadata["names"])
    return [names[i] for i in range(len(names))]


@pytest.fixture
def started() -> Iterator[list[Pipeline]]:
    """The pipelines a test started (it appends them): each stopped after the test, passed or not."""
    pipelines: list[Pipeline] = []
    yield pipelines
    for pipeline in pipelines:
        pipeline.stop(timeout=30)


@pytest.fixture(scope="module")
def yolo_loaded(yolo_path: Path) -> LoadedModel:
    """The YOLOv8n face detector on onnxruntime's CPU, as a stage holds it (the pipeline tests hand it to
    their pipelines instead of pulling and proving a model)."""
    session = OnnxRuntimeBackend().load(cls_artifact(yolo_path))
    return LoadedModel(name="faces", version="1", sha256="cd" * 32, session=session)


def mediapipe_model(relative: str) -> Path:
    """A model file the mediapipe wheel ships under its modules/ (located, mediapipe not imported)."""
    spec = importlib.util.find_spec("mediapipe")
    assert spec is not None and spec.submodule_search_locations, "mediapipe is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "modules" / relative


def astronaut_bgr() -> np.ndarray:
    return cv2.cvtColor(skimage_data.astronaut(), cv2.COLOR_RGB2BGR)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)
