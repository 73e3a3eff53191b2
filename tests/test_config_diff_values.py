"""`edge-agent config diff` shows each changed key as old -> new (issue 26): long values shortened,
secrets never shown (SecretStr fields masked, a password in a camera's URL replaced). Through the
CLI, on two real config files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli_runs import edge_agent

LONG = "file:///srv/videos/" + "a-very-long-folder-name/" * 6 + "entrance.mp4"


def _config(tmp_path: Path, name: str, threshold: float, password: str, camera: str, uri: str) -> Path:
    config: dict[str, Any] = {
        "device": {"id": "diff-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "username": "box", "password": password},
        "registry": {"url": "file:///srv/registry"},
        "pipelines": [
            {
                "name": "faces",
                "model": {"name": "faces", "version": "1"},
                "source": {"type": "video", "uri": camera},
                "postprocess": {"type": "detection", "score_threshold": threshold},
            },
            {
                "name": "door",
                "model": {"name": "door", "version": "1"},
                "source": {"type": "video", "uri": uri},
                "postprocess": {"type": "classification"},
            },
        ],
    }
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_config_diff_shows_old_and_new_values_with_secrets_masked(tmp_path: Path) -> None:
    running = _config(tmp_path, "running.yaml", 0.5, "hunter2", "rtsp://cam:s3cret@10.0.0.7/live", "x.mp4")
    edited = _config(tmp_path, "edited.yaml", 0.7, "hunter3", "rtsp://cam:s3cret2@10.0.0.8/live", LONG)

    text = edge_agent("config", "diff", str(edited), "--against", str(running))
    assert text.returncode == 0, text.stderr
    lines = [line.strip() for line in text.stdout.splitlines()]
    assert "~ pipeline faces: postprocess.score_threshold: 0.5 -> 0.7" in lines
    moved = "rtsp://cam:***@10.0.0.7/live -> rtsp://cam:***@10.0.0.8/live"
    assert f"~ pipeline faces: source.uri: {moved}" in lines
    shortened = f"~ pipeline door: source.uri: x.mp4 -> {LONG[:57]}..."
    assert shortened in lines, lines
    assert "! mqtt.password: (a secret; changed) (needs a restart: systemctl restart edge-agent)" in lines

    as_json = edge_agent("config", "diff", str(edited), "--against", str(running), "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["pipelines"]["changed"] == {"faces": ["source.uri", "postprocess.score_threshold"],
                                              "door": ["source.uri"]}  # fmt: skip
    values = {v["key"]: v["change"] for v in report["values"]}
    assert values["pipelines.faces.postprocess.score_threshold"] == "0.5 -> 0.7"
    assert values["mqtt.password"] == "(a secret; changed)"

    for shown in (text.stdout, as_json.stdout):
        for secret in ("hunter2", "hunter3", "s3cret"):
            assert secret not in shown
