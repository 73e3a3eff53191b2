"""Behaviour of the ByteTrack tracker (agent/processing/tracking.py) on small hand-made sequences.

Each test builds its detections frame by frame and checks what `Tracker.update` reports: the id per
detection, the ids confirmed, lost and ended in each frame. Accuracy on long noisy sequences, against
a reference ByteTrack, is tests/test_tracking_metrics.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agent.config import TrackConfig
from agent.processing.tracking import Tracker, TrackStep

FPS = 10.0
DT = 1 / FPS


def box(x: float, y: float, w: float = 40.0, h: float = 80.0) -> list[float]:
    """[x1, y1, x2, y2] of a w x h box whose top-left corner is (x, y)."""
    return [x, y, x + w, y + h]


def one(tracker: Tracker, b: list[float] | None, now: float, score: float = 0.9, label: int = 0) -> TrackStep:
    """A frame with one detection (or none, for `b` None)."""
    if b is None:
        return tracker.update(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), now)
    return tracker.update([b], [score], [label], now)


def walk(
    tracker: Tracker,
    frames: int,
    x0: float,
    speed: float,
    t0: float = 0.0,
    score: float = 0.9,
    label: int = 0,
) -> list[TrackStep]:
    """`frames` frames at FPS of one object moving right at `speed` px/s from x0 (at time t0)."""
    return [one(tracker, box(x0 + speed * k * DT, 100), t0 + k * DT, score, label) for k in range(frames)]


def test_ids_stay_the_same_along_a_noisy_straight_path() -> None:
    rng = np.random.default_rng(1)
    tracker = Tracker(TrackConfig())
    objects = 3  # side by side, moving diagonally, 2 px of box noise
    start = np.array([[100.0, 100.0], [300.0, 100.0], [500.0, 100.0]])
    velocity = np.array([[150.0, 40.0], [120.0, 60.0], [90.0, 80.0]])  # px/s
    ids = []
    for k in range(60):
        xy = start + velocity * k * DT
        boxes = np.hstack([xy, xy + np.array([60.0, 120.0])]) + rng.normal(0, 2.0, (objects, 4))
        step = tracker.update(boxes, rng.uniform(0.6, 0.95, objects), np.zeros(objects, np.int64), k * DT)
        ids.append(step.ids)
        assert not step.ended and not step.lost
    assert (ids[0] == -1).all()  # tentative in the first frame (min_hits 2)
    assert sorted(ids[1]) == [1, 2, 3]
    for frame_ids in ids[1:]:
        assert (frame_ids == ids[1]).all()
    assert len(tracker) == 3
    assert tracker.next_id == 4


def test_a_new_track_gets_an_id_after_min_hits_frames_in_a_row() -> None:
    tracker = Tracker(TrackConfig(min_hits=3))
    steps = walk(tracker, 4, 100, 100)
    assert [s.ids.tolist() for s in steps] == [[-1], [-1], [1], [1]]
    assert [s.confirmed for s in steps] == [[], [], [1], []]


def test_a_tentative_track_that_misses_a_frame_starts_again() -> None:
    tracker = Tracker(TrackConfig(min_hits=3))
    frames = [box(100 + 10 * k, 100) for k in range(7)]
    seen = [True, True, False, True, True, True, True]  # 2 hits, a miss, then 3 hits in a row
    steps = [
        one(tracker, b if s else None, k * DT) for k, (b, s) in enumerate(zip(frames, seen, strict=True))
    ]
    assert [s.ids.tolist() for s in steps] == [[-1], [-1], [], [-1], [-1], [1], [1]]
    assert [s.confirmed for s in steps] == [[], [], [], [], [], [1], []]
    assert all(not s.lost and not s.ended for s in steps)  # a tentative track is never lost or ended


def test_min_hits_1_gives_an_id_at_first_sight() -> None:
    tracker = Tracker(TrackConfig(min_hits=1))
    steps = walk(tracker, 3, 100, 100)
    assert [s.ids.tolist() for s in steps] == [[1], [1], [1]]
    assert [s.confirmed for s in steps] == [[1], [], []]


def test_a_short_miss_keeps_the_id_and_reports_the_track_lost() -> None:
    tracker = Tracker(TrackConfig(max_lost_s=1.0))
    speed = 100.0
    steps = walk(tracker, 10, 100, speed)
    assert steps[-1].ids.tolist() == [1]
    for k in range(10, 18):  # 0.8 s unseen
        step = one(tracker, None, k * DT)
        assert step.lost == [1] and not step.ended
        assert len(tracker) == 1
    step = one(tracker, box(100 + speed * 18 * DT, 100), 18 * DT)  # back where it should be by now
    assert step.ids.tolist() == [1]
    assert not step.confirmed and not step.lost and not step.ended


def test_a_track_unseen_longer_than_max_lost_s_ends_and_a_return_gets_a_new_id() -> None:
    tracker = Tracker(TrackConfig(max_lost_s=1.0))
    walk(tracker, 5, 100, 0)  # standing still, seen until t = 0.4
    ended_at = []
    for k in range(5, 25):  # unseen from t = 0.5 to 2.4
        step = one(tracker, None, k * DT)
        if step.ended:
            ended_at.append((round(k * DT, 3), step.ended))
    assert ended_at == [(1.5, [1])]  # the first frame more than 1.0 s after it was last seen
    assert len(tracker) == 0 and tracker.boxes() == {}
    steps = [one(tracker, box(100, 100), (25 + k) * DT) for k in range(2)]
    assert [s.ids.tolist() for s in steps] == [[-1], [2]]
    assert steps[1].confirmed == [2]


def test_time_comes_from_now_not_from_the_number_of_frames() -> None:
    """Frames dropped by the daemon: few frames, long gaps."""
    tracker = Tracker(TrackConfig(max_lost_s=1.0))
    walk(tracker, 5, 100, 0)  # last seen at t = 0.4
    step = one(tracker, None, 1.3)  # one frame, 0.9 s later: still alive
    assert step.lost == [1] and not step.ended
    step = one(tracker, None, 1.5)  # the next frame 1.1 s after it was seen: ended
    assert step.ended == [1] and not step.lost

    tracker = Tracker(TrackConfig(max_lost_s=1.0))
    walk(tracker, 5, 100, 0)
    many = [one(tracker, None, 0.4 + k * 0.01) for k in range(1, 60)]  # 59 frames within 0.59 s
    assert all(s.lost == [1] and not s.ended for s in many)


def test_a_moving_object_keeps_its_id_across_half_a_second_of_dropped_frames() -> None:
    """The Kalman filter's velocity is per second: 0.5 s without frames moves the box 100 px."""
    speed = 200.0  # px/s; the box is 40 px wide, so without motion the next box would not overlap
    tracker = Tracker(TrackConfig())
    steps = walk(tracker, 12, 100, speed)
    assert steps[-1].ids.tolist() == [1]
    now = 11 * DT + 0.5
    step = one(tracker, box(100 + speed * now, 100), now)
    assert step.ids.tolist() == [1]
    assert not step.confirmed

    # The same path with a frame every 0.5 s from the start: the step between frames is 100 px.
    tracker = Tracker(TrackConfig())
    ids = [one(tracker, box(100 + speed * t, 100), t).ids.tolist() for t in np.arange(0, 0.6, 0.1)]
    for t in np.arange(0.6, 3.0, 0.5):
        ids.append(one(tracker, box(100 + speed * t, 100), t).ids.tolist())
    assert ids[1:] == [[1]] * (len(ids) - 1)


def test_ids_are_never_reused_and_continue_from_next_id() -> None:
    tracker = Tracker(TrackConfig(max_lost_s=0.2), next_id=41)
    got = []
    now = 0.0
    for _ in range(3):  # an object comes, is tracked, leaves long enough to end; three times
        for _ in range(3):
            got += one(tracker, box(100, 100), now).ids.tolist()
            now += DT
        for _ in range(4):
            ended = one(tracker, None, now).ended
            now += DT
        assert ended or len(tracker) == 0
    assert sorted({i for i in got if i >= 0}) == [41, 42, 43]
    assert tracker.next_id == 44
    tracker.end_all()
    assert one(tracker, box(100, 100), now).ids.tolist() == [-1]
    assert one(tracker, box(100, 100), now + DT).ids.tolist() == [44]


def test_per_label_never_matches_a_detection_to_a_track_of_another_label() -> None:
    tracker = Tracker(TrackConfig(per_label=True))
    walk(tracker, 3, 100, 0, label=0)
    steps = [one(tracker, box(100, 100), (3 + k) * DT, label=1) for k in range(3)]
    assert [s.ids.tolist() for s in steps] == [[-1], [2], [2]]  # a new track for the new label
    assert [s.lost for s in steps] == [[1], [1], [1]]  # the label-0 track goes unmatched

    # A person on a bicycle: two boxes almost the same, two labels, two tracks that never swap.
    tracker = Tracker(TrackConfig(per_label=True))
    id_of_label = []
    for k in range(30):
        x = 100 + 120 * k * DT
        order = [0, 1] if k % 2 else [1, 0]  # the detector lists them in either order
        boxes = np.array([box(x, 100), box(x + 2, 104)])[order]
        labels = np.array([0, 1])[order]
        step = tracker.update(boxes, [0.9, 0.8], labels, k * DT)
        id_of_label.append(dict(zip(labels.tolist(), step.ids.tolist(), strict=True)))
    assert id_of_label[0] == {0: -1, 1: -1}
    assert sorted(id_of_label[1].values()) == [1, 2]
    assert id_of_label[1:] == [id_of_label[1]] * 29


def test_class_agnostic_tracking_matches_across_labels_and_takes_the_latest_label() -> None:
    tracker = Tracker(TrackConfig(per_label=False))
    walk(tracker, 3, 100, 0, label=0)
    steps = [one(tracker, box(100, 100), (3 + k) * DT, label=1) for k in range(3)]
    assert [s.ids.tolist() for s in steps] == [[1], [1], [1]]
    assert all(not s.lost and not s.confirmed for s in steps)
    assert tracker.labels[tracker.ids == 1].tolist() == [1]
    one(tracker, box(100, 100), 6 * DT, label=2)
    assert tracker.labels[tracker.ids == 1].tolist() == [2]


def test_a_low_score_detection_keeps_a_track_but_never_starts_one() -> None:
    cfg = TrackConfig()  # low_score 0.1, high_score 0.5, new_track_score 0.6
    tracker = Tracker(cfg)
    walk(tracker, 5, 100, 100)
    # Partly hidden: scores drop below high_score for a second; the track goes on with its id.
    steps = [one(tracker, box(100 + 100 * k * DT, 100), k * DT, score=0.2) for k in range(5, 15)]
    assert [s.ids.tolist() for s in steps] == [[1]] * 10
    assert all(not s.lost for s in steps)
    # Below low_score it is ignored: the track is lost.
    assert one(tracker, box(100 + 100 * 1.5, 100), 1.5, score=0.05).lost == [1]

    # An object seen only at low scores, or at a high score below new_track_score, never gets a track.
    for score in (0.05, 0.3, 0.49, 0.55):
        tracker = Tracker(cfg)
        steps = walk(tracker, 20, 100, 50, score=score)
        assert all(s.ids.tolist() == [-1] and not s.confirmed for s in steps), score
        assert len(tracker) == 0 and tracker.next_id == 1

    # A tentative track is not kept by a low-score detection: it starts again later.
    tracker = Tracker(cfg)
    scores = [0.9, 0.3, 0.9, 0.9]
    steps = [one(tracker, box(100, 100), k * DT, score=s) for k, s in enumerate(scores)]
    assert [s.ids.tolist() for s in steps] == [[-1], [-1], [-1], [1]]


def test_two_objects_crossing_at_constant_speed_keep_their_ids() -> None:
    rng = np.random.default_rng(3)
    for dy in (0.0, 10.0):  # exactly the same path, and one a little lower (in front)
        tracker = Tracker(TrackConfig())
        history: dict[int, list[int]] = {0: [], 1: []}  # per object: its id in each frame
        for k in range(40):  # they meet at k = 20
            t = k * DT
            boxes = np.array([box(100 + 200 * t, 100), box(900 - 200 * t, 100 + dy)])
            boxes += rng.normal(0, 1.0, boxes.shape)
            step = tracker.update(boxes, [0.9, 0.85], [0, 0], t)
            for obj in (0, 1):
                if step.ids[obj] >= 0:
                    history[obj].append(int(step.ids[obj]))
        switches = sum(int(a != b) for h in history.values() for a, b in itertools.pairwise(h))
        assert switches == 0, (dy, history)
        assert history[0][0] != history[1][0]


def test_end_all_returns_the_confirmed_ids_and_clears_them() -> None:
    tracker = Tracker(TrackConfig())
    for k in range(3):
        tracker.update([box(100, 100), box(300, 100)], [0.9, 0.9], [0, 0], k * DT)
    tracker.update([box(500, 100)], [0.9], [0], 3 * DT)  # a tentative third track
    assert sorted(tracker.boxes()) == [1, 2]
    assert sorted(tracker.end_all()) == [1, 2]
    assert len(tracker) == 0 and tracker.boxes() == {}
    assert tracker.end_all() == []
    step = tracker.update([box(100, 100), box(500, 100)], [0.9, 0.9], [0, 0], 4 * DT)
    assert step.ids.tolist() == [-1, -1] and not step.lost and not step.ended  # nothing left over


def test_boxes_are_the_confirmed_tracks_current_boxes() -> None:
    tracker = Tracker(TrackConfig())
    walk(tracker, 10, 100, 100)
    (tracked,) = tracker.boxes().values()
    assert tracked == pytest.approx(box(100 + 100 * 9 * DT, 100), abs=3.0)
    one(tracker, None, 1.0)  # predicted on: about 10 px further
    (tracked,) = tracker.boxes().values()
    assert tracked == pytest.approx(box(100 + 100 * 1.0, 100), abs=4.0)


@pytest.mark.parametrize(
    "boxes, scores, labels",
    [
        (np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)),
        (np.zeros(0), np.zeros(0), np.zeros(0)),
        ([], [], []),
        (np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), np.zeros((0,), np.int32)),
    ],
    ids=["float64 (0,4)", "flat (0,)", "lists", "float32 (0,4)"],
)
def test_empty_frames_are_fine(boxes: object, scores: object, labels: object) -> None:
    tracker = Tracker(TrackConfig())
    step = tracker.update(boxes, scores, labels, 0.0)  # type: ignore[arg-type]
    assert step.ids.shape == (0,) and step.ids.dtype == np.int64
    assert (step.confirmed, step.ended, step.lost) == ([], [], [])
    walk(tracker, 3, 100, 0, t0=0.1)
    for k in range(5):  # empty frames while a track lives
        step = tracker.update(boxes, scores, labels, 0.4 + k * DT)  # type: ignore[arg-type]
        assert step.ids.shape == (0,) and step.lost == [1]


def test_input_types_and_shapes() -> None:
    tracker = Tracker(TrackConfig())
    # A single detection given flat, float32 boxes, int32 labels, a plain list, a tuple.
    assert tracker.update(np.array(box(100, 100)), np.array([0.9]), np.array([0]), 0.0).ids.tolist() == [-1]
    step = tracker.update(
        np.array([box(101, 100)], np.float32), np.array([0.9], np.float32), np.array([0], np.int32), 0.1
    )
    assert step.ids.tolist() == [1] and step.ids.dtype == np.int64
    assert tracker.update([box(102, 100)], [0.9], [0], 0.2).ids.tolist() == [1]
    assert tracker.update((tuple(box(103, 100)),), (0.9,), (0,), 0.3).ids.tolist() == [1]
    # Boxes of no area (a degenerate detection) match nothing and break nothing.
    step = tracker.update([box(104, 100), [500.0, 500.0, 500.0, 500.0]], [0.9, 0.9], [0, 0], 0.4)
    assert step.ids.tolist() == [1, -1]
    step = tracker.update([box(105, 100)], [0.9], [0], 0.5)
    assert step.ids.tolist() == [1]
    # The same time twice (no motion step) and a time going backwards are not fatal.
    assert tracker.update([box(105, 100)], [0.9], [0], 0.5).ids.tolist() == [1]
    assert tracker.update([box(105, 100)], [0.9], [0], 0.45).ids.tolist() == [1]
