"""Issue 36's proof: moving signs of known text (tests/sign_clip.py: several fonts and sizes, some
upside down, most crossing a line, two at once) through the real daemon with PP-OCR's chain from the
rapidocr wheel (text detector -> direction classifier -> recognizer, the last two as attributes on
the tracked text regions). Each sign's crossing event carries its text; the agent reads >= 95 % of
the signs exactly and agrees with rapidocr's own engine (`RapidOCR()`, run side by side on the same
decoded frames) on >= 95 % of them; the recognizer runs at most twice per track on average."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import sign_clip as sign_clip_module
from tests.agent_process import StartAgent, read_status
from tests.fleet_fixtures import agent_config
from tests.mosquitto import Mosquitto, Subscriber
from tests.sign_clip import DETECTOR_PIPELINE, LANES, MIDDLE_LINE, SignClip
from tests.store_fixtures import CLS_MODEL_FILE, rapidocr_models_dir
from tests.text_lines import REC_MODEL_FILE
from tests.waits import wait_until

sign_clip = sign_clip_module.sign_clip
peer_readings = sign_clip_module.peer_readings

DEVICE = "dock-cam"
PP_OCR_PIXELS = {"color": "bgr", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}  # ../shared/MODELS.md


def signs_pipeline(clip: Path) -> dict[str, Any]:
    models = rapidocr_models_dir()
    return {
        "model": {"path": str(models / "ch_PP-OCRv4_det_infer.onnx")},
        "source": {"type": "video", "uri": str(clip)},
        **DETECTOR_PIPELINE,
        "report": {"results": False},
        "lines": [MIDDLE_LINE],
        "attributes": [
            {
                "name": "direction",
                "model": {"path": str(models / CLS_MODEL_FILE)},
                "preprocess": {
                    "resize": {"width": 192, "height": 48, "mode": "height", "pad": 128},
                    **PP_OCR_PIXELS,
                },
                "postprocess": {"type": "classification", "softmax": False, "labels": ["0", "180"]},
            },
            {
                "name": "text",
                "model": {"path": str(models / REC_MODEL_FILE)},
                "crop": {"rotate_by": "direction"},
                "preprocess": {
                    "resize": {"width": 320, "height": 48, "mode": "height", "pad": 128},
                    **PP_OCR_PIXELS,
                },
                "postprocess": {"type": "ctc"},  # the characters: the model's own (its metadata)
            },
        ],
    }


def lane_of(obj: dict[str, Any]) -> str:
    _, y1, _, y2 = obj["box"]
    centre = (y1 + y2) / 2
    return min(LANES, key=lambda lane: abs(LANES[lane] - centre))


@pytest.mark.slow
def test_the_daemon_reads_each_moving_sign_and_agrees_with_rapidocr(
    tmp_path: Path,
    mosquitto: Mosquitto,
    sign_clip: SignClip,
    peer_readings: dict[int, list[str]],
    start_agent: StartAgent,
) -> None:
    config = agent_config(
        tmp_path, DEVICE, mosquitto.port, tmp_path / "registry", {"signs": signs_pipeline(sign_clip.path)}
    )
    state_dir = tmp_path / DEVICE / "state"
    events = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/events/signs")
    agent = start_agent(config)
    try:

        def seen() -> list[dict[str, Any]]:
            return [json.loads(m.payload) for m in list(events.messages)]

        wait_until(
            lambda: "source signs: end of" in agent.log(),
            "the clip's end",
            timeout=90,
            state=lambda: agent.log()[-3000:],
        )
        status = read_status(state_dir)["pipelines"]["signs"]["steps"]["attributes"]
        agent.stop()  # the tracks still open end with the stop (no frame after the clip's last)
        wait_until(
            lambda: sum(e["type"] == "end" for e in seen()) >= len(sign_clip.signs),
            "every sign's track ended",
            timeout=30,
            state=lambda: f"{[e['type'] for e in seen()]}",
        )
    finally:
        agent.kill()
        events.close()
    everything = seen()
    ends = [e["object"] for e in everything if e["type"] == "end"]
    # One track per sign: in each lane the signs come one after another, as their tracks do.
    tracks: dict[int, dict[str, Any]] = {}
    for lane in LANES:
        mine = sorted((o for o in ends if lane_of(o) == lane), key=lambda o: o["first_seen"])
        truth = sorted((s for s in sign_clip.signs if s.spec.lane == lane), key=lambda s: s.spec.first)
        assert len(mine) == len(truth), (lane, [o.get("attributes") for o in mine])
        tracks |= {sign.index: obj for sign, obj in zip(truth, mine, strict=True)}

    read = {i: (obj["attributes"].get("text") or {}).get("value") for i, obj in tracks.items()}
    exact = [s for s in sign_clip.signs if read[s.index] == s.text]
    report = {s.text: read[s.index] for s in sign_clip.signs}
    assert len(exact) >= 0.95 * len(sign_clip.signs), report
    peers = {s.index: (peer_readings[s.index] or [None])[0] for s in sign_clip.signs}
    agree = [s for s in sign_clip.signs if read[s.index] == peers[s.index]]
    assert len(agree) >= 0.95 * len(sign_clip.signs), {
        s.text: (read[s.index], peers[s.index]) for s in sign_clip.signs
    }

    # Each crossing event carries its sign's text (and which way it went).
    crossings = {e["object"]["id"]: e for e in everything if e["type"] == "cross"}
    for sign in sign_clip.signs:
        crossing = sign.crossing
        obj = tracks[sign.index]
        if crossing is None:
            assert obj["id"] not in crossings, sign.text
            continue
        event = crossings[obj["id"]]
        assert event["direction"] == crossing[1], sign.text
        assert event["object"]["attributes"]["text"]["value"] == read[sign.index], sign.text

    # Once a track, again only when the picture is much better: at most twice per track on average.
    assert status["text"]["reads_per_track"] <= 2.0, status["text"]
    assert status["text"]["answered"] >= len(sign_clip.signs) and status["text"]["failures"] == 0
    upside_down = {s.index for s in sign_clip.signs if s.upside_down}
    turned = {i for i, obj in tracks.items() if obj["attributes"]["direction"]["value"] == "180"}
    assert turned == upside_down
