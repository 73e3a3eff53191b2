"""Bad `attributes:` (second models, issue 36) said by `config validate` at the config's file:line,
never a traceback: attributes on a pipeline with no boxes or no pictures, duplicate names, a
`rotate_by` that names no earlier classifier of angles, a postprocess that gives no one answer per
object, `max_per_frame` out of range, a label the detector lacks. And, once the detector is at hand
(nudenet's YOLOv8n 320n.onnx names its classes only in its file's metadata), an attribute's labels
against the model's own names: `config validate`, `doctor` and the daemon's build (with_model_hints)
alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import PipelineConfig
from agent.config_loader import load_config
from agent.errors import ConfigError
from agent.model_hints import embedded_hints, with_model_hints
from providers import ModelArtifact
from tests.cli_runs import edge_agent
from tests.config_cases import validate_cli

HEAD = """\
device: {id: box-1}
registry: {url: "file:///srv/registry"}
pipelines:
  - name: signs
    model: {name: det, version: "1"}
    source: {type: video, uri: "0"}
"""
DETECTOR = "    postprocess: {type: detection, labels: [person, car, sign]}\n"
CLS = """\
      - name: direction
        model: {name: cls, version: "2.0"}
        postprocess: {type: classification, softmax: false, labels: ["0", "180"]}
"""
REC = """\
      - name: text
        model: {name: rec, version: "4"}
        postprocess: {type: ctc}
"""

CASES = {
    "a classifier's pipeline has no boxes": (
        HEAD + "    postprocess: {type: classification, labels: [a, b]}\n    attributes:\n" + REC,
        "8: pipelines[0].attributes: attributes read objects' crops: they need boxes (a detection or "
        "regions postprocess, not classification)",
    ),
    "an audio source has no pictures": (
        """\
device: {id: box-1}
registry: {url: "file:///srv/registry"}
pipelines:
  - name: lobby
    model: {name: vad, version: "6"}
    source: {type: audio, uri: /srv/audio/lobby.wav}
    preprocess: {type: audio}
    postprocess: {type: threshold, on_score: 0.5}
    attributes:
"""
        + REC,
        "9: pipelines[0].attributes: attributes read objects' crops: they need boxes (a detection or "
        "regions postprocess, not threshold)",
    ),
    "a label the detector lacks": (
        HEAD + DETECTOR + "    attributes:\n" + REC + "        labels: [sing]\n",
        "12: pipelines[0].attributes[0].labels[0]: 'sing' is not one of postprocess.labels (person, car, "
        "sign); did you mean 'sign'?",
    ),
    "two attributes of one name": (
        HEAD + DETECTOR + "    attributes:\n" + REC + REC,
        "12: pipelines[0].attributes[1].name: 'text' is attributes[0]'s name",
    ),
    "rotate_by names no earlier attribute": (
        HEAD + DETECTOR + "    attributes:\n" + REC + "        crop: {rotate_by: direction}\n" + CLS,
        "12: pipelines[0].attributes[0].crop.rotate_by: 'direction' is not an attribute before this one: "
        "a crop is turned by an earlier classifier's answer",
    ),
    "rotate_by names no classifier": (
        HEAD
        + DETECTOR
        + "    attributes:\n"
        + REC.replace("text", "plate")
        + REC
        + "        crop: {rotate_by: plate}\n",
        "15: pipelines[0].attributes[1].crop.rotate_by: attributes[0] ('plate') is a ctc; turning a crop "
        "needs a classifier whose labels are angles",
    ),
    "rotate_by's classifier has no angles": (
        HEAD
        + DETECTOR
        + "    attributes:\n"
        + CLS.replace('["0", "180"]', "[up, down]")
        + REC
        + "        crop: {rotate_by: direction}\n",
        "11: pipelines[0].attributes[0].postprocess.labels: 'up' is no angle: attributes[1] turns its crops "
        "by this classifier's answer, so its labels must be degrees (0, 90, 180, 270)",
    ),
    "a detection postprocess for an attribute": (
        HEAD + DETECTOR + "    attributes:\n" + CLS.replace("classification, softmax: false", "detection"),
        "9: pipelines[0].attributes[0]: an attribute's postprocess gives one answer per object: "
        "classification, ctc, embedding, plugin, not detection",
    ),
    "max_per_frame 0": (
        HEAD + DETECTOR + "    attributes:\n" + CLS + "        max_per_frame: 0\n",
        "12: pipelines[0].attributes[0].max_per_frame: Input should be greater than or equal to 1 (got 0)",
    ),
    "max_per_frame 65": (
        HEAD + DETECTOR + "    attributes:\n" + CLS + "        max_per_frame: 65\n",
        "12: pipelines[0].attributes[0].max_per_frame: Input should be less than or equal to 64 (got 65)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_attribute_is_said_at_its_line(tmp_path: Path, case: str) -> None:
    text, problem = CASES[case]
    assert validate_cli(tmp_path, text) == (1, [problem])


def test_good_attributes_validate(tmp_path: Path) -> None:
    chain = HEAD + DETECTOR + "    attributes:\n" + CLS + REC + "        crop: {rotate_by: direction}\n"
    assert validate_cli(tmp_path, chain) == (0, [])


# --- an attribute's labels against the detector's own names ----------------------------------------


def _face_reader(tmp_path: Path, yolo_path: Path, labels: str) -> Path:
    """A pipeline on the YOLOv8n file, no postprocess.labels (the model's own), reading faces."""
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"""\
device: {{id: box-1}}
state_dir: {tmp_path / "state"}
mqtt: {{host: 127.0.0.1, port: 1}}
pipelines:
  - name: door
    model: {{path: {yolo_path}}}
    source: {{type: video, uri: {tmp_path / "door.mp4"}}}
    postprocess: {{type: detection}}
    attributes:
      - name: mood
        model: {{name: mood, version: "1"}}
        labels: {labels}
        postprocess: {{type: classification}}
"""
    )
    return path


def test_an_attribute_label_the_detector_file_lacks_is_said_with_a_close_name(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    config = _face_reader(tmp_path, yolo_path, "[FACE_FEMAL]")
    code, lines = validate_cli(tmp_path, config.read_text())
    wanted = (
        f"12: pipelines[0].attributes[0].labels[0]: 'FACE_FEMAL' is not one of the model's labels "
        f"({', '.join(yolo_labels)}); did you mean 'FACE_FEMALE'?"
    )
    assert (code, lines) == (1, [wanted])
    config = _face_reader(tmp_path, yolo_path, "[FACE_FEMALE, FACE_MALE]")
    assert validate_cli(tmp_path, config.read_text()) == (0, [])


def test_doctor_and_the_daemon_s_build_say_it_too(tmp_path: Path, yolo_path: Path) -> None:
    config = _face_reader(tmp_path, yolo_path, "[FACE_FEMAL]")
    unknown = "'FACE_FEMAL' is not one of the model's labels"
    where = f"{config}:12: pipelines[0].attributes[0].labels[0]: {unknown}"
    done = edge_agent("doctor", "-c", str(config), "--timeout", "2", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    assert rows["config"]["status"] == "FAIL" and rows["config"]["detail"].startswith(where), rows["config"]
    # What the daemon's build does once it has the model: the file's own names, checked first.
    pipeline: PipelineConfig = load_config(config).pipelines[0]
    artifact = ModelArtifact(yolo_path, "onnx", "", name=yolo_path.name)
    with pytest.raises(ConfigError) as refused:
        with_model_hints(pipeline, None, embedded_hints([artifact]))
    assert refused.value.problems[0].startswith(where), refused.value.problems
