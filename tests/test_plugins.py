"""Postprocessor plugins found through the `edge_agent.postprocessors` entry-point group: the example
package of docs/plugins.md, installed as a real distribution (dist-info with entry_points.txt) on a
temporary path, run on a real model's outputs; and the ways a plugin can be wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.config import PluginPostprocess
from agent.errors import ModelError
from agent.processing import build_postprocessor
from providers import TensorSpec
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import cls_artifact
from tests.plugin_fixtures import install_plugin

EXAMPLE = """
import numpy as np

def make(options, outputs):
    digits = int(options.get("digits", 4))
    name = outputs[0].name

    def decode(values, geometry):
        return {"max": round(float(np.max(values[name])), digits)}

    return decode

def broken(options, outputs):
    raise ValueError("option 'threshold' is required")

def not_callable(options, outputs):
    return 42

def returns_a_list(options, outputs):
    return lambda values, geometry: [1, 2]
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example package, installed the way pip leaves it: the module plus its dist-info."""
    site = tmp_path / "site"
    entry_points = {
        "max-score": "max_score_plugin:make",
        "broken": "max_score_plugin:broken",
        "not-callable": "max_score_plugin:not_callable",
        "returns-a-list": "max_score_plugin:returns_a_list",
        "missing-module": "no_such_module:make",
    }
    install_plugin(site, "max-score-plugin", "max_score_plugin", EXAMPLE, entry_points)
    monkeypatch.syspath_prepend(str(site))


def test_the_documented_example_decodes_a_real_models_outputs(installed: None, cls_model_path: Path) -> None:
    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    try:
        post = build_postprocessor(
            PluginPostprocess(type="plugin", name="max-score", options={"digits": 3}), session.outputs
        )
        outputs = session.run({"x": np.zeros((1, 3, 48, 192), np.float32)})
    finally:
        session.close()
    result = post(outputs)
    expected = round(float(next(iter(outputs.values())).max()), 3)
    assert result == {"max": expected} and 0.5 <= expected <= 1.0  # a probability of two classes


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", r"no postprocessor plugin named 'nope' \(installed in edge_agent.postprocessors: broken, "),
        ("broken", r"plugin 'broken' failed to set up: ValueError: option 'threshold' is required"),
        ("not-callable", r"plugin 'not-callable' returned int, not a callable"),
        ("missing-module", r"plugin 'missing-module' failed to set up: ModuleNotFoundError"),
    ],
)
def test_a_plugin_that_is_missing_or_wrong_is_a_clear_error(installed: None, name: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        build_postprocessor(PluginPostprocess(type="plugin", name=name), [TensorSpec("y", (1, 2), "float32")])


def test_a_plugin_result_that_is_not_a_dict_fails_the_frame(installed: None) -> None:
    post = build_postprocessor(
        PluginPostprocess(type="plugin", name="returns-a-list"), [TensorSpec("y", (1, 2), "float32")]
    )
    with pytest.raises(ModelError, match="plugin 'returns-a-list' returned list, not a dict"):
        post({"y": np.zeros((1, 2), np.float32)})
