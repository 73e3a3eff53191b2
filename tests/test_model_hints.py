"""Preprocessing, recurrent state and labels from the model's manifest: the real PP-OCR direction
classifier published with its own preprocessing and labels runs in the daemon from a pipeline that
gives only a source and `postprocess: {type: classification}`, and classifies the real rendered
video right. The merge rules (YAML wins, key by key) and bad hints are checked on the config."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.config import AudioPreprocessConfig, PipelineConfig, PreprocessConfig, StateLink
from agent.errors import ModelError
from agent.model_hints import with_model_hints
from agent.registry.manifest import Manifest
from tests.agent_process import EDGE_AGENT, StartAgent, pipeline_state
from tests.media_fixtures import CLS_LABELS, demo_video_module

CLS_HINTS = {  # the classifier's own preprocessing, as PaddleOCR documents it
    "preprocess": {"color": "bgr", "mean": [0.5], "std": [0.5], "resize": {"width": 192, "height": 48}},
    "labels": CLS_LABELS,
}


def _manifest(metadata: dict[str, Any]) -> Manifest:
    return Manifest.model_validate(
        {
            "schema_version": 1,
            "name": "cls",
            "version": "1",
            "created": "2026-11-23T00:00:00Z",
            "artifacts": [{"file": "m.onnx", "sha256": "ab" * 32, "size": 1, "format": "onnx"}],
            "metadata": metadata,
        }
    )


def _pipeline(**overrides: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "door",
            "model": {"name": "cls", "version": "1"},
            "source": {"type": "video", "uri": "/dev/video0"},
            "postprocess": {"type": "classification"},
            **overrides,
        }
    )


def test_hints_fill_what_the_pipeline_leaves_out_and_the_yaml_wins_key_by_key() -> None:
    merged = with_model_hints(_pipeline(), _manifest(CLS_HINTS))
    assert isinstance(merged.preprocess, PreprocessConfig)
    assert (merged.preprocess.color, merged.preprocess.mean, merged.preprocess.std) == ("bgr", [0.5], [0.5])
    assert merged.preprocess.resize is not None and merged.preprocess.resize.width == 192
    assert merged.postprocess.labels == CLS_LABELS  # type: ignore[union-attr]

    own = _pipeline(preprocess={"color": "rgb"}, postprocess={"type": "classification", "labels": ["a", "b"]})
    merged = with_model_hints(own, _manifest(CLS_HINTS))
    assert merged.preprocess.color == "rgb" and merged.preprocess.mean == [0.5]  # type: ignore[union-attr]
    assert merged.postprocess.labels == ["a", "b"]  # type: ignore[union-attr]

    plain = _pipeline()
    assert with_model_hints(plain, _manifest({"provenance": "x"})) is plain  # no hints: untouched


def test_state_links_and_audio_settings_come_from_the_manifest() -> None:
    vad = _pipeline(
        source={"type": "audio", "uri": "speech.wav"},
        preprocess={"type": "audio"},
        postprocess={"type": "threshold", "on_score": 0.5, "off_score": 0.35},
    )
    hints = {
        "preprocess": {"type": "audio", "context": 64, "constants": {"sr": 16000}},
        "state": [{"input": "state", "output": "stateN"}],
    }
    merged = with_model_hints(vad, _manifest(hints))
    assert isinstance(merged.preprocess, AudioPreprocessConfig)
    assert merged.preprocess.context == 64 and merged.preprocess.constants == {"sr": 16000}
    assert merged.state == [StateLink(input="state", output="stateN")]
    declared = vad.model_copy(update={"state": []})
    declared.model_fields_set.add("state")  # the YAML says `state: []`: no state, whatever the manifest says
    assert with_model_hints(declared, _manifest(hints)).state == []


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"preprocess": "bgr"}, r"cls@1: metadata.preprocess must be an object"),
        (
            {"preprocess": {"colour": "bgr"}},
            r"the hints in cls@1's manifest do not fit it: preprocess.colour: ",
        ),
        ({"preprocess": {"std": [0]}}, r"preprocess: std values must not be 0"),
        ({"state": [{"input": "state"}]}, r"state\[0\].output: Field required"),
        ({"labels": "upright"}, r"postprocess.classification.labels: Input should be a valid list"),
        ({"preprocess": {"type": "audio"}}, r"preprocess.type: audio needs an audio, mqtt, replay or serial"),
    ],
)
def test_bad_hints_are_errors_that_name_the_manifest_and_key(metadata: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        with_model_hints(_pipeline(), _manifest(metadata))


def test_the_daemon_runs_a_pipeline_on_the_manifests_hints(
    tmp_path: Path, cls_model_path: Path, start_agent: StartAgent
) -> None:
    video = tmp_path / "signs.mp4"
    truth = demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    hints = tmp_path / "hints.json"
    hints.write_text(json.dumps(CLS_HINTS))
    registry = tmp_path / "registry"
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(cls_model_path), "--name", "cls", "--version", "1",
         "--metadata", str(hints), "--registry", f"file://{registry}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    config = {
        "device": {"id": "hinted"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": 1, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False},
        "pipelines": [  # no preprocess, no labels: the manifest has them
            {
                "name": "door",
                "model": {"name": "cls", "version": "1"},
                "source": {"type": "video", "uri": str(video)},
                "postprocess": {"type": "classification", "softmax": False},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    state_dir = tmp_path / "state"
    start_agent(path).run_until(lambda: pipeline_state(state_dir, "door") == "finished", "the video's end")
    with sqlite3.connect(f"file:{tmp_path / 'state' / 'outbox.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT payload FROM messages WHERE topic LIKE '%/results/%'").fetchall()
    payloads = [json.loads(row[0]) for row in rows]
    results = [p for p in payloads if "output" in p]
    assert len(results) >= 10, payloads[:3]
    right = 0
    for result in results:
        (top,) = result["output"]["top"]
        assert top["label"] in CLS_LABELS  # the manifest's labels
        position = result["source"]["position_s"]
        sign = next(t for t in truth if t["start_s"] <= position < t["end_s"])  # type: ignore[operator]
        right += top["label"] == sign["orientation"]
    assert right / len(results) >= 0.9, (right, len(results))  # the hinted preprocessing is the right one
