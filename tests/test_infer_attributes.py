"""`edge-agent infer CLIP --track --pipeline P` on a pipeline with `attributes:`, for real: the PP-OCR chain
from the rapidocr wheel (text detector -> direction classifier -> recognizer, each a model file) on the
rendered two-sign clip of tests/test_attributes_pipeline.py ("Hello World" upright, "GATE 42" upside
down, both crossing a line), through the CLI in-process.

- --json: each sign's crossing and end carry its direction and its text, read right (the upside-down
  one turned back by the classifier's answer first); each sign was read once per attribute; the
  result's `attributes` says where each second model ran and what it read.
- People read a `read` line when an answer arrives and the attributes on the crossing and end lines.
- --draw OUT.jpg: the picture's captions carry the text read (drawn: the caption is wider than the
  same box's caption without attributes).
- A second model that cannot load is left out and said; the detector's events come anyway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from agent.cli import app
from agent.cli.render.infer import attribute_lines, event_line
from agent.processing.drawing import caption_of, draw_boxes, track_colour
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.test_attributes_pipeline import PP_OCR_PIXELS, two_signs

__all__ = ["two_signs"]  # the clip fixture, rendered once for this module

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
DET, REC = "ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"


def signs_pipeline(clip: Path, cls_model: str = CLS_MODEL_FILE) -> dict[str, Any]:
    """The rapidocr chain as the example config's `text-finder` names it, each model by its file."""
    models = rapidocr_models_dir()
    return {
        "name": "signs",
        "model": {"path": str(models / DET)},
        "source": {"type": "video", "uri": str(clip)},
        "preprocess": {"resize": {"width": 640, "height": 352, "mode": "letterbox"}, **PP_OCR_PIXELS},
        "postprocess": {"type": "regions", "unclip_ratio": 1.5},
        "lines": [{"name": "middle", "points": [[0.5, 0.0], [0.5, 1.0]], "in": "east", "out": "west"}],
        "attributes": [
            {
                "name": "direction",
                "model": {"path": str(models / cls_model)},
                "crop": {"padding": 0.2},
                "preprocess": {"resize": {"width": 192, "height": 48, "mode": "height"}, **PP_OCR_PIXELS},
                "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
            },
            {
                "name": "text",
                "model": {"path": str(models / REC)},
                "crop": {"padding": 0.2, "rotate_by": "direction"},
                "preprocess": {"resize": {"width": 320, "height": 48, "mode": "height"}, **PP_OCR_PIXELS},
                "postprocess": {"type": "ctc"},
            },
        ],
    }


def write_config(folder: Path, pipeline: dict[str, Any]) -> Path:
    path = folder / "agent.yaml"
    settings = {
        "device": {"id": "ocr-box"},
        "state_dir": str(folder / "state"),
        "backends": {"benchmark": False},
    }
    path.write_text(yaml.safe_dump({**settings, "pipelines": [pipeline]}, sort_keys=False))
    return path


def track(config: Path, clip: Path, *extra: str) -> Any:
    args = ["infer", str(rapidocr_models_dir() / DET), str(clip), "--track", "--pipeline", "signs"]
    return CliRunner().invoke(app, [*args, "-c", str(config), *extra], env=ENV)


@pytest.fixture(scope="module")
def tracked(two_signs: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One --json run, with --draw OUT.jpg (the frame with the most tracked objects)."""
    folder = tmp_path_factory.mktemp("infer-attributes")
    config = write_config(folder, signs_pipeline(two_signs))
    drawn = folder / "signs.jpg"
    result = track(config, two_signs, "--json", "--draw", str(drawn))
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    data["_drawn"] = drawn
    return data


def by_sign(events: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The `kind` events' objects' attributes, by the sign's text read without its spaces (PP-OCR's
    recognizer reads Hershey's 'GATE 42' as 'GATE42': the gap before the digits is narrow)."""
    found = [e for e in events if e["type"] == kind]
    return {
        e["object"]["attributes"]["text"]["value"].replace(" ", ""): e["object"]["attributes"] for e in found
    }


def test_each_signs_crossing_and_end_carry_its_direction_and_text(tracked: dict[str, Any]) -> None:
    events = tracked["events"]
    assert [e["direction"] for e in events if e["type"] == "cross"] == ["east", "east"]
    for kind in ("cross", "end"):
        signs = by_sign(events, kind)
        assert sorted(signs) == ["GATE42", "HelloWorld"], (kind, signs)
        assert signs["HelloWorld"]["text"]["value"] == "Hello World"
        assert signs["HelloWorld"]["direction"]["value"] == "0"
        assert signs["GATE42"]["direction"]["value"] == "180"  # turned back before it was read
        assert all(a["runs"] == 1 for sign in signs.values() for a in sign.values())
    # Each answer came as its object's update before the crossing (the clip is long enough).
    reads = [e for e in events if e["type"] == "update" and e["changed"] == ["attributes"]]
    assert {e["object"]["id"] for e in reads} == {e["object"]["id"] for e in events if e["type"] == "cross"}
    shown = tracked["attributes"]
    assert set(shown) == {"direction", "text"}
    for name in ("direction", "text"):
        assert shown[name]["backend"] and shown[name]["why"], shown[name]
        assert (
            shown[name]["tracks"] == 2
            and shown[name]["answered"] == 2
            and shown[name]["reads_per_track"] == 1
        )
    assert shown["text"]["model"] == f"{REC}@file"


def test_the_drawn_picture_captions_each_sign_with_its_text(tracked: dict[str, Any]) -> None:
    drawn = cv2.imread(str(tracked["_drawn"]))
    assert drawn is not None and drawn.shape[:2] == (360, 640)
    assert "frame 39, 2 tracked object(s)" in tracked["drawn"]["note"]  # the last frame: the end's boxes
    # Each sign's caption is a strip of its track's colour above its box. 'object #1 0.99' alone is
    # narrower than the sign; with '| direction: ..; text: ..' it reaches well past the box's right edge.
    for end in (e for e in tracked["events"] if e["type"] == "end"):
        _, y1, x2, _ = (round(v) for v in end["object"]["box"])
        strip = drawn[max(y1 - 30, 0) : y1, x2 + 30 :].astype(int)
        near = np.abs(strip - np.array(track_colour(end["object"]["id"]))).sum(axis=2) < 60
        assert near.sum() > 300, (end["object"], int(near.sum()))


def test_a_caption_carries_the_attributes_read() -> None:
    entry = {"label": "sign", "track_id": 3, "score": 0.91, "box": [40, 60, 240, 100]}
    read = {
        **entry,
        "attributes": {
            "direction": {"value": "180", "score": 0.99, "at": "2026-11-29T06:00:00Z", "runs": 1},
            "text": {"value": "GATE 42", "score": 0.97, "at": "2026-11-29T06:00:00Z", "runs": 1},
            "face": {"value": [0.1] * 128, "score": None, "at": "2026-11-29T06:00:00Z", "runs": 1},
        },
    }
    assert caption_of(entry) == "sign #3 0.91"
    assert caption_of(read) == "sign #3 0.91 | direction: 180; text: GATE 42; face: [128 values]"
    assert caption_of({**entry, "attributes": {"text": {"value": "出口 7"}}}) == "sign #3 0.91 | text: ?? 7"
    # Drawn: the caption's strip reaches further right with the text than without it.
    blank = np.full((200, 640, 3), 90, np.uint8)
    plain, captioned = draw_boxes(blank, [entry]), draw_boxes(blank, [read])
    assert (captioned != plain).any(axis=2)[:, 250:].sum() > 500


def test_people_read_each_answer_and_the_attributes_on_their_events(tracked: dict[str, Any]) -> None:
    """The lines `infer --track` prints for the run's events and its end (agent/cli/render/infer.py)."""
    lines = [line for line in map(event_line, tracked["events"]) if line is not None]
    cross = [line for line in lines if "  cross  " in line]
    assert len(cross) == 2 and any(line.endswith("| direction: 180; text: GATE42") for line in cross), lines
    reads = [line for line in lines if "  read   " in line]
    assert len(reads) >= 2 and all(" | direction: " in line for line in reads), lines
    at_start = attribute_lines(tracked["attributes"])
    assert at_start[1].startswith("attribute text: ch_PP-OCRv4_rec_infer.onnx@file on "), at_start
    at_end = attribute_lines(tracked["attributes"], read=True)
    assert "2 crop(s) read, 2 answer(s) on 2 track(s), 1 reading(s) a track" in at_end[1], at_end


def test_a_second_model_that_cannot_load_is_left_out_and_said(two_signs: Path, tmp_path: Path) -> None:
    broken = tmp_path / "cls.onnx"
    broken.write_bytes(b"not an onnx model")
    pipeline = signs_pipeline(two_signs)
    pipeline["attributes"][0]["model"] = {"path": str(broken)}
    config = write_config(tmp_path, pipeline)
    result = track(config, two_signs, "--json", "--seconds", "1.5")  # (the signs are found and read by then)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "cannot serve" in data["attributes"]["direction"]["error"]
    assert "attribute direction left out" in data["note"]
    # The detector's events came anyway, and the recognizer read on (the crop not turned back).
    assert [e["type"] for e in data["events"]].count("new") == 2
    assert data["attributes"]["text"]["answered"] == 2


def test_one_frame_without_track_says_the_attributes_need_it(two_signs: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, signs_pipeline(two_signs))
    args = ["infer", str(rapidocr_models_dir() / DET), str(two_signs), "--frame", "5", "--pipeline", "signs"]
    result = CliRunner().invoke(app, [*args, "-c", str(config), "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["output"]["regions"]) == 2
    assert (
        "the pipeline's attributes (direction, text) read tracked objects: --track runs them" in data["note"]
    )
