"""The motion gate's config (`motion:`, agent/config/motion.py): on by default for live cameras and off
for files and non-video sources, true/false/a mapping, and what `edge-agent config validate` says about a
bad one, at its line and key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agent.config import MotionConfig, PipelineConfig
from agent.config.sources import is_live_video
from tests.config_cases import assert_both_accept, assert_both_reject, validate_cli

HEAD = """\
device: {id: box-1}
pipelines:
  - name: cam
    model: {path: /opt/m.onnx}
"""  # the pipeline's source on line 5, its other keys from line 6 on
FILE = "    source: {type: video, uri: /srv/v.mp4}\n"
AUDIO = "    source: {type: audio, uri: default}\n"
DETECTION = "    postprocess: {type: detection, labels: [person, car]}\n"
AUDIO_PRE = (
    "    preprocess: {type: audio}\n    postprocess: {type: classification, labels: [speech, noise]}\n"
)


def pipeline(uri: str, motion: object = None) -> PipelineConfig:
    data: dict[str, object] = {
        "name": "cam",
        "model": {"path": "/opt/m.onnx"},
        "source": {"type": "video", "uri": uri},
        "postprocess": {"type": "detection"},
    }
    if motion is not None:
        data["motion"] = motion
    return PipelineConfig.model_validate(data)


@pytest.mark.parametrize(
    "uri",
    ["0", "/dev/video2", "rtsp://127.0.0.1:8554/cam", "http://127.0.0.1/mjpeg", "gst:videotestsrc ! appsink"],
)
def test_the_gate_is_on_by_default_for_a_live_camera(uri: str) -> None:
    assert is_live_video(uri)
    assert pipeline(uri).motion_gate == MotionConfig()
    assert pipeline(uri, False).motion_gate is None


def test_the_gate_is_off_by_default_for_a_file_and_on_when_asked() -> None:
    assert pipeline("/srv/v.mp4").motion_gate is None
    assert pipeline("/srv/v.mp4", True).motion_gate == MotionConfig()
    tuned = pipeline(
        "/srv/v.mp4", {"threshold": 40, "keepalive_s": 2, "masks": [{"points": [[0, 0], [1, 0], [1, 0.1]]}]}
    )
    assert tuned.motion_gate is not None
    assert (tuned.motion_gate.threshold, tuned.motion_gate.keepalive_s) == (40, 2)
    assert tuned.motion_gate.regions is False and tuned.motion_gate.max_regions == 4
    assert tuned.motion_gate.full_frame_above == 0.5


# name: (source line, pipeline keys after the source, ["line: key: message", ...])
BAD: dict[str, tuple[str, str, list[str]]] = {
    "motion_on_an_audio_source": (
        AUDIO,
        AUDIO_PRE + "    motion: true\n",
        ["8: pipelines[0].motion: the motion gate needs pictures: a video source, not audio"],
    ),
    "a_mask_whose_edges_cross": (
        FILE,
        DETECTION
        + textwrap.indent(
            textwrap.dedent(
                """\
                motion:
                  masks:
                    - points: [[0, 0], [1, 1], [1, 0], [0, 1]]
                """
            ),
            "    ",
        ),
        [
            "9: pipelines[0].motion.masks[0].points: edge 0-1 meets edge 2-3: a mask's edges must not "
            "cross or touch (list the corners in order around the mask)"
        ],
    ),
    "a_mask_in_pixels_written_as_fractions": (
        FILE,
        DETECTION + "    motion:\n      masks:\n        - points: [[0, 0], [640, 0], [640, 40]]\n",
        [
            "9: pipelines[0].motion.masks[0].points: point 1 (640, 0) is outside the frame: with units: "
            "fraction (the default) coordinates are 0..1 of the frame's width and height; write units: "
            "pixels for pixels"
        ],
    ),
    "an_unknown_method": (
        FILE,
        DETECTION + "    motion: {method: optical_flow}\n",
        ["7: pipelines[0].motion.method: Input should be 'average' or 'mog2' (got 'optical_flow')"],
    ),
    "a_relearn_fraction_above_1": (
        FILE,
        DETECTION + "    motion:\n      relearn_above: 1.5\n",
        ["8: pipelines[0].motion.relearn_above: Input should be less than or equal to 1 (got 1.5)"],
    ),
    "an_area_in_pixels_written_as_a_fraction": (
        FILE,
        DETECTION + "    motion:\n      min_area: 400\n",
        [
            "8: pipelines[0].motion.min_area: min_area 400 is more than the whole frame: with units: "
            "fraction (the default) areas are 0..1 of the frame's area; write units: pixels for square pixels"
        ],
    ),
    "regions_on_a_classifier": (
        FILE,
        "    postprocess: {type: classification, labels: [person, car]}\n    motion: {regions: true}\n",
        [
            "7: pipelines[0].motion.regions: motion regions need postprocess type detection (the boxes "
            "of its crops are merged), not classification"
        ],
    ),
    "a_misspelt_key": (
        FILE,
        DETECTION + "    motion:\n      keep_alive_s: 5\n",
        [
            "8: pipelines[0].motion.keep_alive_s: unknown key; did you mean 'keepalive_s'? (allowed here: "
            "dilation, enabled, frame_height, full_frame_above, keepalive_s, learning_rate, masks, "
            "max_regions, method, min_area, regions, relearn_above, threshold, units)"
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_motion_config_is_reported_at_its_line_and_key(tmp_path: Path, case: str) -> None:
    source, body, expected = BAD[case]
    code, lines = validate_cli(tmp_path, HEAD + source + body)
    assert code != 0
    assert lines == expected


def test_a_good_motion_config_validates(tmp_path: Path) -> None:
    body = DETECTION + textwrap.indent(
        textwrap.dedent(
            """\
            motion:
              method: mog2
              frame_height: 100
              units: pixels
              min_area: 400
              masks:
                - units: pixels
                  points: [[1100, 0], [1280, 0], [1280, 40], [1100, 40]]
            """
        ),
        "    ",
    )
    assert validate_cli(tmp_path, HEAD + FILE + body) == (0, [])


@pytest.mark.parametrize(
    "motion", ["true", "false", "{}", "{method: mog2, masks: []}", "{units: pixels, min_area: 400}"]
)
def test_the_validator_and_the_schema_both_accept_motion_as_a_switch_or_settings(motion: str) -> None:
    assert_both_accept(HEAD + FILE + DETECTION + f"    motion: {motion}\n", f"motion: {motion}")


@pytest.mark.parametrize("motion", ["'on'", "1", "{threshold: 0}", "[true]", "{min_area: 2}"])
def test_the_validator_and_the_schema_both_refuse_a_bad_motion(motion: str) -> None:
    assert_both_reject(HEAD + FILE + DETECTION + f"    motion: {motion}\n", f"motion: {motion}")
