"""What `edge-agent infer` reads: the kind of input by its suffix, an image, one video frame, or
tensors (.npy, .npz) checked against the model's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from agent.config import AudioSourceConfig, PipelineConfig
from agent.errors import EdgeAgentError
from agent.registry.file_registry import SUFFIX_FORMATS
from agent.sources import read_wav
from agent.sources.audio import audio_windows
from agent.stage import LoadedModel, Stage
from agent.testdata import load_testdata
from providers import (
    Session,
    TensorSpec,
)
from providers.select import feeds_problem

INPUT_KINDS: dict[str, tuple[str, ...]] = {
    "image": (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm", ".pnm"),
    "video": (".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".gif"),
    "audio": (".wav",),
    "tensor": (".npy", ".npz"),
}
PICTURES = ("image", "video")  # inputs there is something to draw on
NAMED = {"image": "an image", "video": "a video", "audio": "a WAV file", "tensor": "a tensor file"}


def input_kind(path: Path) -> str:
    """image, video, audio or tensor, by the file's suffix; EdgeAgentError for anything else."""
    if not path.exists():
        raise EdgeAgentError(f"input {path} does not exist")
    if not path.is_file():
        raise EdgeAgentError(f"input {path} is not a file")
    suffix = path.suffix.lower()
    for kind, suffixes in INPUT_KINDS.items():
        if suffix in suffixes:
            return kind
    raise EdgeAgentError(
        f"{path}: unknown input type {suffix or '(no suffix)'!r}",
        hint="infer takes an image (.jpg, .png, ...), a video (.mp4, .mkv, ...), a WAV file (.wav) "
        "or a tensor (.npy, .npz)",
    )


def is_model_file_name(spec: str) -> bool:
    """MODEL names a file (a path, or a model suffix) rather than a store NAME[@VERSION]."""
    return Path(spec).is_file() or "/" in spec or Path(spec).suffix.lower() in SUFFIX_FORMATS


def read_image(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise EdgeAgentError(f"{path}: OpenCV cannot read this image (a damaged file, or not an image)")
    return image


def read_video_frame(path: Path, index: int) -> np.ndarray:
    """Frame `index` (0 = the first) of a video file, decoded with OpenCV frame by frame (exact,
    unlike a seek to a keyframe)."""
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise EdgeAgentError(f"{path}: OpenCV cannot open this video (a damaged file, or no codec)")
        for decoded in range(index):
            if not capture.grab():
                raise EdgeAgentError(f"{path} has {decoded} frames: there is no frame {index}")
        ok, frame = capture.read()
        if not ok or frame is None:
            raise EdgeAgentError(f"{path} has {index} frames: there is no frame {index}")
        return np.asarray(frame)
    finally:
        capture.release()


def read_tensors(path: Path, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """A .npy (the one input of a single-input model) or a .npz (arrays named after the inputs),
    checked against the model's inputs; floats are cast to the float type the model takes."""
    if path.suffix.lower() == ".npy":
        if len(inputs) != 1:
            names = ", ".join(spec.name for spec in inputs)
            raise EdgeAgentError(
                f"{path}: one array, but the model has {len(inputs)} inputs ({names})",
                hint="give a .npz with an array named after each input",
            )
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise EdgeAgentError(f"{path} is not a NumPy .npy array: {exc}") from None
        if not isinstance(array, np.ndarray):  # a .npz archive named .npy
            raise EdgeAgentError(f"{path} is not a .npy array", hint="name a .npz archive .npz")
        feeds = {inputs[0].name: array}
    else:
        feeds = dict(load_testdata(path).feeds)  # expected:* arrays (test data) are left out
    by_name = {spec.name: spec for spec in inputs}
    for name, value in feeds.items():
        spec = by_name.get(name)
        if spec is not None and value.dtype.kind == "f" and np.dtype(spec.dtype).kind == "f":
            feeds[name] = value.astype(spec.dtype, copy=False)
    problem = feeds_problem(inputs, feeds)
    if problem:
        raise EdgeAgentError(f"{path} does not fit the model: {problem}")
    return feeds


def first_feeds(
    config: PipelineConfig, session: Session, kind: str, path: Path, picture: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The model's inputs for the first frame of the input: what --benchmark proves backends on."""
    if kind == "tensor":
        return read_tensors(path, session.inputs)
    stage = Stage(config, LoadedModel("sample", "sample", "", session))
    if picture is not None:
        return stage.feeder.feeds(picture, gap=True)[0]
    source = config.source
    assert isinstance(source, AudioSourceConfig)
    first = next(
        audio_windows(read_wav(path, source.sample_rate), source.window, source.hop or source.window), None
    )
    if first is None:
        raise too_short(path, source)
    return stage.feeder.feeds(first[1], gap=True)[0]


def too_short(path: Path, source: AudioSourceConfig) -> EdgeAgentError:
    return EdgeAgentError(
        f"{path} is shorter than one window ({source.window} samples at {source.sample_rate} Hz)"
    )
