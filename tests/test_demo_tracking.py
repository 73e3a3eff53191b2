"""The tracking quick start (README: `scripts/demo.sh --tracking`, which runs scripts/demo_tracking.sh)
run as a newcomer runs it: a clip of a shop's door rendered (scripts/make_tracking_video.py), the real
YOLOv8n detector of the nudenet wheel under `edge-agent run` with a door line and a counter zone
against a private mosquitto, and then `edge-agent infer --track --draw` on the same clip.

What it must show: every kind of event as it arrives (a track's start and end, a crossing of the door
line each way, entering and leaving the counter, the dwell of the one who waits), the counts of the
agent and of `infer --track` against the clip's truth, each agreeing; and leave the drawn video (every
frame of the clip) and a snapshot per person in its work dir, naming their paths. Its counting check
is no formality: counts that disagree with the truth make it say WRONG and exit 1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from tests.media_fixtures import SCRIPTS_DIR, iou

if str(SCRIPTS_DIR) not in sys.path:  # scripts/ is not a package
    sys.path.insert(0, str(SCRIPTS_DIR))
import make_tracking_video

REPO = Path(__file__).resolve().parent.parent
DOOR = "line door: in 3 (truth 3), out 1 (truth 1)  OK"
COUNTER = "zone counter: entered 2 (truth 2), dwell 1 (truth 1)  OK"


def lines_with(text: str, *words: str) -> list[str]:
    """The lines of `text` holding every one of `words` as a word of its own."""
    return [
        line
        for line in text.splitlines()
        if all(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", line) for w in words)
    ]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_tracking_quick_start_shows_the_events_and_counts_of_its_clip(tmp_path: Path) -> None:
    work = tmp_path / "work"
    began = time.monotonic()
    done = subprocess.run(
        [str(REPO / "scripts" / "demo.sh"), "--tracking"],
        env={**os.environ, "EDGE_AGENT_DEMO_WORK": str(work), "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    took = time.monotonic() - began
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]

    # The events as they arrived, edge-agent watch's line for each (before the counts); the line's
    # wording is watch's, so each is found by its words, in any order.
    live = out.split("What the agent", 1)[0]
    for kind, words in (
        ("a track's start", ("new", "FACE_FEMALE")),
        ("the door crossed inwards", ("cross", "door", "in")),
        ("the door crossed outwards", ("cross", "door", "out")),
        ("the counter entered", ("enter", "counter")),
        ("the counter left", ("exit", "counter")),
        ("the wait at the counter", ("dwell", "counter")),
        ("a track's end with its snapshot", ("end", "lost", "snapshot:")),
        ("the clip played through", ("status", "demo-shop", "shop", "finished")),
    ):
        assert lines_with(live, *words), (kind, live)
    assert len(lines_with(live, "event", "cross", "door", "in")) == 3, live
    assert len(lines_with(live, "event", "dwell", "counter")) == 1, live
    assert lines_with(live, "event", "update") == []  # the updates repeat what the other events say

    # The counts against the clip's truth: the agent's, then infer --track's on every frame.
    assert re.search(r"What the agent \(edge-agent run, \d+ events\) counted", out), out
    assert "What edge-agent infer --track (185 frames) counted" in out, out
    assert out.count(DOOR) == 2 and out.count(COUNTER) == 2, out[-3000:]
    assert "WRONG" not in out

    # What it leaves to look at: the drawn clip, every frame of it, and a snapshot per track.
    assert f"{work}/tracked.mp4" in out
    capture = cv2.VideoCapture(str(work / "tracked.mp4"))
    try:
        assert capture.isOpened()
        assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 185
        assert (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (640, 480)
    finally:
        capture.release()
    ended = re.findall(r"snapshot: (\S+\.jpg)$", live, re.M)
    listed = re.findall(r"^ {4}(/\S+\.jpg)$", out, re.M)
    assert len(ended) >= 4 and sorted(ended) == sorted(listed), (ended, listed)
    assert all(cv2.imread(path) is not None for path in listed), listed
    print(f"the tracking quick start took {took:.0f} s")

    # Counts that disagree with the truth are said and fail the demo.
    truth = json.loads((work / "truth.json").read_text())
    truth["lines"]["door"]["in"] += 1
    wrong = tmp_path / "wrong-truth.json"
    wrong.write_text(json.dumps(truth))
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts/demo_tracking_events.py"), "infer", str(work / "infer.json"),
         "--truth", str(wrong)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 1, check.stdout + check.stderr
    assert "line door: in 3 (truth 4), out 1 (truth 1)  WRONG" in check.stdout
    assert COUNTER in check.stdout


def test_the_readme_s_quick_start_names_it_and_the_walkthrough_walks_it() -> None:
    quick_start = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "scripts/demo.sh --tracking" in quick_start.split("```sh", 1)[1].split("```", 1)[0]
    walkthrough = (REPO / "scripts/walkthrough.sh").read_text()
    assert "scripts/demo.sh --tracking >" in walkthrough


def test_the_shop_clip_shows_what_its_story_says_clearly(tmp_path: Path) -> None:
    """The clip's truth against configs/demo-tracking.yaml's door and counter, as the demo computes it:
    three in and one out through the door, two at the counter and one dwell; and nothing close to a
    boundary the counting could fall either side of: no two faces overlap, each stay at the counter
    is several frames long and far from its dwell_s, every crossing of the door is made by a face
    wholly in the picture."""
    config = yaml.safe_load(
        (REPO / "configs/demo-tracking.yaml").read_text().replace("@PORT@", "1883").replace("@WORK@", "/w")
    )
    (shop,) = config["pipelines"]
    zones, lines = shop["zones"], shop["lines"]
    clip = make_tracking_video.SHOP
    truth = make_tracking_video.render(tmp_path / "shop.avi", clip)
    found = make_tracking_video.visits(truth, clip, zones, lines)
    assert make_tracking_video.counts(found, zones, lines) == {
        "lines": {"door": {"in": 3, "out": 1}},
        "zones": {"counter": {"entries": 2, "dwell": 1}},
    }
    assert [(v.name, v.crossings) for v in found] == [
        ("A", [("door", "in")]), ("B", [("door", "in")]), ("C", [("door", "out")]), ("D", [("door", "in")])
    ]  # fmt: skip
    (counter,) = zones
    stays = sorted(stay for v in found for zone, stay in v.stays if zone == "counter")
    assert len(stays) == 2 and 0.5 <= stays[0] <= counter["dwell_s"] - 2, stays  # B walks past
    assert stays[1] >= counter["dwell_s"] + 2, stays  # D waits
    for t in truth:
        boxes = [np.array(b) for b in t.faces.values()]
        assert all(iou(a, b) == 0 for i, a in enumerate(boxes) for b in boxes[i + 1 :]), t
    door_y = lines[0]["points"][0][1] * clip.height
    for t in truth:
        for name, box in t.faces.items():
            if abs(box[3] - door_y) < 20:  # its anchor at the door line
                assert t.whole[name], (t.index, name)


def test_the_walkthrough_s_own_config_naming_a_label_the_detector_lacks_is_refused_with_its_line(
    tmp_path: Path,
) -> None:
    """scripts/walkthrough.py's last step: the quick start's config as a user makes it their own,
    naming `person` (the detector finds faces), is refused by `config validate` at the lines that
    name it; naming the detector's own labels, it is accepted."""
    spec = importlib.util.spec_from_file_location("walkthrough", REPO / "scripts/walkthrough.py")
    assert spec is not None and spec.loader is not None
    walkthrough = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walkthrough)
    edge_agent = str(Path(sys.executable).parent / "edge-agent")
    mine, theirs = tmp_path / "my-shop.yaml", tmp_path / "faces.yaml"
    walkthrough._config_naming(mine, "person", 1883, tmp_path)
    walkthrough._config_naming(theirs, "FACE_FEMALE", 1883, tmp_path)
    refused = subprocess.run(
        [edge_agent, "config", "validate", str(mine)], capture_output=True, text=True, timeout=60
    )
    lines = mine.read_text().splitlines()
    said = re.findall(
        r"my-shop\.yaml:(\d+): pipelines\[0\]\.(zones|lines)\[0\]\.labels\[0\]: 'person'", refused.stderr
    )
    assert refused.returncode == 1 and len(said) == 2, refused.stdout + refused.stderr
    assert all("labels: [person]" in lines[int(number) - 1] for number, _ in said), said
    accepted = subprocess.run(
        [edge_agent, "config", "validate", str(theirs)], capture_output=True, text=True, timeout=60
    )
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
