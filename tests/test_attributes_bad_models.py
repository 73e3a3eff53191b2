"""An attribute's model that cannot read crops, said before the daemon runs (issue 36): `config validate`
and `doctor` read the graph of each attribute's model where it is at hand (agent/attribute_check.py)
and name the attribute's `model:` line when its input is no picture (a real voice detector from the
silero-vad wheel; a real scikit-learn classifier exported to ONNX), and the `postprocess.labels` line
when a classifier's labels are not as many as its output's classes (PP-OCR's direction classifier
has two)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runs import edge_agent
from tests.config_cases import validate_cli
from tests.media_fixtures import silero

CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"
IMAGE_ONLY = "an attribute's model reads the crops of objects, fed as one 4-D picture (N,C,H,W or N,H,W,C)"


@pytest.fixture(scope="module")
def sklearn_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real scikit-learn classifier trained on iris (four numbers in, no picture), as ONNX."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    classifier = LogisticRegression(max_iter=500).fit(features, labels)
    path = tmp_path_factory.mktemp("sklearn") / "iris.onnx"
    path.write_bytes(to_onnx(classifier, features[:1]).SerializeToString())
    return path


def config(tmp_path: Path, model: Path, postprocess: str) -> str:
    """A text detector's pipeline whose one attribute (lines 10-13) reads its objects with `model`."""
    return f"""\
device: {{id: box-1}}
registry: {{url: "file:///srv/registry"}}
state_dir: {tmp_path / "state"}
mqtt: {{host: 127.0.0.1, port: 1}}
pipelines:
  - name: dock
    model: {{name: pp-ocr-det, version: "4"}}
    source: {{type: video, uri: {tmp_path / "dock.mp4"}}}
    postprocess: {{type: regions}}
    attributes:
      - name: direction
        model: {{path: {model}}}
        postprocess: {postprocess}
"""


def test_a_voice_detector_as_an_attribute_model_is_no_image_reader(tmp_path: Path) -> None:
    vad = silero("silero_vad_half.onnx")
    code, lines = validate_cli(tmp_path, config(tmp_path, vad, "{type: classification}"))
    assert code == 1
    assert lines == [
        "12: pipelines[0].attributes[0].model: none of the model's inputs ('input' [batch, sequence], "
        f"'state' [2, batch, 128]) is an image: {IMAGE_ONLY}"
    ], lines


def test_a_table_classifier_as_an_attribute_model_is_no_image_reader(
    tmp_path: Path, sklearn_model: Path
) -> None:
    code, lines = validate_cli(tmp_path, config(tmp_path, sklearn_model, "{type: classification}"))
    assert code == 1
    assert lines == [
        "12: pipelines[0].attributes[0].model: the model's input 'X' [?, 4] float32 is not an image: "
        + IMAGE_ONLY
    ], lines


def test_a_classifier_s_labels_must_be_as_many_as_its_classes(tmp_path: Path, cls_model_path: Path) -> None:
    three = '{type: classification, softmax: false, labels: ["0", "90", "180"]}'
    code, lines = validate_cli(tmp_path, config(tmp_path, cls_model_path, three))
    assert code == 1
    assert lines == [
        "13: pipelines[0].attributes[0].postprocess.labels: "
        f"has 3 names but output {CLS_OUTPUT!r} has 2 classes"
    ], lines
    two = '{type: classification, softmax: false, labels: ["0", "180"]}'
    assert validate_cli(tmp_path, config(tmp_path, cls_model_path, two)) == (0, [])


def test_doctor_says_it_in_its_config_row(tmp_path: Path, sklearn_model: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(config(tmp_path, sklearn_model, "{type: classification}"))
    done = edge_agent("doctor", "-c", str(path), "--timeout", "2", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    row = {row["name"]: row for row in json.loads(done.stdout)["checks"]}["config"]
    assert row["status"] == "FAIL", row
    assert row["detail"] == (
        f"{path}:12: pipelines[0].attributes[0].model: the model's input 'X' [?, 4] float32 is not an "
        f"image: {IMAGE_ONLY}"
    ), row
