"""Labels from the model are checked like labels from the config (issue 34, item 1). A real detector
whose class names are only in its file's own metadata (nudenet's YOLOv8n 320n.onnx: FACE_FEMALE, ...;
no `postprocess.labels` in the YAML): a zone's `labels: [person]` is refused by `config validate`,
`doctor` and the daemon alike, each naming the config's file:line and the model's labels; a partial
`postprocess.labels` likewise, with the hint to delete it; a model that is not at hand (a registry
version not pulled yet) is said to be unchecked, not an error; `models inspect` lists every label.
Through the real CLI and the real daemon (`edge-agent run`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from agent.store import ModelStore
from tests.agent_process import StartAgent, pipeline_state, read_status
from tests.cli_runs import cli, cli_json, edge_agent


def _write(tmp_path: Path, pipeline: dict[str, Any], name: str = "agent.yaml", **top: Any) -> Path:
    """A config with one pipeline `door-cam`, a closed broker port (nothing listens on port 1)."""
    config = {
        "device": {"id": "shop"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": 1, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "backends": {"benchmark": False},
        **top,
        "pipelines": [{"name": "door-cam", **pipeline}],
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _door_cam(
    model: dict[str, Any], source: str, zone_labels: list[str], **postprocess: Any
) -> dict[str, Any]:
    return {
        "source": {"type": "video", "uri": source, "fps": 5},
        "model": model,
        "postprocess": {"type": "detection", "score_threshold": 0.3, **postprocess},
        "lines": [{"name": "door", "points": [[0.3, 0], [0.3, 1]]}],
        "zones": [{"name": "counter", "labels": zone_labels, "points": [[0.1, 0.1], [0.5, 0.1], [0.5, 0.5]]}],
    }


def _line_of(path: Path, text: str) -> int:
    """The 1-based line of the first line of `path` that contains `text`."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_config_validate_checks_zone_labels_against_the_model_file_s_own_names(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    assert "person" not in yolo_labels and "FACE_FEMALE" in yolo_labels
    config = _write(tmp_path, _door_cam({"path": str(yolo_path)}, str(tmp_path / "door.mp4"), ["person"]))
    out = cli("config", "validate", str(config), expect=1)
    line = _line_of(config, "- person")  # yaml.safe_dump writes the list in block style
    wanted = (
        f"error: {config}:{line}: pipelines[0].zones[0].labels[0]: 'person' is not one of the model's "
        f"labels ({', '.join(yolo_labels)})"
    )
    assert wanted in out.splitlines(), out
    assert "hint: the model's labels are in the model file's own metadata" in out, out
    assert "manifest" not in out  # nobody wrote one

    report = cli_json("config", "validate", str(config), expect=1)
    assert report["ok"] is False and report["errors"] == [wanted.removeprefix("error: ")]

    # A close name is suggested; a right one passes.
    close = _write(tmp_path, _door_cam({"path": str(yolo_path)}, "door.mp4", ["FACE_FEMAL"]), "close.yaml")
    assert "did you mean 'FACE_FEMALE'?" in cli("config", "validate", str(close), expect=1)
    good = _write(tmp_path, _door_cam({"path": str(yolo_path)}, "door.mp4", ["FACE_FEMALE"]), "good.yaml")
    assert cli("config", "validate", str(good)).startswith(f"OK: {good}")


def test_a_partial_postprocess_labels_is_refused_with_the_hint_to_use_the_model_s_own(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    pipeline = _door_cam({"path": str(yolo_path)}, "door.mp4", ["FACE_FEMALE"], labels=yolo_labels[:2])
    config = _write(tmp_path, pipeline)
    out = cli("config", "validate", str(config), expect=1)
    line = _line_of(config, "labels:")  # postprocess.labels comes before the zones
    wanted = (
        f"error: {config}:{line}: pipelines[0].postprocess.labels: 2 names for the model's 18 classes: "
        f"delete postprocess.labels to use the model's own names ({', '.join(yolo_labels)}), or name "
        "all 18 in the model's order"
    )
    assert wanted in out.splitlines(), out
    # All 18, renamed: the user's names are the labels then (the pipeline validator checks them).
    renamed = [f"class-{i}" for i in range(18)]
    ok = _write(
        tmp_path, _door_cam({"path": str(yolo_path)}, "d.mp4", ["class-1"], labels=renamed), "all.yaml"
    )
    assert cli("config", "validate", str(ok)).startswith("OK:")


def test_a_model_not_at_hand_is_said_unchecked_and_an_installed_version_is_checked(
    tmp_path: Path, yolo_path: Path, yolo_labels: list[str]
) -> None:
    registry = {"registry": {"url": f"file://{tmp_path / 'registry'}"}}
    pipeline = _door_cam({"name": "faces", "version": "1"}, "door.mp4", ["person"])
    config = _write(tmp_path, pipeline, **registry)
    out = cli("config", "validate", str(config))
    assert out.startswith(f"OK: {config}"), out
    assert (
        "note: pipelines[door-cam]: labels not checked against the model: faces@1 is not in the local "
        "store yet"
    ) in out, out
    report = cli_json("config", "validate", str(config))
    assert report["ok"] is True and len(report["labels_unchecked"]) == 1

    # Installed in the agent's store (as `models pull` or the daemon puts it): checked.
    ModelStore(tmp_path / "state" / "store").import_file(yolo_path, "faces", "1")
    out = cli("config", "validate", str(config), expect=1)
    assert (
        f"pipelines[0].zones[0].labels[0]: 'person' is not one of the model's labels ({yolo_labels[0]}" in out
    )
    assert "hint: the model's labels are in faces@1's manifest" not in out, (
        out
    )  # the file's, not the manifest's
    assert (
        "hint: the model's labels are in the model file's own metadata; edge-agent models inspect faces@1"
        in out
    )


def test_doctor_says_the_same_in_its_config_row(tmp_path: Path, yolo_path: Path) -> None:
    config = _write(tmp_path, _door_cam({"path": str(yolo_path)}, str(tmp_path / "door.mp4"), ["person"]))
    done = edge_agent("doctor", "-c", str(config), "--timeout", "2", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    line = _line_of(config, "- person")
    assert rows["config"]["status"] == "FAIL"
    unknown = "pipelines[0].zones[0].labels[0]: 'person' is not one of the model's labels (FEMALE_"
    assert rows["config"]["detail"].startswith(f"{config}:{line}: {unknown}"), rows["config"]
    assert "edge-agent models inspect" in rows["config"]["fix"]


def test_the_daemon_says_the_same_with_the_config_s_line(
    tmp_path: Path, yolo_path: Path, start_agent: StartAgent
) -> None:
    state_dir = tmp_path / "state"
    config = _write(tmp_path, _door_cam({"path": str(yolo_path)}, str(tmp_path / "door.mp4"), ["person"]))
    line = _line_of(config, "- person")
    log = start_agent(config).run_until(
        lambda: pipeline_state(state_dir, "door-cam") == "error",
        "the pipeline's refusal",
        exit_codes=(1,),  # no pipeline ran
    )
    located = f"{config}:{line}: pipelines[0].zones[0].labels[0]: 'person' is not one of the model's labels"
    assert located in log, log[-3000:]
    assert "manifest" not in log and "open size" not in log, log[-3000:]
    error = read_status(state_dir)["pipelines"]["door-cam"]["error"]
    assert error.startswith(located), error


def test_models_inspect_lists_every_label(yolo_path: Path, yolo_labels: list[str]) -> None:
    out = cli("models", "inspect", str(yolo_path))
    assert "labels (18, from the model file's own metadata):" in out, out
    listed = out.split("labels (18, from the model file's own metadata):")[1]
    for i, label in enumerate(yolo_labels):
        assert f"{i} {label}" in listed, (label, listed)
    assert cli_json("models", "inspect", str(yolo_path))["labels"] == {
        "names": yolo_labels,
        "source": "the model file's own metadata",
    }
