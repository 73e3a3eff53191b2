"""Tracking accuracy (issue 27): our ByteTrack against roboflow `trackers`' ByteTrack on the same
synthetic detections (tests/tracking_sequences.py), scored with MOTA and IDF1 (motmetrics).

Ours must be within `MARGIN` of the reference, or better, on every scenario, against the
reference run with our thresholds and with its own defaults. The figures of a full run, with
per-frame times, are scripts/bench_tracking_metrics.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.config import TrackConfig
from tests import tracking_sequences as ts

MARGIN = 0.02


@pytest.fixture(scope="module", params=list(ts.SCENARIOS))
def sequence(request: pytest.FixtureRequest) -> ts.Sequence:
    return ts.SCENARIOS[request.param]()


def test_ours_is_as_accurate_as_the_reference_bytetrack(sequence: ts.Sequence) -> None:
    cfg = TrackConfig()
    mine = ts.evaluate(sequence, ts.run(sequence, ts.ours(cfg)))
    references = {
        "trackers, our thresholds": ts.evaluate(sequence, ts.run(sequence, ts.reference(cfg))),
        "trackers, its defaults": ts.evaluate(sequence, ts.run(sequence, ts.reference_defaults())),
    }
    for name, ref in references.items():
        why = f"{sequence.name}: ours {mine} vs {name} {ref}"
        assert mine.mota >= ref.mota - MARGIN, why
        assert mine.idf1 >= ref.idf1 - MARGIN, why
    # Not two trackers equally lost: most objects are tracked, and fewer switches than objects.
    assert mine.mota > 0.7 and mine.idf1 > 0.6, mine
    assert mine.switches < sequence.objects, mine


# ------------------------------------------------------------------ the yardstick itself is right
def test_a_perfect_tracker_scores_1_and_a_swap_counts() -> None:
    seq = ts.crossing(seconds=4.0)
    perfect = ts.Run([gt[:, 1:] for gt in seq.gts], [gt[:, 0].astype(np.int64) for gt in seq.gts], [])
    scores = ts.evaluate(seq, perfect)
    assert (scores.mota, scores.idf1, scores.switches, scores.misses) == (1.0, 1.0, 0, 0)

    # Swap two objects' ids halfway: two switches; drop every tenth frame: misses.
    swapped = ts.Run([], [], [])
    pair = sorted({int(i) for i in seq.gts[0][:, 0]})[:2]
    for f, gt in enumerate(seq.gts):
        ids = gt[:, 0].astype(np.int64)
        if f >= seq.frames // 2:
            ids = np.where(ids == pair[0], pair[1], np.where(ids == pair[1], pair[0], ids))
        keep = np.full(len(gt), f % 10 != 0)
        swapped.boxes.append(gt[keep, 1:])
        swapped.ids.append(ids[keep])
    scores = ts.evaluate(seq, swapped)
    assert scores.switches == 2
    assert scores.misses == sum(len(gt) for f, gt in enumerate(seq.gts) if f % 10 == 0)
    assert 0.8 < scores.mota < 0.95 and scores.idf1 < 0.95
    assert dict(ts.switches_per_object(seq, swapped)) == {
        pair[0]: [pair[0], pair[1]],
        pair[1]: [pair[1], pair[0]],
    }


def test_iou_distance() -> None:
    a = np.array([[0, 0, 10, 10], [100, 100, 110, 110]], np.float64)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [2, 0, 12, 10], [50, 50, 50, 60]], np.float64)
    d = ts.iou_distance(a, b)
    assert d.shape == (2, 4)
    assert d[0, 0] == 0.0
    assert np.isnan(d[0, 1])  # IoU 1/3: no match at 0.5
    assert d[0, 2] == pytest.approx(1 - 8 / 12)
    assert np.isnan(d[1]).all() and np.isnan(d[:, 3]).all()  # apart; a box of no area
    assert ts.iou_distance(np.zeros((0, 4)), b).shape == (0, 4)


def test_the_scenarios_have_what_they_claim() -> None:
    """Occlusions of ~0.5 s, low-score stretches and dropped frames are really in the data."""
    occ = ts.occlusion()
    hidden = []  # frames a person (id < 1000) is out of the ground truth while in the scene
    seen_at: dict[int, list[int]] = {}
    for f, gt in enumerate(occ.gts):
        for i in gt[:, 0].astype(int).tolist():
            seen_at.setdefault(i, []).append(f)
    for i, frames in seen_at.items():
        gaps = np.diff(frames)
        if i < 1000:
            hidden += (gaps[gaps > 1] - 1).tolist()
    assert len(hidden) >= 20
    assert 0.35 <= np.median(hidden) / 30 <= 0.65  # seconds

    low = ts.low_scores()
    scores = np.concatenate([d[:, 4] for d in low.dets])
    assert 0.3 < np.mean((scores >= 0.1) & (scores < 0.5)) < 0.6

    dropped = ts.dropped_frames()
    steps = np.diff(dropped.times)
    assert steps.min() == pytest.approx(1 / 30)
    assert np.count_nonzero(steps >= 0.2) >= 5 and steps.max() <= 0.51
