"""Synthetic detection sequences with known tracks, and CLEAR-MOT / identity metrics for trackers.

Used by tests/test_tracking_metrics.py and scripts/bench_tracking_metrics.py (issue 27). Each
scenario moves objects with known ids through a frame and turns them into what a detector would
report: boxes with noise, scores, labels; missed detections; objects hidden by nearer ones (missed,
or reported at a low score while partly hidden or partly out of the frame); stretches of low
scores; false positives. Every
sequence is made from a fixed seed, so every tracker sees the same detections.

Ground truth per frame is every object at least `MIN_VISIBLE` visible (partly hidden ones
included: a tracker should keep them through ByteTrack's low-score stage). A tracker's output per
frame is the detections it gave an id (what the daemon reports), so a frame where an object is
missed counts as a miss for every tracker alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.fleet_fixtures import SCRIPTS_DIR

if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))
from bench_trackers import synthetic  # scripts/ is not a package: the bouncing sequence

Array = npt.NDArray[np.float64]

W, H = 1920, 1080
MIN_VISIBLE = 0.2  # less visible than this: neither detected nor expected
MATCH_IOU = 0.5  # a tracker's box counts as an object's at IoU >= 0.5 (motmetrics' max distance 0.5)


@dataclass
class Sequence:
    """Detections and ground truth of one scenario."""

    name: str
    description: str
    times: list[float]  # capture time of each frame, s
    dets: list[Array]  # per frame (N, 6): x1, y1, x2, y2, score, label
    gts: list[Array]  # per frame (M, 5): object id, x1, y1, x2, y2 (objects in view)

    @property
    def frames(self) -> int:
        return len(self.times)

    @property
    def objects(self) -> int:
        return len({int(i) for gt in self.gts for i in gt[:, 0]})


@dataclass
class World:
    """True boxes of every object in every camera frame, nearer objects first in `depth`."""

    fps: float
    ids: list[npt.NDArray[np.int64]] = field(default_factory=list)  # per frame, objects in the scene
    boxes: list[Array] = field(default_factory=list)  # per frame (M, 4), unclipped
    labels: list[npt.NDArray[np.int64]] = field(default_factory=list)


def visibility(boxes: Array, depth: Array, grid: int = 8) -> Array:
    """Fraction of each box inside the frame and not covered by a nearer box (larger `depth`),
    sampled on a grid x grid lattice of points."""
    if not len(boxes):
        return np.zeros(0)
    u = (np.arange(grid) + 0.5) / grid
    px = boxes[:, 0:1] + (boxes[:, 2:3] - boxes[:, 0:1]) * u[None, :]  # (M, g)
    py = boxes[:, 1:2] + (boxes[:, 3:4] - boxes[:, 1:2]) * u[None, :]
    xs = np.repeat(px, grid, axis=1)  # (M, g*g)
    ys = np.tile(py, (1, grid))
    inside = (xs >= 0) & (xs < W) & (ys >= 0) & (ys < H)
    covered = np.zeros_like(inside)
    for j in range(len(boxes)):
        nearer = depth > depth[j]
        if not nearer.any():
            continue
        b = boxes[nearer]
        hit = (
            (xs[j][None, :] >= b[:, 0:1])
            & (xs[j][None, :] < b[:, 2:3])
            & (ys[j][None, :] >= b[:, 1:2])
            & (ys[j][None, :] < b[:, 3:4])
        )
        covered[j] = hit.any(axis=0)
    result: Array = (inside & ~covered).mean(axis=1)
    return result


def observe(
    world: World,
    seed: int,
    *,
    miss: float = 0.05,
    noise: float = 0.02,
    dim_start: float = 0.0,
    dim_end: float = 0.05,
    fp_low: float = 2.0,
    fp_high: float = 0.05,
    keep: Callable[[np.random.Generator, int], list[int]] | None = None,
) -> tuple[list[float], list[Array], list[Array]]:
    """A detector's view of `world`: (times, dets, gts) as in `Sequence`.

    miss: chance that a visible object is not detected; noise: box noise, a fraction of its size;
    dim_start / dim_end: per frame, the chance that an object's scores drop to 0.15-0.45 (a stretch
    of bad light, motion blur) and that such a stretch ends; fp_low / fp_high: mean false positives
    a frame at low (0.1-0.45) and at high (0.6-0.75) scores; keep: the camera frames the tracker
    gets (frames the daemon drops are left out), default all.
    """
    rng = np.random.default_rng(seed)
    frames = len(world.boxes)
    chosen = set(keep(rng, frames) if keep else range(frames))
    dim: dict[int, bool] = {}
    times, dets, gts = [], [], []
    for f in range(frames):
        ids, boxes, labels = world.ids[f], world.boxes[f], world.labels[f]
        for i in ids.tolist():  # dim stretches evolve in every camera frame, taken or not
            dim[i] = rng.random() >= dim_end if dim.get(i) else rng.random() < dim_start
        vis = visibility(boxes, boxes[:, 3])
        draws = rng.random((len(ids), 4))
        jitter = rng.normal(0, 1, (len(ids), 4))
        nfp_low, nfp_high = rng.poisson(fp_low), rng.poisson(fp_high)
        fp_xy = rng.uniform([0, 0], [W - 120, H - 200], (nfp_low + nfp_high, 2))
        fp_wh = rng.uniform([30, 60], [120, 200], (nfp_low + nfp_high, 2))
        fp_score = np.concatenate([rng.uniform(0.1, 0.45, nfp_low), rng.uniform(0.6, 0.75, nfp_high)])
        fp_label = rng.integers(0, 1 + int(labels.max(initial=0)), nfp_low + nfp_high)
        if f not in chosen:
            continue
        in_view = vis >= MIN_VISIBLE
        clipped = np.clip(boxes, 0, [W, H, W, H])
        gts.append(np.hstack([ids[in_view, None], clipped[in_view]]).astype(np.float64))
        size = np.hstack([boxes[:, 2:] - boxes[:, :2]] * 2)
        partly = vis < 0.6
        seen = in_view & (draws[:, 0] >= np.where(partly, 0.3, miss))
        score = np.where(
            partly | np.array([dim.get(i, False) for i in ids.tolist()], bool),
            0.15 + 0.30 * draws[:, 1],
            0.6 + 0.35 * draws[:, 2],
        )
        noisy = clipped + jitter * size * noise * np.where(partly, 2.0, 1.0)[:, None]
        det = np.hstack([noisy[seen], score[seen, None], labels[seen, None]])
        fp = np.hstack([fp_xy, fp_xy + fp_wh, fp_score[:, None], fp_label[:, None]])
        order = rng.permutation(len(det) + len(fp))  # a detector lists boxes in no particular order
        times.append(f / world.fps)
        dets.append(np.vstack([det, fp])[order].astype(np.float64))
    return times, dets, gts


# --------------------------------------------------------------------------------------- scenarios
def bouncing(frames: int = 1000, objects: int = 50, seed: int = 27) -> Sequence:
    """scripts/bench_trackers.py's sequence: 50 objects at constant speed bouncing off the frame's
    edges, 2 px box noise, 5 % missed, 15 % at a low score, ~2 low-score false positives a frame.
    Objects overlap freely (no occlusion): the same detections as docs/tracking-choice.md's."""
    dets, gts = synthetic(frames, objects, seed, dtype="float64")
    times = [f / 30.0 for f in range(frames)]
    dets = [np.hstack([d, np.zeros((len(d), 1))]) for d in dets]  # label 0
    return Sequence(
        "bouncing",
        f"{objects} objects bouncing off the edges, 5 % missed, 15 % low scores, 2 false positives a frame",
        times,
        dets,
        gts,
    )


def _walkers(
    seconds: float, fps: float, seed: int, people: int, cyclists: int, lane: tuple[float, float]
) -> World:
    """People (label 0) and cyclists (label 1) crossing the frame left to right and right to left
    in a band of the picture, entering at random times; boxes grow towards the camera (larger y)."""
    rng = np.random.default_rng(seed)
    count = people + cyclists
    label = np.array([0] * people + [1] * cyclists)
    rng.shuffle(label)
    direction = rng.choice([-1.0, 1.0], count)
    speed = np.where(label == 0, rng.uniform(60, 140, count), rng.uniform(180, 300, count))  # px/s
    y_foot = rng.uniform(*lane, count)  # bottom edge: the depth
    scale = 0.6 + 0.8 * (y_foot - 400) / (H - 400)
    height = np.where(label == 0, 170, 150) * scale * rng.uniform(0.9, 1.1, count)
    width = np.where(label == 0, 0.4, 0.9) * height
    crossing = (W + width) / speed  # seconds to cross the frame
    enter = rng.uniform(-crossing, seconds, count)  # some already in view at the start
    world = World(fps)
    for f in range(int(seconds * fps)):
        t = f / fps
        x_lead = (t - enter) * speed - width  # left edge, moving right from just outside
        x1 = np.where(direction > 0, x_lead, W - x_lead - width)
        y = y_foot + 4 * np.sin(2 * np.pi * (t - enter) * 1.5)  # a walk's bob
        inside = (x1 + width > 0) & (x1 < W)
        boxes = np.stack([x1, y - height, x1 + width, y], axis=1)[inside]
        world.ids.append(np.flatnonzero(inside).astype(np.int64))
        world.boxes.append(boxes)
        world.labels.append(label[inside].astype(np.int64))
    return world


def crossing(seconds: float = 20.0, seed: int = 11) -> Sequence:
    """A crowded street: 60 people and 15 cyclists crossing each other both ways in a 300 px band,
    hiding each other (the nearer box wins), 5 % missed, 1.5 low-score false positives a frame."""
    world = _walkers(seconds, 30.0, seed, 60, 15, (650, 950))
    times, dets, gts = observe(world, seed + 1, fp_low=1.5)
    return Sequence(
        "crossing", "75 people and cyclists crossing both ways in a band, hiding each other", times, dets, gts
    )


def occlusion(seconds: float = 16.0, seed: int = 5) -> Sequence:
    """Vans (label 2) driving left in the near lane, one every ~2 s, in front of a file of people
    (label 0) walking right: each van hides each person it passes completely for ~0.5 s, and
    partly (low scores, more misses) just before and after."""
    rng = np.random.default_rng(seed)
    fps = 30.0
    people = 12
    p_x = -2000 + 240 * np.arange(people) + rng.uniform(-30, 30, people)  # left edges at t = 0
    p_speed = rng.uniform(55, 65, people)  # px/s: about the same pace, so they seldom overtake
    p_h = rng.uniform(140, 160, people)
    p_w = 0.4 * p_h
    p_y2 = rng.uniform(625, 655, people)
    vans = int(seconds / 2)
    v_enter = 2.0 * np.arange(vans) + rng.uniform(0, 0.3, vans)
    v_speed, v_w, v_h, v_y2 = 380.0, 250.0, 260.0, 720.0  # in front of the people, taller than them
    world = World(fps)
    for f in range(int(seconds * fps)):
        t = f / fps
        px1 = p_x + p_speed * t
        p_in = (px1 + p_w > 0) & (px1 < W)
        vx1 = W - (t - v_enter) * v_speed
        v_in = (t >= v_enter) & (vx1 + v_w > 0) & (vx1 < W)
        person = np.stack([px1, p_y2 - p_h, px1 + p_w, p_y2], axis=1)[p_in]
        van = np.stack([vx1, np.full(vans, v_y2 - v_h), vx1 + v_w, np.full(vans, v_y2)], axis=1)[v_in]
        world.ids.append(np.concatenate([np.flatnonzero(p_in), 1000 + np.flatnonzero(v_in)]))
        world.boxes.append(np.vstack([person, van]))
        world.labels.append(np.concatenate([np.zeros(len(person), np.int64), np.full(len(van), 2, np.int64)]))
    times, dets, gts = observe(world, seed + 1, fp_low=1.0)
    return Sequence(
        "occlusion", "vans passing in front of a file of people, hiding each for ~0.5 s", times, dets, gts
    )


def low_scores(seconds: float = 20.0, seed: int = 8) -> Sequence:
    """25 people crossing a wide band with stretches of low scores (0.15-0.45, ~1 s long, about one
    every 3 s per object: bad light, blur), 3 low-score and a few high-score false positives."""
    world = _walkers(seconds, 30.0, seed, 25, 0, (500, 1050))
    times, dets, gts = observe(world, seed + 1, dim_start=0.012, dim_end=0.033, fp_low=3.0, fp_high=0.1)
    return Sequence(
        "low scores",
        "25 people, stretches of ~1 s at low scores, 3 false positives a frame",
        times,
        dets,
        gts,
    )


def dropped_frames(seconds: float = 30.0, seed: int = 21) -> Sequence:
    """The crowded street from a 30 fps camera when the model is slower than the camera: the
    tracker gets frames 1-3 camera frames apart, and now and then nothing for 0.2-0.5 s."""

    def keep(rng: np.random.Generator, frames: int) -> list[int]:
        chosen, f = [], 0
        while f < frames:
            chosen.append(f)
            f += (
                int(rng.choice([1, 2, 3, 3], p=[0.4, 0.3, 0.2, 0.1]))
                if rng.random() > 0.05
                else int(rng.integers(6, 16))
            )
        return chosen

    world = _walkers(seconds, 30.0, seed, 40, 10, (650, 950))
    times, dets, gts = observe(world, seed + 1, fp_low=1.5, keep=keep)
    return Sequence(
        "dropped frames", "the street, frames 33-100 ms apart and gaps of 0.2-0.5 s", times, dets, gts
    )


SCENARIOS: dict[str, Callable[[], Sequence]] = {
    "bouncing": bouncing,
    "crossing": crossing,
    "occlusion": occlusion,
    "low scores": low_scores,
    "dropped frames": dropped_frames,
}


# ------------------------------------------------------------------------------------- trackers
Step = Callable[[Array, float], tuple[Array, npt.NDArray[np.int64]]]  # dets, now -> (boxes, ids)


def ours(config: Any) -> Step:
    """agent.processing.tracking.Tracker: the detections it gave an id."""
    from agent.processing.tracking import Tracker

    tracker = Tracker(config)

    def step(det: Array, now: float) -> tuple[Array, npt.NDArray[np.int64]]:
        ids = tracker.update(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), now).ids
        return det[ids >= 0, :4], ids[ids >= 0]

    return step


def reference(config: Any) -> Step:
    """roboflow `trackers`' ByteTrackTracker with the same thresholds, fed the capture times.

    It is class-agnostic and treats every detection below `high_conf_det_threshold` as low, so
    detections below our `low_score` are left out first, as our tracker ignores them."""
    import supervision as sv
    from trackers import ByteTrackTracker

    fps = 30.0
    tracker = ByteTrackTracker(
        lost_track_buffer=round(config.max_lost_s * 30),  # in 30 fps frames; with timestamps: seconds
        frame_rate=fps,
        track_activation_threshold=config.new_track_score,
        minimum_consecutive_frames=config.min_hits,
        minimum_iou_threshold=config.min_iou,
        high_conf_det_threshold=config.high_score,
    )

    def step(det: Array, now: float) -> tuple[Array, npt.NDArray[np.int64]]:
        det = det[det[:, 4] >= config.low_score]
        out = tracker.update(
            sv.Detections(xyxy=det[:, :4], confidence=det[:, 4], class_id=det[:, 5].astype(int)),
            timestamp=now,
        )
        ids = np.asarray(out.tracker_id, np.int64)
        return np.asarray(out.xyxy[ids >= 0], np.float64), ids[ids >= 0]

    return step


def reference_defaults() -> Step:
    """`trackers`' ByteTrackTracker with its own defaults (activation 0.7, high 0.6, IoU 0.1, 2
    frames, 30 frames lost), fed capture times, as scripts/bench_trackers.py measured it (it passed
    every detection; those under 0.1 are left out here too)."""
    import supervision as sv
    from trackers import ByteTrackTracker

    tracker = ByteTrackTracker()

    def step(det: Array, now: float) -> tuple[Array, npt.NDArray[np.int64]]:
        det = det[det[:, 4] >= 0.1]
        out = tracker.update(
            sv.Detections(xyxy=det[:, :4], confidence=det[:, 4], class_id=det[:, 5].astype(int)),
            timestamp=now,
        )
        ids = np.asarray(out.tracker_id, np.int64)
        return np.asarray(out.xyxy[ids >= 0], np.float64), ids[ids >= 0]

    return step


@dataclass
class Run:
    """One tracker's output on one sequence, and how long its steps took."""

    boxes: list[Array]
    ids: list[npt.NDArray[np.int64]]
    seconds: list[float]


def run(seq: Sequence, step: Step) -> Run:
    out = Run([], [], [])
    for det, now in zip(seq.dets, seq.times, strict=True):
        t = time.perf_counter()
        boxes, ids = step(det, now)
        out.seconds.append(time.perf_counter() - t)
        out.boxes.append(boxes)
        out.ids.append(ids)
    return out


# -------------------------------------------------------------------------------------- metrics
def iou_distance(a: Array, b: Array, max_d: float = 1 - MATCH_IOU) -> Array:
    """1 - IoU of boxes a (N, 4) and b (M, 4), NaN beyond max_d (no match). motmetrics 1.4.0's own
    `iou_matrix` calls np.asfarray, which numpy 2 removed, so the distances are made here."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), 2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), 1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    d = 1 - inter / np.maximum(union, 1e-9)
    result: Array = np.where(d > max_d, np.nan, d)
    return result


@dataclass
class Scores:
    mota: float
    idf1: float
    switches: int
    misses: int
    false_positives: int
    objects: int  # ground-truth boxes over all frames


def evaluate(seq: Sequence, out: Run) -> Scores:
    """MOTA, IDF1 and ID switches (motmetrics) of a tracker's output against the ground truth."""
    import motmetrics as mm

    acc = mm.MOTAccumulator(auto_id=True)
    for gt, boxes, ids in zip(seq.gts, out.boxes, out.ids, strict=True):
        acc.update(gt[:, 0].astype(int), ids.astype(int), iou_distance(gt[:, 1:], boxes))
    m = mm.metrics.create().compute(
        acc, metrics=["mota", "idf1", "num_switches", "num_misses", "num_false_positives", "num_objects"]
    )
    row = m.iloc[0]
    return Scores(
        float(row["mota"]),
        float(row["idf1"]),
        int(row["num_switches"]),
        int(row["num_misses"]),
        int(row["num_false_positives"]),
        int(row["num_objects"]),
    )


def switches_per_object(seq: Sequence, out: Run) -> Iterator[tuple[int, list[int]]]:
    """(object id, its ids in order, one entry per change) for each object: who got swapped."""
    history: dict[int, list[int]] = {}
    for gt, boxes, ids in zip(seq.gts, out.boxes, out.ids, strict=True):
        d = iou_distance(gt[:, 1:], boxes)
        for g in range(len(gt)):
            row = np.where(np.isnan(d[g]), np.inf, d[g])
            if len(row) and np.isfinite(row.min()):
                h = history.setdefault(int(gt[g, 0]), [])
                i = int(ids[int(row.argmin())])
                if not h or h[-1] != i:
                    h.append(i)
    for obj, h in history.items():
        if len(h) > 1:
            yield obj, h
