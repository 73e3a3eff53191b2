"""What a second model's answer is, per postprocess (agent/attribute_models.py `answer_of`): a plugin's
`value` and `score` (issue 36: "... or a plugin"), read by the real PP-OCR direction classifier on a real
crop through the reader's own path (`AttributeSet.read`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest

from agent.attribute_models import AttributeModel, AttributeSet, Job, answer_of
from agent.config import AttributeConfig, ModelRef, PreprocessConfig, ResizeConfig
from agent.stage import LoadedModel
from tests.plugin_fixtures import install_plugin
from tests.store_fixtures import CLS_MODEL_FILE
from tests.test_attributes_pipeline import PP_OCR_PIXELS, plate, session

PLUGIN = """
import numpy as np

def make(options, outputs):
    name = outputs[0].name

    def decode(values, geometry):
        upright, turned = (float(v) for v in np.asarray(values[name]).reshape(-1))
        return {"value": "upside down" if turned > upright else "upright", "score": max(upright, turned)}

    return decode
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    install_plugin(site, "sign-side", "sign_side", PLUGIN, {"sign-side": "sign_side:make"})
    monkeypatch.syspath_prepend(str(site))


def test_a_plugins_value_and_score_are_the_answer(plugin: None) -> None:
    attribute = AttributeConfig(
        name="side",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        preprocess=PreprocessConfig(
            resize=ResizeConfig(width=192, height=48, mode="height"), **PP_OCR_PIXELS
        ),
        postprocess={"type": "plugin", "name": "sign-side"},
    )
    loaded = LoadedModel("pp-ocr-cls", "2.0", "", session(CLS_MODEL_FILE))
    loaded.acquire()
    models = AttributeSet("signs", [AttributeModel.of(attribute, loaded)])
    try:
        upright = plate("GATE 42")
        jobs = [
            Job(i, crop, (0.0, 0.0, float(crop.shape[1]), float(crop.shape[0])), [0], {}, 0.0)
            for i, crop in enumerate((upright, cv2.rotate(upright, cv2.ROTATE_180)))
        ]
        readings = models.read(jobs)
    finally:
        models.release()
    assert [(r.track_id, r.value) for r in readings] == [(0, "upright"), (1, "upside down")]
    assert all(r.score is not None and r.score > 0.9 for r in readings)


def test_each_kind_of_answer() -> None:
    top = {"top": [{"index": 1, "label": None, "score": 0.75}]}
    assert answer_of(top) == ("1", 0.75)  # a classifier without labels answers its class's index
    assert answer_of({"text": "KX42BRT", "score": 0.97}) == ("KX42BRT", 0.97)
    assert answer_of({"embedding": [0.6, 0.8], "norm": 1.0}) == ([0.6, 0.8], None)
    assert answer_of({"colour": "red"}) == ({"colour": "red"}, None)  # a plugin without `value`: all of it
