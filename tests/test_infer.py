"""`edge-agent infer` for real: real trained models on real inputs, through the CLI in-process.

- YOLOv8n (nudenet's 320n.onnx, AGPL: a test input only) on scikit-image's astronaut, with no
  pipeline: the model's own metadata gives the labels and the letterbox; the face is found where
  MODELS.md says ([173, 82, 274, 180]), and the drawn JPEG has the box there, in its class colour,
  and nothing else changed but the box and its label. The same on a frame of a video.
- The PP-OCR text direction classifier through a pipeline of a config (-c, --pipeline): upright and
  upside-down signs rendered as the demo renders them; the same tensor as a .npz gives the same
  scores; a store version whose manifest carries the preprocessing and labels needs no pipeline.
- silero VAD over a WAV of speech through an audio pipeline: start/end events where the speech is
  (within 0.3 s of the energy ground truth), as tests/test_audio.py establishes for the daemon.
- Every user error is one line and exit 1, never a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner, Result

from agent.backend_choice import choose_and_load
from agent.cli import app
from agent.config_loader import load_config
from agent.model_hints import embedded_hints, with_model_hints
from agent.processing import Preprocessor
from agent.registry import FileRegistry, PublishOptions
from agent.sources import read_wav
from agent.store import ModelStore, store_for
from agent.tools.infer.draw import box_colour
from providers import TensorSpec
from tests import media_fixtures
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, FACE_BOX, astronaut_bgr, iou

speech_wav = media_fixtures.speech_wav
yolo_path = media_fixtures.yolo_path
ORT = "onnxruntime/CPUExecutionProvider"
TOLERANCE_S = 0.3  # as tests/test_audio.py
MAGENTA = (255, 0, 255)  # BGR


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)  # located, never imported (silero_vad's __init__ wants torch)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    assert path.is_file(), path
    return path


CLS = package_file("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
VAD = package_file("silero_vad", "data/silero_vad.onnx")


def infer(*args: object) -> Result:
    return CliRunner().invoke(app, ["infer", *map(str, args)])


def infer_json(*args: object) -> dict[str, Any]:
    result = infer(*args, "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("infer")


@pytest.fixture(scope="module")
def config(folder: Path) -> Path:
    """The demo's sign pipeline and the example config's speech pipeline, on local model files."""
    path = folder / "agent.yaml"
    path.write_text(
        f"""
device: {{id: bench-box}}
state_dir: {folder / "state"}
backends: {{benchmark: false}}
pipelines:
  - name: signs
    model: {{path: {CLS}}}
    source: {{type: video, uri: /dev/video0}}
    preprocess:
      resize: {{width: 192, height: 48}}
      color: bgr
      mean: [0.5, 0.5, 0.5]
      std: [0.5, 0.5, 0.5]
    postprocess: {{type: classification, softmax: false, top_k: 2, labels: [upright, upside-down]}}
  - name: speech
    model: {{path: {VAD}}}
    source: {{type: audio, uri: "alsa:default", window: 512}}
    preprocess: {{type: audio, context: 64, constants: {{sr: 16000}}}}
    state: [{{input: state, output: stateN}}]
    postprocess: {{type: threshold, on_score: 0.5, off_score: 0.35}}
    report: {{on_change: true}}
"""
    )
    return path


@pytest.fixture(scope="module")
def astronaut(folder: Path) -> Path:
    path = folder / "astronaut.png"
    assert cv2.imwrite(str(path), astronaut_bgr())
    return path


@pytest.fixture(scope="module")
def signs(folder: Path) -> dict[str, Path]:
    """One sign rendered as the demo video renders them, upright and upside down."""
    render = media_fixtures.demo_video_module().render_sign
    rng = np.random.default_rng(7)
    paths = {}
    for orientation in CLS_LABELS:
        paths[orientation] = folder / f"{orientation}.png"
        assert cv2.imwrite(
            str(paths[orientation]), render("Parking bay 7", orientation == "upside-down", rng)
        )
    return paths


# --- a real detector on a real photo: the box where the face is, drawn there --------------------------


def _face(output: dict[str, Any]) -> dict[str, Any]:
    faces = [d for d in output["detections"] if d["label"] == "FACE_FEMALE"]
    assert faces, output
    face: dict[str, Any] = faces[0]
    return face


def _near_outline(shape: tuple[int, ...], box: np.ndarray, margin: int) -> np.ndarray:
    """Pixels within `margin` of the outline of `box` (x1, y1, x2, y2)."""
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    x1, y1, x2, y2 = box
    outer = (xx >= x1 - margin) & (xx <= x2 + margin) & (yy >= y1 - margin) & (yy <= y2 + margin)
    inner = (xx > x1 + margin) & (xx < x2 - margin) & (yy > y1 + margin) & (yy < y2 - margin)
    return outer & ~inner


def test_yolo_finds_the_face_and_draws_its_box_in_the_right_place(
    yolo_path: Path, astronaut: Path, config: Path, folder: Path
) -> None:
    drawn_path = folder / "drawn.jpg"
    data = infer_json(yolo_path, astronaut, "-c", config, "--draw", drawn_path)

    # What a pipeline result's output would hold, plus the backend and the time of each step.
    assert data["kind"] == "image" and data["pipeline"] is None and data["model"] == str(yolo_path)
    # Benchmarking is off in this config: the best-ranked candidate, as the daemon would take it.
    assert data["backend"] and data["precision"] and data["backend_choice"] == "not proven: benchmark off"
    assert data["artifact"] == "320n.onnx" and data["proven"] is False
    assert set(data["latency_ms"]) == {"preprocess", "inference", "postprocess"}
    assert all(value > 0 for value in data["latency_ms"].values())
    assert list(data["output"]) == ["detections"] and data["held_back_by"] is None
    face = _face(data["output"])
    assert set(face) == {"index", "label", "score", "box"} and face["index"] == 1
    assert face["score"] >= 0.5 and data["output"]["detections"][0] is face  # the best one
    assert iou(np.array(face["box"]), FACE_BOX) >= 0.7, face
    assert data["drawn"] == {
        "file": str(drawn_path),
        "note": f"{len(data['output']['detections'])} detection(s) drawn",
    }

    original = astronaut_bgr().astype(np.int16)
    drawn = cv2.imread(str(drawn_path)).astype(np.int16)
    assert drawn.shape == original.shape
    colour = box_colour(1)
    assert colour == MAGENTA  # a colour the photo has none of
    is_box_colour = np.abs(drawn - np.array(colour)).max(axis=2) <= 80
    assert not (np.abs(original - np.array(colour)).max(axis=2) <= 80).any()
    # Along each edge of the face's box (MODELS.md's coordinates), the line is there, in that colour.
    x1, y1, x2, y2 = FACE_BOX.astype(int)
    edges = {
        "left": [is_box_colour[y, x1 - 3 : x1 + 4].any() for y in range(y1 + 4, y2 - 3)],
        "right": [is_box_colour[y, x2 - 3 : x2 + 4].any() for y in range(y1 + 4, y2 - 3)],
        "top": [is_box_colour[y1 - 3 : y1 + 4, x].any() for x in range(x1 + 4, x2 - 3)],
        "bottom": [is_box_colour[y2 - 3 : y2 + 4, x].any() for x in range(x1 + 4, x2 - 3)],
    }
    for edge, hits in edges.items():
        assert np.mean(hits) >= 0.95, (edge, np.mean(hits))
    # And nowhere else: what changed (beyond JPEG's noise, at most 50 here) is the outline and the
    # label above the box's top-left corner; the face inside is as it was.
    changed = np.abs(drawn - original).max(axis=2) > 60
    yy, xx = np.mgrid[0 : original.shape[0], 0 : original.shape[1]]
    label = (xx >= x1 - 6) & (xx <= x1 + 200) & (yy >= y1 - 40) & (yy <= y1 + 6)
    allowed = _near_outline(original.shape, FACE_BOX, 6) | label
    assert changed.sum() > 1000  # the drawing is there
    assert not (changed & ~allowed).any(), np.argwhere(changed & ~allowed)[:10]
    assert not (is_box_colour & ~allowed).any()
    assert is_box_colour[label & (yy < y1 - 3)].sum() > 500  # the label's background, above the box
    inside = (xx > x1 + 6) & (xx < x2 - 6) & (yy > y1 + 6) & (yy < y2 - 6)
    assert not changed[inside].any()


def test_the_human_output_names_backend_latency_and_detections(
    yolo_path: Path, astronaut: Path, config: Path
) -> None:
    result = infer(yolo_path, astronaut, "-c", config, "--backend", ORT)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"backend: {ORT} (fp32) on 320n.onnx: as asked (--backend)" in out
    assert "latency: preprocess " in out and " ms, inference " in out
    assert "boxes x1, y1, x2, y2 in source pixels" in out
    row = next(line for line in out.splitlines() if "FACE_FEMALE" in line)
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[:2] == ["FACE_FEMALE", "1"] and float(cells[2]) >= 0.5
    assert iou(np.array([float(v) for v in cells[3].split(",")]), FACE_BOX) >= 0.7


def test_a_video_frame_is_the_one_asked_for(yolo_path: Path, config: Path, folder: Path) -> None:
    # Three grey frames, then three with the photo 128 px from the left edge of a wider frame.
    path = folder / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (768, 512))
    assert writer.isOpened()
    for i in range(6):
        frame = np.full((512, 768, 3), 90, np.uint8)
        if i >= 3:
            frame[:, 128:640] = astronaut_bgr()
        writer.write(frame)
    writer.release()

    later = infer_json(yolo_path, path, "-c", config, "--frame", 4)
    assert later["kind"] == "video" and later["frame"] == 4
    assert iou(np.array(_face(later["output"])["box"]), FACE_BOX + np.array([128, 0, 128, 0])) >= 0.7
    first = infer_json(yolo_path, path, "-c", config)
    assert first["frame"] == 0
    assert not [d for d in first["output"]["detections"] if d["score"] >= 0.5], first["output"]

    beyond = infer(yolo_path, path, "-c", config, "--frame", 6)
    assert beyond.exit_code == 1 and f"{path} has 6 frames: there is no frame 6" in beyond.output


# --- a classifier through a pipeline of the config; tensors; a store version -----------------------------


def test_the_text_direction_classifier_through_the_pipeline(
    config: Path, signs: dict[str, Path], folder: Path
) -> None:
    for orientation, path in signs.items():
        data = infer_json(CLS, path, "-c", config, "--pipeline", "signs")
        assert data["pipeline"] == "signs"
        top = data["output"]["top"]
        assert [t["label"] for t in top] == [orientation, *(set(CLS_LABELS) - {orientation})], top
        assert top[0]["score"] >= 0.9

    # Drawn: the top label written in the top-left corner, nothing else touched (PNG: lossless).
    drawn_path = folder / "sign.png"
    result = infer(CLS, signs["upside-down"], "-c", config, "--pipeline", "signs", "--draw", drawn_path)
    assert result.exit_code == 0, result.output
    assert f"wrote {drawn_path}: top label 'upside-down' written" in result.stdout
    changed = (cv2.imread(str(drawn_path)) != cv2.imread(str(signs["upside-down"]))).any(axis=2)
    ys, xs = np.nonzero(changed)
    assert ys.size > 200 and ys.max() < 30 and xs.min() == 0 and xs.max() < 200


def test_tensors_go_to_the_model_as_they_are(config: Path, signs: dict[str, Path], folder: Path) -> None:
    image = infer_json(CLS, signs["upside-down"], "-c", config, "--pipeline", "signs", "--backend", ORT)
    # The tensor the pipeline's preprocessing makes of the sign, saved: the same scores from it.
    preprocess = Preprocessor(CLS_PREPROCESS, [TensorSpec("x", (None, 3, 48, 192), "float32")])
    tensor = preprocess(cv2.imread(str(signs["upside-down"])))
    np.savez(folder / "sign.npz", x=tensor)
    np.save(folder / "sign.npy", tensor)
    from_npz = infer_json(CLS, folder / "sign.npz", "-c", config, "--pipeline", "signs", "--backend", ORT)
    assert from_npz["kind"] == "tensor" and from_npz["latency_ms"]["preprocess"] == 0.0
    assert from_npz["output"] == image["output"]

    # No pipeline: the output summarised; --raw: its values too.
    bare = infer_json(CLS, folder / "sign.npy", "-c", config, "--backend", ORT, "--raw")
    ((name, summary),) = bare["output"]["outputs"].items()
    assert summary["shape"] == [1, 2] and summary["dtype"] == "float32" and summary["argmax"] == 1
    assert summary["max"] >= 0.9 and summary["min"] <= 0.1 and abs(summary["mean"] - 0.5) < 1e-3
    values = bare["raw_outputs"][name]["values"]
    assert len(values) == 2 and values[1] == pytest.approx(image["output"]["top"][0]["score"], abs=1e-4)
    assert "raw_outputs" not in image  # only with --raw


def test_a_store_version_brings_its_own_preprocessing_and_labels(
    tmp_path: Path, signs: dict[str, Path]
) -> None:
    registry = FileRegistry(tmp_path / "registry")
    hints = {"preprocess": CLS_PREPROCESS.model_dump(exclude_unset=True), "labels": CLS_LABELS}
    registry.publish(CLS, "pp-ocr-cls", "2.0", PublishOptions(metadata=hints))
    ModelStore(tmp_path / "state" / "store").pull(registry, "pp-ocr-cls", "2.0")

    data = infer_json(
        "pp-ocr-cls@2.0",
        signs["upside-down"],
        "--state-dir",
        tmp_path / "state",
        "-c",
        tmp_path / "none.yaml",
    )
    assert data["model"] == "pp-ocr-cls@2.0" and data["pipeline"] is None
    top = data["output"]["top"]
    assert [t["label"] for t in top] == ["upside-down", "upright"]
    # The model gives probabilities: read as they are (a softmax over them would flatten them).
    assert top[0]["score"] >= 0.9 and sum(t["score"] for t in top) == pytest.approx(1, abs=1e-4)


def test_the_backend_is_the_one_the_agent_decided(config: Path, signs: dict[str, Path]) -> None:
    # The daemon's own choice for the sign pipeline (benchmarking off in this config: by rank).
    agent = load_config(config)
    pipeline = agent.pipelines[0]
    installed = store_for(agent).import_file(CLS, pipeline.model.name, pipeline.model.version)
    hinted = with_model_hints(pipeline, installed.manifest, embedded_hints(installed.model_artifacts()))
    session, choice = choose_and_load(agent, hinted, installed.model_artifacts(), installed.ref)
    session.close()

    data = infer_json(CLS, signs["upright"], "-c", config, "--pipeline", "signs")
    assert (data["backend"], data["artifact"]) == (choice.backend, choice.artifact)
    assert data["backend_choice"] == "the agent's decision for this model on this box (cached): benchmark off"


@pytest.mark.slow
def test_benchmark_proves_the_candidates_on_the_input(config: Path, signs: dict[str, Path]) -> None:
    data = infer_json(CLS, signs["upside-down"], "-c", config, "--pipeline", "signs", "--benchmark")
    choice = data["backend_choice"]
    assert choice.startswith("benchmarked on this input: the fastest of "), choice
    assert f"whose outputs match {ORT}" in choice  # the full-precision CPU reference
    assert data["output"]["top"][0]["label"] == "upside-down"


# --- audio: the pipeline's windows over a WAV file -----------------------------------------------------


def test_speech_events_where_the_speech_is(
    config: Path, speech_wav: tuple[Path, list[tuple[float, float]]]
) -> None:
    path, truth = speech_wav
    assert len(truth) == 2, truth
    data = infer_json(VAD, path, "-c", config, "--pipeline", "speech", "--backend", ORT)
    assert data["kind"] == "audio" and data["backend"] == ORT
    windows = (len(read_wav(path, 16000)) - 512) // 512 + 1  # every full window of the file
    assert data["windows"] == windows
    results = data["results"]
    assert results[0]["frame"] == 1 and results[0]["output"]["event"] is None  # the first, idle
    events = [(r["output"]["event"], r["position_s"]) for r in results[1:]]
    assert all(kind is not None for kind, _ in events)  # on_change: then only the changes
    assert [kind for kind, _ in events] == ["start", "end"] * (len(events) // 2), events
    starts = [t for kind, t in events if kind == "start"]
    ends = [t for kind, t in events if kind == "end"]
    for begin, finish in truth:
        assert any(abs(t - begin) <= TOLERANCE_S for t in starts), (begin, events)
        assert any(abs(t - finish) <= TOLERANCE_S for t in ends), (finish, events)
    for _, t in events:  # nothing in the silences
        assert any(begin - TOLERANCE_S <= t <= finish + TOLERANCE_S for begin, finish in truth), (t, events)
    assert data["held_back"]["on_change"] == windows - len(results)
    assert sum(r["held_back"] for r in results) <= windows - len(results)
    assert data["latency_ms"]["inference"] > 0


# --- clear errors ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_inputs(folder: Path) -> dict[str, Path]:
    paths = {
        "text_png": folder / "text.png",
        "notes": folder / "notes.txt",
        "short": folder / "short.npy",
        "named": folder / "named.npz",
        "sign": folder / "sign-for-errors.png",
    }
    paths["text_png"].write_text("not an image")
    paths["notes"].write_text("hello")
    np.save(paths["short"], np.zeros((1, 3, 48), np.float32))
    np.savez(paths["named"], image=np.zeros((1, 3, 48, 192), np.float32))
    cv2.imwrite(str(paths["sign"]), np.full((48, 192, 3), 200, np.uint8))
    return paths


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{folder}/missing.onnx", "{sign}"], r"missing.onnx: no such model file"),
        (["{cls}", "{folder}/missing.png"], r"input .*missing.png does not exist"),
        (["{cls}", "{notes}"], r"notes.txt: unknown input type '.txt'"),
        (["{cls}", "{text_png}"], r"text.png: OpenCV cannot read this image"),
        (
            ["{cls}", "{sign}", "--pipeline", "nope"],
            r"no pipeline named 'nope' in .*agent.yaml \(its pipelines: signs, speech\)",
        ),
        (
            ["{cls}", "{short}"],
            r"short.npy does not fit the model: input 'x' has shape \[1, 3, 48\], the model wants",
        ),
        (
            ["{cls}", "{named}"],
            r"named.npz does not fit the model: missing input 'x'; no model input named 'image'",
        ),
        (
            ["{cls}", "{sign}", "--backend", "tflite/edgetpu"],
            r"backend tflite/edgetpu is not available here: ",
        ),
        (["{cls}", "{sign}", "--backend", "nosuch/CPU"], r"unknown backend 'nosuch/CPU'"),
        (["{cls}", "{sign}", "--backend", "tflite/cpu"], r"tflite/cpu cannot run .*: cannot read onnx files"),
        (
            ["{cls}", "{sign}"],
            r"open size .*\n.*hint: the model does not say how to feed it: give --pipeline",
        ),
        (["{vad}", "{speech}"], r"a WAV file needs an audio pipeline"),
        (
            ["{cls}", "{speech}", "--pipeline", "signs"],
            r"pipeline signs reads a video source: a WAV file is for",
        ),
        (["{vad}", "{sign}", "--pipeline", "speech"], r"pipeline speech takes audio windows, not an image"),
        (["{cls}", "{short}", "--draw", "{folder}/out.jpg"], r"--draw needs an image or a video frame"),
        (["{cls}", "{sign}", "--frame", "3"], r"--frame is for a video input"),
        (["{cls}", "{sign}", "--raw"], r"--raw goes with --json"),
        (["{cls}", "{sign}", "--benchmark", "--backend", "openvino/CPU"], r"give one of them"),
    ],
)
def test_user_errors_are_one_line_and_exit_1(
    args: list[str],
    message: str,
    config: Path,
    folder: Path,
    bad_inputs: dict[str, Path],
    speech_wav: tuple[Path, list[tuple[float, float]]],
) -> None:
    names = {"folder": folder, "cls": CLS, "vad": VAD, "speech": speech_wav[0], **bad_inputs}
    result = infer(*[arg.format_map(names) for arg in args], "-c", config)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ")
    assert re.search(message, result.output), result.output


def test_errors_in_json(config: Path) -> None:
    result = infer(CLS, "missing.png", "-c", config, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "ok": False,
        "errors": ["input missing.png does not exist"],
        "hint": None,
    }
