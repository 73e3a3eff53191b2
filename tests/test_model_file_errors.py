"""A model file that is not a loadable model is named as the user knows it: the file given to
`registry publish` or by `model.path`, the artifact and NAME@VERSION of a registry version; never
the temp copy or partial download the check ran on (issue 26). Through the CLI, with a real model
cut short (the runtime's reason quotes the path it read) and a file registry on disk."""

from __future__ import annotations

import json
from pathlib import Path

from agent.registry import FileRegistry
from tests.cli_runs import edge_agent
from tests.media_fixtures import CLS_PREPROCESS
from tests.store_fixtures import publish_by_hand


def _cut_short(cls_model_path: Path, to: Path) -> Path:
    """The real classifier's first 200 kB: the ONNX parser gives up and names the file it read."""
    to.write_bytes(cls_model_path.read_bytes()[:200_000])
    return to


def _config(tmp_path: Path, registry: Path, model: dict[str, str]) -> Path:
    config = {
        "device": {"id": "errors-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1"},
        "registry": {"url": registry.as_uri()},
        "pipelines": [
            {
                "name": "cam",
                "model": model,
                "source": {"type": "video", "uri": "file:///dev/null"},
                "preprocess": CLS_PREPROCESS.model_dump(),
                "postprocess": {"type": "classification"},
            }
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))
    return path


def test_publishing_a_corrupt_onnx_names_the_file_and_version_not_a_temp_copy(
    tmp_path: Path, cls_model_path: Path
) -> None:
    corrupt = _cut_short(cls_model_path, tmp_path / "corrupt.onnx")
    registry = tmp_path / "registry"
    result = edge_agent(
        "registry", "publish", str(corrupt), "--name", "cls", "--version", "3",
        "--registry", registry.as_uri(),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    error = result.stderr
    assert f"error: refusing to publish {corrupt} as cls@3: " in error
    assert "is not a valid ONNX model: Unable to parse proto from file: corrupt.onnx" in error
    assert ".tmp-" not in error and str(registry) not in error, error
    assert not (registry / "cls" / "3" / "manifest.json").exists()


def test_pulling_a_corrupt_version_names_the_artifact_and_version_not_the_store(
    tmp_path: Path, file_registry: FileRegistry, cls_model_path: Path
) -> None:
    data = cls_model_path.read_bytes()[:200_000]
    publish_by_hand(file_registry, "half", "1", "model.onnx", data)
    config = _config(tmp_path, file_registry.root, {"name": "half", "version": "1"})
    result = edge_agent("models", "pull", "half@1", "-c", str(config))
    assert result.returncode == 1
    error = result.stderr
    assert f"FAILED: half@1: artifact model.onnx of half@1 from registry {file_registry.url}: " in error
    assert "model.onnx is not a valid ONNX model: Unable to parse proto from file: model.onnx" in error
    store = tmp_path / "state" / "store"
    assert ".tmp-" not in error and ".partial" not in error and str(store) not in error, error


def test_a_corrupt_model_path_is_named_as_the_user_gave_it(tmp_path: Path, cls_model_path: Path) -> None:
    corrupt = _cut_short(cls_model_path, tmp_path / "notes.onnx")
    config = _config(tmp_path, tmp_path / "registry", {"name": "notes", "path": str(corrupt)})
    result = edge_agent("models", "pull", "-c", str(config), "--json")
    assert result.returncode == 1
    (row,) = json.loads(result.stdout)
    assert row["name"] == "notes" and row["source"] == "file" and not row["ok"]
    assert row["error"].startswith(
        f"model file {corrupt} for notes@local: notes.onnx is not a valid ONNX model: "
        "Unable to parse proto from file: notes.onnx"
    )
    assert ".tmp-" not in row["error"] and str(tmp_path / "state") not in row["error"], row["error"]
