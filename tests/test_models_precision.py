"""`edge-agent models list` and `models inspect` show a reduced-precision variant for what it is: its
precision and the float model file it was made from (text and --json), on a version published as
`registry publish --quantize int8` publishes one (agent/registry/publish.py publish_with_variant)
and pulled into a store, with nudenet's real YOLOv8n (320n.onnx). The variant file is the float model
stamped as agent/quantize.py stamps a variant: what the quantizer makes is tests/test_int8.py's concern
(its session fixture quantizes for seconds and cannot be shared across modules); here only the manifest
and the file's own metadata matter. The float model's artifact shows neither field, as before."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.quantize import stamp_variant
from agent.registry import FileRegistry
from agent.registry.publish import publish_with_variant
from agent.store import ModelStore

NOTE = "precision: int8, made from 320n.onnx"


def _cli(*args: str) -> str:
    """`edge-agent ARGS` in process: stdout, after checking it exited 0 without a traceback."""
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout


def _json(*args: str) -> Any:
    return json.loads(_cli(*args, "--json"))


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """faces@1 (320n.onnx and its int8 variant 320n.int8.onnx) published to a folder registry and
    pulled into <state>/store."""
    spec = importlib.util.find_spec("nudenet")
    assert spec is not None and spec.submodule_search_locations, "nudenet==3.4.2 is not installed"
    root = tmp_path_factory.mktemp("precision")
    model = root / "320n.onnx"
    shutil.copyfile(Path(next(iter(spec.submodule_search_locations))) / "320n.onnx", model)
    registry = root / "registry"

    def stamp(float_model: Path, out: Path, _testdata: list[Path]) -> None:
        stamp_variant(float_model, out, float_model.name, "nothing")

    manifest, _digest, _made = publish_with_variant(f"file://{registry}", model, "faces", "1", stamp)
    assert manifest.artifact("320n.int8.onnx").precision == "int8"  # as --quantize int8 lists it
    ModelStore(root / "state" / "store").pull(FileRegistry(registry), "faces", "1")
    return root / "state"


def test_models_list_shows_the_variants_precision_and_what_it_was_made_from(state: Path) -> None:
    [version] = _json("models", "list", "--state-dir", str(state))
    by_file = {a["file"]: a for a in version["artifacts"]}
    assert set(by_file) == {"320n.onnx", "320n.int8.onnx"}
    variant, plain = by_file["320n.int8.onnx"], by_file["320n.onnx"]
    assert (variant["precision"], variant["made_from"], variant["format"]) == ("int8", "320n.onnx", "onnx")
    # The float model's row is as a version without variants lists it: no new keys.
    assert set(plain) == {"file", "format", "size", "sha256", "target"}
    text = _cli("models", "list", "--state-dir", str(state))
    assert f"faces@1 320n.int8.onnx ({NOTE})" in text, text
    assert text.count("precision:") == 1, text


def test_models_inspect_shows_the_variants_precision_and_what_it_was_made_from(state: Path) -> None:
    info = _json("models", "inspect", "faces@1", "--state-dir", str(state))
    by_file = {a["file"]: a for a in info["artifacts"]}
    assert (by_file["320n.int8.onnx"]["precision"], by_file["320n.int8.onnx"]["made_from"]) == (
        "int8",
        "320n.onnx",
    )
    assert "precision" not in by_file["320n.onnx"] and "made_from" not in by_file["320n.onnx"]
    # The variant file says the same in its own metadata.
    [props] = [m["metadata_props"] for m in info["models"] if m["file"] == "320n.int8.onnx"]
    assert (props["edge_agent.precision"], props["edge_agent.made_from"]) == ("int8", "320n.onnx")
    text = _cli("models", "inspect", "faces@1", "--state-dir", str(state))
    # Under the variant's own heading, not the float model's.
    variant_part = text.split("\n320n.int8.onnx: onnx, ", 1)[1]
    assert variant_part.splitlines()[1].strip() == NOTE, text
    assert NOTE not in text.split("\n320n.onnx: onnx, ", 1)[1].split("\n320n.int8.onnx: ", 1)[0]


def test_a_variant_file_inspected_by_path_says_what_it_is(state: Path, tmp_path: Path) -> None:
    # Copied out of the store, the file still says what it is (its own metadata).
    store = ModelStore(state / "store")
    installed = store.get("faces", "1")
    copy = tmp_path / "320n.int8.onnx"
    shutil.copyfile(installed.artifact_path(installed.manifest.artifact("320n.int8.onnx")), copy)
    [artifact] = _json("models", "inspect", str(copy), "--state-dir", str(tmp_path))["artifacts"]
    assert (artifact["precision"], artifact["made_from"]) == ("int8", "320n.onnx")
    assert NOTE in _cli("models", "inspect", str(copy), "--state-dir", str(tmp_path))
    float_copy = tmp_path / "320n.onnx"
    shutil.copyfile(installed.artifact_path(installed.manifest.artifact("320n.onnx")), float_copy)
    [plain] = _json("models", "inspect", str(float_copy), "--state-dir", str(tmp_path))["artifacts"]
    assert "precision" not in plain and "made_from" not in plain
