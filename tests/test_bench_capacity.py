"""scripts/bench_capacity.py's own logic: the clips' truth (when and which way each walker crosses the
door), the figures it makes of what arrived on the broker, the Done-when verdict, the docs section and
the plot; and one short real run (K=1, a 7 s clip, gate off) end to end through the daemon."""

from __future__ import annotations

import itertools
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.media_fixtures import SCRIPTS_DIR

if str(SCRIPTS_DIR) not in sys.path:  # scripts/ is not a package
    sys.path.insert(0, str(SCRIPTS_DIR))
import bench_capacity as bench
import make_tracking_video as walkers

W, H, FPS = 320, 180, 5
LINE_Y = 0.55 * H  # the door


def expected_crossing(walk: walkers.Walk, face_scale: float) -> tuple[float, str]:
    """When a walker wholly in the picture crosses the door, worked out here from its path: the first
    frame whose face bottom (the anchor) is past the line, and the way it went (up: `in`)."""
    patch, face = walkers.photo_patch(face_scale)
    centres = [(i, walkers.centre_at(walk, i / FPS)) for i in range(round(walk[-1][0] * FPS))]
    # The patch is pasted at whole pixels: its top at the centre less half its height, rounded.
    ys = [(i, round(c[1] - patch.shape[0] / 2) + face[3]) for i, c in centres if c is not None]
    up = ys[0][1] > ys[-1][1]
    first = next(i for i, y in ys if (y < LINE_Y if up else y > LINE_Y))
    return first / FPS, "in" if up else "out"


def test_the_truth_says_when_and_which_way_each_walker_crosses_the_door(tmp_path: Path) -> None:
    walks = {
        "up": [(0.2, 100.0, 150.0), (2.2, 100.0, 40.0)],
        "down": [(0.4, 220.0, 40.0), (2.0, 220.0, 150.0)],
    }
    clip = walkers.Clip(walks, 2.6, W, H, FPS, face_scale=0.3)
    truth = walkers.render(tmp_path / "tiny.avi", clip, np.full((H, W, 3), 90, np.uint8), noise=2.0)
    assert all(t.whole[name] for t in truth for name in t.faces)  # wholly inside: no cut boxes
    found = bench.crossings_of(truth, clip)
    expected = sorted(
        (bench.Crossing(*expected_crossing(walk, 0.3)) for walk in walks.values()), key=lambda c: c.t
    )
    assert found == expected
    assert [c.direction for c in found] == ["out", "in"]  # the faster walker down crosses first


def test_each_camera_has_its_own_walkers_with_quiet_stretches_between() -> None:
    starts = {}
    for camera in range(48):
        for seconds, count in ((bench.FULL_SECONDS, 1), (2 * bench.EVERY_S + 2, 2)):
            walks = bench.camera_walks(camera, seconds)
            assert len(walks) == count
            times = [walk[0][0] for walk in walks.values()]
            for walk in walks.values():
                assert walk[-1][0] + 1.5 <= seconds  # gone, and its track ended, before the clip ends
                assert walk[-1][0] - walk[0][0] == pytest.approx(bench.WALK_S)
            assert all(b - a - bench.WALK_S >= 20.0 for a, b in itertools.pairwise(times))  # quiet
        starts[camera] = times[0]
    # The cameras' walkers come at other times, spread over the clip: a few on the screen at once.
    assert len(set(starts.values())) >= 40
    on_screen = [sum(t <= at < t + bench.WALK_S for t in starts.values()) for at in range(32)]
    assert max(on_screen) <= 12


def arrival(at: float, topic: str, payload: dict[str, Any]) -> bench.Arrival:
    return bench.Arrival(at, f"edge/{bench.DEVICE}/{topic}", payload)


def iso(t: float) -> str:
    from agent.clock import iso_utc

    return iso_utc(t)


def cross(event: str, direction: str, seen: float, arrived: float, camera: str = "cam01") -> bench.Arrival:
    """A `cross` event of the door, its frame captured at `seen`, on the broker at `arrived`."""
    payload = {"id": event, "type": "cross", "line": "door", "direction": direction, "at": iso(seen)}
    return arrival(arrived, f"events/{camera}", payload)


def test_a_cameras_figures_from_what_arrived_and_its_status() -> None:
    start = 1_700_000_000.0  # the clip began to play here
    truth = [bench.Crossing(3.0, "in"), bench.Crossing(14.0, "out"), bench.Crossing(25.0, "in")]
    arrivals = [
        # results: captured 0.1 s late at position 2 s, on time at 4 s: the play start is the earliest
        arrival(
            start + 2.2, "results/cam01", {"captured_at": iso(start + 2.1), "source": {"position_s": 2.0}}
        ),
        arrival(
            start + 4.1, "results/cam01", {"captured_at": iso(start + 4.0), "source": {"position_s": 4.0}}
        ),
        # the first crossing, seen on its frame, arriving 0.5 s after it was on the screen; twice (QoS 1)
        cross("a", "in", start + 3.0, start + 3.5),
        cross("a", "in", start + 3.0, start + 3.5),
        # the second: seen 1 s after it happened (frames dropped), arrived 1.25 s after
        cross("b", "out", start + 15.0, start + 15.25),
        # a crossing the wrong way at 25 s: not the third's, an extra; another camera's: not this one's
        cross("c", "out", start + 25.0, start + 25.2),
        cross("d", "in", start + 25.0, start + 25.2, camera="cam02"),
    ]
    status = {
        "state": "finished",
        "inferences": 90,
        "source": {"frames_decoded": 180, "frames_skipped_by_fps": 0, "frames_dropped": 30},
        "steps": {"motion": {"frames_gated": 60, "mean_ms": 1.25}},
    }
    figures, problems = bench.camera_figures("cam01", truth, arrivals, status, 36.0)
    assert problems == []
    assert (figures.truth, figures.found, figures.extra) == (3, 2, 1)
    assert figures.lateness_s == [0.5, 1.25]
    assert figures.fps == pytest.approx(150 / 36, abs=1e-3)  # 180 handed, 30 dropped, in 36 s
    assert figures.inferred_fps == pytest.approx(90 / 36, abs=1e-3)
    assert (figures.dropped, figures.gated, figures.gate_ms) == (30, 60, 1.25)

    unfinished, problems = bench.camera_figures("cam03", truth, arrivals, {"state": "running"}, 36.0)
    assert unfinished.found == 0 and unfinished.gated is None
    assert problems == [
        "cam03: no result with a position in its file arrived",
        "cam03: its pipeline ended 'running', not finished",
    ]


def test_an_event_decoded_late_is_its_crossings_but_not_one_of_another_or_too_early() -> None:
    truth = [bench.Crossing(3.0, "in"), bench.Crossing(14.0, "out")]
    start = 100.0
    # (capture time, arrival time, direction): the first seen 4 s late (a busy box decoding behind
    # the file's time), arriving 0.5 s after that; one 6 s after the second: too late to be its; one
    # 1.5 s before the first's time on the screen: too early to be its.
    events = [(107.0, 107.5, "in"), (120.0, 120.1, "out"), (101.5, 101.6, "in")]
    assert bench.match_crossings(truth, events, start) == ([4.5], 2)


def camera(
    found: int, truth: int = 3, late: float = 0.5, gate_ms: float | None = None
) -> bench.CameraFigures:
    return bench.CameraFigures("cam", truth, found, 0, [late] * found, 5.0, 5.0, 0, None, gate_ms)


def run(
    k: int, gate: bool, found: int, late: float = 0.5, scene: str = "walkers", cpu: float = 60.0
) -> bench.RunFigures:
    # `cpu` CPU seconds over 30 s of play: cpu * 2 / k a camera-minute
    return bench.RunFigures(
        k, gate, scene, 36.0, 30.0, cpu, 300.0, [camera(found, late=late) for _ in range(k)]
    )


def test_the_verdict_and_the_reports_arithmetic() -> None:
    static_off = run(2, False, 0, scene="static", cpu=20.0)  # 20 s a camera-minute
    static_on = run(2, True, 0, scene="static", cpu=2.0)  # 2: a tenth
    static_on.cameras = [camera(0, 0, gate_ms=1.0), camera(0, 0, gate_ms=2.0)]
    static_on.decode_ms_in_process = 4.0  # 5 fps: 1.2 s a camera-minute
    # Read per thread: 0.6 s a camera-minute decoding either way; the pipeline's 1.4 against 19.4.
    static_off.decode_cpu_s = static_on.decode_cpu_s = 0.6
    runs = [
        static_off,
        static_on,
        run(1, False, 3),
        run(2, False, 3),
        run(4, False, 2),  # a miss at 4: off carries 2
        run(1, True, 3),
        run(2, True, 3),
        run(4, True, 3),
        run(8, True, 3, late=1.5),
        run(16, True, 1),  # on carries 8
    ]
    assert run(4, False, 3).cpu_per_camera_minute == pytest.approx(30.0)
    assert bench.largest_all_found(runs, False) == 2 and bench.largest_all_found(runs, True) == 8
    assert bench.verdict(runs) == {
        "gate_ms": 1.5,
        "gate_ms_from": "status",
        "gate_ms_ok": True,
        "cpu_ratio_on_off": 0.072,
        "cpu_ratio_ok": True,
        "cpu_ratio_whole_daemon": 0.1,
        "cpu_on_s": 2.0,
        "decode_s": 0.6,
        "decode_from": "threads",
        "largest_k": 16,
        "largest_k_off": 2,
        "largest_k_on": 8,
        "capacity_ok": True,
        "worst_lateness_at_k_on_s": 1.5,
        "lateness_ok": True,
    }
    # A problem in a run (a file that did not play to its end) means not every crossing was found.
    runs[8].problems.append("the files did not all play to their end")
    later = bench.verdict(runs)
    assert (later["largest_k_on"], later["capacity_ok"]) == (4, False)
    # Without the gate's time in the status, the one measured in process.
    static_on.cameras = [camera(0, 0), camera(0, 0)]
    static_on.gate_ms_in_process = 2.5
    assert bench.verdict(runs)["gate_ms"] == 2.5 and bench.verdict(runs)["gate_ms_from"] == "in-process"
    text = bench.goals_text(bench.verdict(runs))
    assert "gate on / off, static scene (the daemon's threads but those decoding the cameras): 0.072" in text
    assert "decoding included: 0.100: of the gate on's 2.00 CPU s per camera-minute" in text
    # Where the system names no threads: no pipeline figure, the whole daemon's, decoding timed apart.
    static_off.decode_cpu_s = static_on.decode_cpu_s = None
    unread = bench.verdict(runs)
    assert (unread["cpu_ratio_on_off"], unread["cpu_ratio_ok"], unread["cpu_ratio_whole_daemon"]) == (
        None,
        None,
        0.1,
    )
    assert (unread["decode_s"], unread["decode_from"]) == (1.2, "in-process")

    # The gate off carrying every K measured leaves the capacity goal undecided.
    carried = [run(k, gate, 3) for k in (1, 2, 4) for gate in (False, True)]
    assert (bench.verdict(carried)["largest_k_off"], bench.verdict(carried)["capacity_ok"]) == (4, None)
    assert "its limit lies beyond" in bench.goals_text(bench.verdict(carried))

    rows = bench.table(runs).splitlines()
    assert len(rows) == 2 + len(runs)
    assert rows[5] == "| walkers | 2 | off | 5.00 (5.00) | 0 | 60.00 | 300 | 6/6 | 0 | 0.50 / 0.50 |"
    ET.fromstring(bench.plot_svg(runs))  # well-formed SVG


def test_a_saved_report_reads_back_as_the_same_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [run(1, False, 3), run(1, True, 2, late=2.5), run(2, True, 3)]
    runs[1].problems.append("cam01: its pipeline ended 'stopped', not finished")
    saved = tmp_path / "capacity.json"
    saved.write_text(json.dumps({"verdict": {}, "runs": [r.to_json() for r in runs]}))
    assert [bench.RunFigures.from_json(r.to_json()) for r in runs] == runs
    assert bench.main(["--report", str(saved)]) == 0
    assert bench.table(runs) in capsys.readouterr().out
    saved.write_text("{}")
    with pytest.raises(SystemExit, match="not a report of this benchmark's --json"):
        bench.main(["--report", str(saved)])


def test_write_docs_replaces_only_the_text_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(
        f"# P\n\n{bench.SECTION}\n\nBy hand.\n\n{bench.BEGIN}\nold figures\n{bench.END}\n\n## Next\n"
    )
    bench.write_docs(doc, f"{bench.BEGIN}\nnew figures\n{bench.END}")
    assert doc.read_text() == (
        f"# P\n\n{bench.SECTION}\n\nBy hand.\n\n{bench.BEGIN}\nnew figures\n{bench.END}\n\n## Next\n"
    )
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no <!-- capacity:begin"):
        bench.write_docs(doc, "x")
    # The real docs have the markers.
    text = (SCRIPTS_DIR.parent / "docs" / "performance.md").read_text()
    assert bench.SECTION in text and text.index(bench.BEGIN) < text.index(bench.END)


@pytest.mark.slow
def test_a_short_real_run_finds_the_crossing_and_cleans_up(tmp_path: Path) -> None:
    """K=1, gate off, a 7 s clip with one walker: the real daemon, detector and mosquitto. The crossing
    is found, on time, and no process or file of the run is left behind but the work folder asked for."""
    out = tmp_path / "figures.json"
    work = tmp_path / "work"
    assert bench.main(["--quick", "--modes", "off", "--seconds", "7", "--no-static", "--work", str(work),
                       "--backend", "onnxruntime/CPUExecutionProvider",
                       "--json", str(out)]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    (only,) = report["runs"]
    assert only["problems"] == [] and only["all_found"], only
    (cam,) = only["cameras"]
    assert (cam["truth"], cam["found"], cam["extra"]) == (1, 1, 0)
    assert cam["fps"] > 4.0 and 0 <= cam["lateness_s"][0] < 2.0
    assert only["cpu_s"] > 0 and only["rss_mb"] > 50
    assert report["verdict"]["largest_k_off"] == 1
    # Its daemon and its broker are gone: no process left that names the work folder.
    left = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if str(work) in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []
