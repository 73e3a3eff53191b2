"""Models a user already has: `model: {path: ...}` imported into the store without a registry, and
the model file's own metadata (Ultralytics ONNX metadata_props, TFLite associated label files)
filling what the YAML and the manifest leave out. A real YOLOv8n export (nudenet's 320n.onnx, open
input size, its classes only in its metadata) on a real photo through the daemon."""

from __future__ import annotations

import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import cv2
import onnx
import pytest
from pydantic import ValidationError

from agent.config import AgentConfig, DetectionPostprocess, ModelRef, PipelineConfig, TrustedKey
from agent.errors import ModelError, StoreError
from agent.model_hints import embedded_hints, with_model_hints
from agent.onnx_wire import onnx_default_opset, onnx_metadata_props
from agent.registry import Manifest
from agent.registry.signing import SignatureError, TrustPolicy, generate_key
from agent.store import ModelStore
from agent.transform import onnx_opset
from providers import ModelArtifact
from tests.agent_process import StartAgent, pipeline_state
from tests.media_fixtures import FACE_BOX, astronaut_bgr, iou, mediapipe_model


def _artifact(path: Path, format: str = "onnx") -> ModelArtifact:
    return ModelArtifact(path, format, "0" * 64, name=path.name)


# --- config ---------------------------------------------------------------------------------------


def test_a_model_by_path_needs_no_registry_and_gets_its_name_from_the_file() -> None:
    ref = ModelRef.model_validate({"path": "/opt/models/yolov8n face (v2).onnx"})
    assert (ref.name, ref.version, ref.path) == (
        "yolov8n-face-v2",
        "local",
        Path("/opt/models/yolov8n face (v2).onnx"),
    )
    named = ModelRef.model_validate({"path": "/opt/models/x.onnx", "name": "door-det"})
    assert named.name == "door-det"
    config = AgentConfig.model_validate(
        {
            "device": {"id": "box"},
            "pipelines": [
                {
                    "name": "p",
                    "source": {"type": "video", "uri": "file:///dev/null"},
                    "model": {"path": "/opt/models/x.onnx"},
                    "postprocess": {"type": "raw"},
                }
            ],
        }
    )
    assert config.registry is None
    for bad, message in [
        ({"path": "models/x.onnx"}, "must be an absolute path"),
        ({"path": "/opt/x.onnx", "version": "3"}, "version is for registry models"),
        ({"path": "/opt/x.onnx", "digest": "sha256:" + "a" * 64}, "digest is for registry models"),
    ]:
        with pytest.raises(ValidationError, match=message):
            ModelRef.model_validate(bad)


# --- the store ------------------------------------------------------------------------------------


def test_a_file_is_imported_hashed_and_checked_on_every_import(tmp_path: Path, cls_model_path: Path) -> None:
    source = tmp_path / "models" / "cls.onnx"
    source.parent.mkdir()
    source.write_bytes(cls_model_path.read_bytes())
    store = ModelStore(tmp_path / "store")
    first = store.import_file(source, "cls")
    assert (first.ref, first.manifest.metadata) == ("cls@local", {"source": str(source)})
    blob = first.primary()[1]
    assert blob.read_bytes() == source.read_bytes()
    again = store.import_file(source, "cls")  # unchanged: nothing copied again
    assert again.manifest == first.manifest and blob.stat().st_mtime == first.primary()[1].stat().st_mtime

    # The stored copy rots: the next start replaces it.
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.write_bytes(bytes(data))
    repaired = store.import_file(source, "cls")
    assert repaired.primary()[1].read_bytes() == source.read_bytes() and store.verify("cls", "local") == []

    # The file changes on disk (a new export): the version now holds the new bytes.
    model = onnx.load(str(source))
    onnx.helper.set_model_props(model, {"note": "re-exported"})
    onnx.save(model, str(source))
    changed = store.import_file(source, "cls")
    assert changed.primary()[0].sha256 != first.primary()[0].sha256
    assert changed.primary()[1].read_bytes() == source.read_bytes()


def test_bad_files_are_refused_by_name(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    with pytest.raises(StoreError, match=r"cannot read model file .*missing.onnx: No such file"):
        store.import_file(tmp_path / "missing.onnx", "m")
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n")
    with pytest.raises(ModelError, match=r"notes\.onnx is not a valid ONNX model"):
        store.import_file(text, "m")
    with pytest.raises(StoreError, match="cannot tell its format from the suffix"):
        store.import_file(tmp_path / "model.pt", "m")
    assert store.list() == []


def test_a_box_that_requires_signatures_refuses_local_files(tmp_path: Path, cls_model_path: Path) -> None:
    _kid, public = generate_key(tmp_path / "k")
    store = ModelStore(tmp_path / "store", trust=TrustPolicy.from_config([TrustedKey(key=public)]))
    with pytest.raises(SignatureError, match=r"a file given by model\.path has no signature"):
        store.import_file(cls_model_path, "cls")


# --- the model's own metadata -----------------------------------------------------------------------


def test_ultralytics_metadata_gives_labels_and_input_size(yolo_path: Path, yolo_labels: list[str]) -> None:
    hints = embedded_hints([_artifact(yolo_path)])
    assert hints["labels"] == yolo_labels and len(yolo_labels) == 18
    assert hints["preprocess"] == {
        "resize": {"height": 320, "width": 320, "mode": "letterbox"},
        "color": "rgb",
        "scale": 1 / 255,
    }


def test_metadata_props_are_read_from_the_wire_as_onnx_reads_them(tmp_path: Path, yolo_path: Path) -> None:
    """The daemon reads them without the onnx package (agent/model_hints.py, onnx_metadata_props)."""
    model = onnx.load(str(yolo_path))
    onnx.helper.set_model_props(
        model,
        {**{p.key: p.value for p in model.metadata_props}, "note": "überall ✓", "long": "x" * 70_000, "": ""},
    )
    written = tmp_path / "props.onnx"
    onnx.save(model, str(written))
    for path in (yolo_path, written):
        expected = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        assert onnx_metadata_props(path) == expected
    props = onnx_metadata_props(written)
    assert props["note"] == "überall ✓" and len(props["long"]) == 70_000
    bare = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    onnx.save(bare, str(tmp_path / "bare.onnx"))
    assert onnx_metadata_props(tmp_path / "bare.onnx") == {}


def test_the_default_opset_is_read_from_the_wire_as_onnx_reads_it(
    tmp_path: Path, yolo_path: Path, cls_model_path: Path
) -> None:
    """Old opsets are upgraded for the reference (agent/transform.py): the daemon learns a file's opset
    on every start without the onnx package."""
    graph = onnx.helper.make_graph([], "g", [], [])
    custom_first = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("com.microsoft", 1), onnx.helper.make_opsetid("", 6)]
    )
    onnx.save(custom_first, str(tmp_path / "old.onnx"))
    onnx.save(onnx.helper.make_model(graph, opset_imports=[]), str(tmp_path / "none.onnx"))
    for path in (yolo_path, cls_model_path, tmp_path / "old.onnx"):
        opsets = onnx.load(str(path), load_external_data=False).opset_import
        assert onnx_default_opset(path) == next(o.version for o in opsets if o.domain in ("", "ai.onnx"))
    assert onnx_default_opset(tmp_path / "old.onnx") == 6
    assert onnx_default_opset(tmp_path / "none.onnx") is None
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(yolo_path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="runs past the end"):
        onnx_default_opset(broken)
    assert onnx_opset(broken) is None and onnx_opset(tmp_path / "gone.onnx") is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (lambda data: data[: len(data) // 2], "runs past the end"),  # cut off inside the graph
        (lambda data: data + b"\x80", "ends inside a field"),  # a key's varint never ends
        (lambda data: data + b"\x0b", "wire type 3"),  # a group: not in ONNX files
        (lambda data: b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_a_malformed_file_is_a_value_error_and_gives_no_hints(
    tmp_path: Path, yolo_path: Path, content: Any, problem: str
) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(content(yolo_path.read_bytes()))
    with pytest.raises(ValueError, match=problem):
        onnx_metadata_props(broken)
    assert embedded_hints([_artifact(broken)]) == {}


def test_yaml_then_manifest_then_the_file_win_key_by_key(yolo_path: Path, yolo_labels: list[str]) -> None:
    pipeline = PipelineConfig.model_validate(
        {
            "name": "p",
            "source": {"type": "video", "uri": "file:///dev/null"},
            "model": {"path": str(yolo_path)},
            "preprocess": {"resize": {"width": 640, "height": 640, "mode": "letterbox"}},
            "postprocess": {"type": "detection"},
        }
    )
    manifest = Manifest.model_validate(
        {
            "schema_version": 1, "name": "det", "version": "local", "created": "2026-11-23T00:00:00Z",
            "artifacts": [{"file": "m.onnx", "sha256": "0" * 64, "size": 1, "format": "onnx"}],
            "metadata": {"preprocess": {"color": "bgr"}},
        }
    )  # fmt: skip
    merged = with_model_hints(pipeline, manifest, embedded_hints([_artifact(yolo_path)]))
    assert merged.preprocess is not None and merged.preprocess.resize is not None
    assert merged.preprocess.resize.width == 640  # the YAML's
    assert merged.preprocess.color == "bgr"  # the manifest's
    assert isinstance(merged.postprocess, DetectionPostprocess)
    assert merged.postprocess.labels == yolo_labels  # the file's


def test_tflite_associated_label_files_give_labels(tmp_path: Path) -> None:
    """A .tflite with metadata carries its label file in a zip appended to the flatbuffer."""
    face_tflite = mediapipe_model("face_detection/face_detection_short_range.tflite")
    packed = tmp_path / "with-labels.tflite"
    packed.write_bytes(face_tflite.read_bytes())
    with zipfile.ZipFile(packed, "a") as archive:
        archive.writestr("labelmap.txt", "face\n\nbackground\n")
    assert embedded_hints([_artifact(packed, "tflite")]) == {"labels": ["face", "background"]}
    assert embedded_hints([_artifact(face_tflite, "tflite")]) == {}  # no metadata: nothing


def test_metadata_that_cannot_be_read_is_ignored(tmp_path: Path, yolo_path: Path) -> None:
    model = onnx.load(str(yolo_path))
    for prop in model.metadata_props:
        if prop.key == "names":
            prop.value = "{0: 'a', 1: open('/etc/passwd')}"  # not a literal: never evaluated
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    assert embedded_hints([_artifact(broken)]) == {}


# --- the daemon --------------------------------------------------------------------------------------


def test_the_daemon_runs_a_yolo_export_by_path_with_no_hints_in_the_yaml(
    tmp_path: Path, yolo_path: Path, start_agent: StartAgent
) -> None:
    """No registry, no preprocess, no labels: the export's metadata has the input size (its input is
    open: [batch, 3, height, width]) and the class names."""
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(3):
        cv2.imwrite(str(frames / f"frame-{i}.png"), astronaut_bgr())
    state_dir = tmp_path / "state"
    config = {
        "device": {"id": "local-box"},
        "state_dir": str(state_dir),
        "mqtt": {"host": "127.0.0.1", "port": 1, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "backends": {"benchmark": False},
        "pipelines": [
            {
                "name": "faces",
                "model": {"path": str(yolo_path)},
                "source": {"type": "video", "uri": str(frames), "fps": 5},
                "postprocess": {"type": "detection", "format": "yolov8"},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    log = start_agent(path).run_until(
        lambda: pipeline_state(state_dir, "faces") == "finished", "the frames' end"
    )
    assert "imported 320n@local from" in log
    with sqlite3.connect(f"file:{state_dir / 'outbox.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT payload FROM messages WHERE topic LIKE '%/results/%'").fetchall()
    results = [json.loads(row[0]) for row in rows]
    assert results, "no results"
    for result in results:
        assert result["model"]["name"] == "320n" and result["model"]["version"] == "local"
        faces = [d for d in result["output"]["detections"] if d["label"] == "FACE_FEMALE"]
        assert faces and iou(faces[0]["box"], FACE_BOX) >= 0.7, result["output"]
