"""`edge-agent config validate`'s messages without pydantic's words (issue 34, item 12): each problem is
one plain sentence, at its file:line and key, saying what the key expects: a point of three numbers
("Tuple should have at most 2 items after validation" before), a flat list of numbers for a zone's
points (one "Input should be a valid tuple" line per number before), and a YAML `yes` where a label
is meant (told to quote it 'e.g. "2.0"' before)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from agent.cli import app

HEAD = """\
device: {id: box-1}
pipelines:
  - name: door
    model: {path: /opt/m.onnx}
    source: {type: video, uri: /srv/door.mp4}
"""  # the pipeline's next keys are on lines 6 on
POINTS = "each two numbers between 0 and 1"


def validate(tmp_path: Path, body: str) -> tuple[int, list[str]]:
    """Exit code and the problem lines (without `error: `) of `config validate` on HEAD + body."""
    path = tmp_path / "agent.yaml"
    path.write_text(HEAD + body, encoding="utf-8")
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    assert "Traceback" not in result.output
    found = [line.removeprefix("error: ") for line in result.output.splitlines() if f"{path}:" in line]
    return result.exit_code, [line.replace(f"{path}:", "agent.yaml:") for line in found]


def test_a_point_of_three_numbers(tmp_path: Path) -> None:
    body = """\
    postprocess: {type: detection, labels: [person]}
    lines:
      - name: door
        points: [[0.3, 0], [0.3, 1, 0]]
"""
    assert validate(tmp_path, body) == (
        1,
        [
            f"agent.yaml:9: pipelines[0].lines[0].points: expected a list of [x, y] points, {POINTS}, "
            "got [0.3, 1, 0] as point 1"
        ],
    )


def test_a_flat_list_of_numbers_is_one_problem(tmp_path: Path) -> None:
    body = """\
    postprocess: {type: detection, labels: [person]}
    zones:
      - name: counter
        units: pixels
        points: [100, 400, 300, 400, 300, 700, 100, 700]
"""
    assert validate(tmp_path, body) == (
        1,
        [
            "agent.yaml:10: pipelines[0].zones[0].points: expected a list of [x, y] points, each two "
            "numbers (pixels), got a flat list of 8 numbers: pair them, [[100, 400], [300, 400], ...]"
        ],
    )


def test_a_yaml_yes_where_a_label_is_meant(tmp_path: Path) -> None:
    body = """\
    postprocess: {type: detection, labels: [person, yes, 2.10]}
"""
    assert validate(tmp_path, body) == (
        1,
        [
            "agent.yaml:6: pipelines[0].postprocess.labels[1]: expected a string, got true (YAML reads yes "
            'unquoted as true): write it in quotes, "yes"',
            "agent.yaml:6: pipelines[0].postprocess.labels[2]: expected a string, got the number 2.1 (YAML "
            'reads 2.10 unquoted as 2.1): write it in quotes, "2.10"',
        ],
    )


def test_text_where_a_number_or_true_false_is_meant(tmp_path: Path) -> None:
    body = """\
    postprocess: {type: detection, labels: [person]}
    zones:
      - name: counter
        points: [[0.1, 0.5], ["0.4", 0.5], [0.4, 0.9]]
        min_frames: "3"
    track: {per_label: "no"}
"""
    assert validate(tmp_path, body) == (
        1,
        [
            'agent.yaml:9: pipelines[0].zones[0].points[1][0]: expected a number, got the text "0.4": '
            "write it without quotes",
            'agent.yaml:10: pipelines[0].zones[0].min_frames: expected a whole number, got the text "3": '
            "write it without quotes",
            'agent.yaml:11: pipelines[0].track.per_label: expected true or false, got the text "no": '
            "write true or false without quotes",
        ],
    )
