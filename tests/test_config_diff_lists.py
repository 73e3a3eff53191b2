"""`edge-agent config diff` shows what changed inside lists (issue 34, item 5): a moved line is its
points, old -> new, under its name (`lines[door].points`), not the whole `lines` list shortened
alike on both sides; a zone added or removed is named; a list that only changed order is one
change. Through the CLI, on two real config files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli_runs import cli, cli_json

DOOR = {"name": "door", "points": [[0.3, 0], [0.3, 1]], "in": "entering", "out": "leaving"}
COUNTER = {"name": "counter", "points": [[0.5, 0.5], [0.9, 0.5], [0.9, 0.9], [0.5, 0.9]], "dwell_s": 30}
QUEUE = {"name": "queue", "points": [[0.1, 0.1], [0.4, 0.1], [0.4, 0.4]]}


def _config(tmp_path: Path, name: str, lines: list[Any], zones: list[Any]) -> Path:
    config = {
        "device": {"id": "shop"},
        "state_dir": str(tmp_path / "state"),
        "registry": {"url": "file:///srv/registry"},
        "pipelines": [
            {
                "name": "door-cam",
                "model": {"name": "people", "version": "1"},
                "source": {"type": "video", "uri": "rtsp://127.0.0.1/door"},
                "postprocess": {"type": "detection"},
                "lines": lines,
                "zones": zones,
            }
        ],
    }
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_a_moved_line_shows_its_points_and_added_or_removed_zones_are_named(tmp_path: Path) -> None:
    running = _config(tmp_path, "running.yaml", [DOOR], [COUNTER, QUEUE])
    moved = {**DOOR, "points": [[0.85, 0], [0.85, 1]]}
    longer = {**COUNTER, "dwell_s": 45}
    edited = _config(tmp_path, "edited.yaml", [moved], [longer, {**QUEUE, "name": "exit-queue"}])

    out = cli("config", "diff", str(edited), "--against", str(running))
    lines = [line.strip() for line in out.splitlines()]
    assert (
        "~ pipeline door-cam: lines[door].points: [[0.3, 0.0], [0.3, 1.0]] -> [[0.85, 0.0], [0.85, 1.0]]"
        in lines
    )
    assert "~ pipeline door-cam: zones[counter].dwell_s: 30.0 -> 45.0" in lines, lines
    removed = next(line for line in lines if line.startswith("~ pipeline door-cam: zones[queue]: "))
    assert removed.startswith('~ pipeline door-cam: zones[queue]: {"name": "queue", ') and removed.endswith(
        "-> (none)"
    ), removed
    assert any(line.startswith("~ pipeline door-cam: zones[exit-queue]: (none) -> {") for line in lines), (
        lines
    )
    assert not any(line.startswith("~ pipeline door-cam: lines:") for line in lines), lines

    report = cli_json("config", "diff", str(edited), "--against", str(running))
    assert report["pipelines"]["changed"] == {
        "door-cam": ["zones[counter].dwell_s", "zones[queue]", "zones[exit-queue]", "lines[door].points"]
    }
    values = {v["key"]: v["change"] for v in report["values"]}
    assert (
        values["pipelines.door-cam.lines[door].points"]
        == "[[0.3, 0.0], [0.3, 1.0]] -> [[0.85, 0.0], [0.85, 1.0]]"
    )


def test_zones_that_only_changed_order_are_one_change(tmp_path: Path) -> None:
    running = _config(tmp_path, "running.yaml", [DOOR], [COUNTER, QUEUE])
    swapped = _config(tmp_path, "swapped.yaml", [DOOR], [QUEUE, COUNTER])
    report = cli_json("config", "diff", str(swapped), "--against", str(running))
    assert report["pipelines"]["changed"] == {"door-cam": ["zones"]}
    same = cli("config", "diff", str(running), "--against", str(running))
    assert "no changes" in same
