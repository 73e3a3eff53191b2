"""Multi-object tracking: ByteTrack on numpy, for detection and regions pipelines (docs/analytics.md).

Why our own and not a library: docs/tracking-choice.md measured the candidates; none met the
budgets (<= 1 ms a frame with 50 objects, <= 10 MB of resident memory), and the assignment step,
the one part worth a dependency, is `lap.lapjv` (scipy's `linear_sum_assignment` where `lap` has
no wheel). tests/test_tracking_metrics.py checks this tracker's MOTA and IDF1 against roboflow's
`trackers` ByteTrack on the same detections.

The algorithm (Zhang et al., "ByteTrack", ECCV 2022), per frame:
1. Every track's Kalman filter predicts its box at the frame's time (constant velocity).
2. Detections scoring at least `high_score` are matched to all tracks by IoU (Hungarian), at least
   `min_iou`; with `per_label`, only to tracks of their own label.
3. Detections between `low_score` and `high_score` are matched to the confirmed tracks still
   unmatched, at IoU >= 0.3: a partly hidden object keeps its track. (ByteTrack offers them only
   to tracks seen in the previous frame, at 0.5; offering them to lost tracks too, at 0.3, halved
   the misses and ID switches on tests/test_tracking_metrics.py's sequences.)
4. A high-score detection left over, scoring at least `new_track_score`, starts a tentative track;
   a tentative track that misses a frame is dropped, one matched `min_hits` frames in a row is
   confirmed and gets the pipeline's next id. Ids are never reused.
5. A confirmed track that misses frames is lost; it is kept (predicted) for `max_lost_s` and then
   ends.

Motion is in seconds, not frames: the daemon drops frames when the model is slower than the
camera, so the filter steps by each frame's capture time. Its noise is ByteTrack's per-frame
noise at `_NOMINAL_FPS`, scaled to the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent.config import TrackConfig

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_NOMINAL_FPS = 30.0  # ByteTrack's noise constants are per frame at this rate
_LOW_STAGE_MIN_IOU = 0.3  # step 3's threshold (the module's docstring)
_TENTATIVE_MIN_IOU = 0.3  # a tentative track matched to its second detection
_POS_NOISE, _VEL_NOISE = 1 / 20, 1 / 160  # ByteTrack's std weights, times the box height
_NO_MATCH = 1e6  # cost of a pair the assignment must not take


def _assignment_solver() -> Callable[[Array], tuple[IntArray, IntArray]]:
    """(rows, cols) of a minimum-cost assignment of a cost matrix: lap's lapjv, else scipy's."""
    try:
        import lap
    except ImportError:  # no lap wheel for this platform (armv7): scipy, at ~40 MB more memory
        from scipy.optimize import linear_sum_assignment

        def solve_scipy(cost: Array) -> tuple[IntArray, IntArray]:
            rows, cols = linear_sum_assignment(cost)
            return rows.astype(np.int64), cols.astype(np.int64)

        return solve_scipy

    def solve_lap(cost: Array) -> tuple[IntArray, IntArray]:
        _, x, _ = lap.lapjv(cost, extend_cost=True)
        rows = np.flatnonzero(x >= 0)
        return rows.astype(np.int64), np.asarray(x[rows], dtype=np.int64)

    return solve_lap


_solve: Callable[[Array], tuple[IntArray, IntArray]] | None = None


def _match(cost: Array, max_cost: float) -> tuple[IntArray, IntArray]:
    """The pairs (rows, cols) of the cheapest assignment whose cost is at most `max_cost`."""
    global _solve
    if cost.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if _solve is None:
        _solve = _assignment_solver()
    rows, cols = _solve(np.where(cost > max_cost, _NO_MATCH, cost))
    keep = cost[rows, cols] <= max_cost
    return rows[keep], cols[keep]


def iou_matrix(a: npt.ArrayLike, b: npt.ArrayLike) -> Array:
    """(N, M) intersection over union of boxes [x1, y1, x2, y2]; 0 for boxes of no area."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    ax1, ay1, ax2, ay2 = (a[:, i : i + 1] for i in range(4))  # (N, 1) against (M,): no (N, M, 2) arrays
    bx1, by1, bx2, by2 = (b[:, i] for i in range(4))
    width = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    height = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    inter = np.maximum(width, 0.0) * np.maximum(height, 0.0)
    area_a = np.maximum(ax2 - ax1, 0.0) * np.maximum(ay2 - ay1, 0.0)
    area_b = np.maximum(bx2 - bx1, 0.0) * np.maximum(by2 - by1, 0.0)
    union = area_a + area_b - inter
    result: Array = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return result


def _to_xyah(boxes: Array) -> Array:
    w = boxes[:, 2] - boxes[:, 0]
    h = np.maximum(boxes[:, 3] - boxes[:, 1], 1e-6)
    return np.stack([boxes[:, 0] + w / 2, boxes[:, 1] + h / 2, w / h, h], axis=1)


def _to_xyxy(state: Array) -> Array:
    h = state[:, 3]
    w = state[:, 2] * h
    return np.stack([state[:, 0] - w / 2, state[:, 1] - h / 2, state[:, 0] + w / 2, state[:, 1] + h / 2], 1)


def _diagonal(values: Array) -> Array:
    """(N, K, K) with each row of (N, K) `values` on the diagonal."""
    k = values.shape[1]
    out = np.zeros((len(values), k, k))
    out[:, np.arange(k), np.arange(k)] = values
    return out


def _noise_std(height: Array, pos: float, vel: float) -> Array:
    """(N, 8) standard deviations for cx, cy, a, h and their velocities (a's are fixed small)."""
    weights = np.array([pos, pos, 0.0, pos, vel, vel, 0.0, vel])
    fixed = np.array([0.0, 0.0, 1e-2, 0.0, 0.0, 0.0, 1e-5, 0.0])
    std: Array = height[:, None] * weights + fixed
    return std


@dataclass
class TrackStep:
    """What one frame did to the tracks."""

    ids: IntArray  # per detection: its confirmed track's id, or -1 (tentative, unmatched, too low)
    confirmed: list[int]  # ids confirmed in this frame (their first appearance as a track)
    ended: list[int]  # ids lost longer than max_lost_s, ended in this frame
    lost: list[int] = field(default_factory=list)  # confirmed ids alive but not seen in this frame


class Tracker:
    """ByteTrack (the module's docstring) for one pipeline. Not thread-safe: one caller per frame."""

    def __init__(self, config: TrackConfig, next_id: int = 1) -> None:
        self.config = config
        self.next_id = next_id  # ids go on from a restart's journal: never reused in a pipeline
        self.mean = np.zeros((0, 8))  # Kalman state: cx, cy, aspect, height and their velocities / s
        self.cov = np.zeros((0, 8, 8))
        self.ids = np.zeros(0, np.int64)  # -1 while tentative
        self.labels = np.zeros(0, np.int64)
        self.hits = np.zeros(0, np.int64)  # matches in a row
        self.seen = np.zeros(0, np.float64)  # last matched (capture time, s)
        self.matched_last = np.zeros(0, bool)  # matched in the previous frame
        self.time: float | None = None

    def __len__(self) -> int:
        return int(np.count_nonzero(self.ids >= 0))

    def update(
        self, boxes: npt.ArrayLike, scores: npt.ArrayLike, labels: npt.ArrayLike, now: float
    ) -> TrackStep:
        """One frame's detections: (N, 4) boxes [x1, y1, x2, y2], (N,) scores, (N,) integer labels
        (all 0 for class-agnostic input) at capture time `now` (seconds)."""
        cfg = self.config
        det = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        score = np.asarray(scores, dtype=np.float64).reshape(-1)
        label = np.asarray(labels, dtype=np.int64).reshape(-1)
        dt = 0.0 if self.time is None else max(now - self.time, 0.0)
        self.time = now if self.time is None else max(self.time, now)
        self._predict(dt)

        high = np.flatnonzero(score >= cfg.high_score)
        low = np.flatnonzero((score >= cfg.low_score) & (score < cfg.high_score))
        # 1 - IoU of every track's predicted box with every detection, once; each stage takes its block.
        cost_all = 1.0 - iou_matrix(_to_xyxy(self.mean), det)
        if cfg.per_label:
            cost_all[self.labels[:, None] != label[None, :]] = _NO_MATCH
        det_of = np.full(len(self.mean), -1, np.int64)  # per track: its detection this frame
        used = np.zeros(len(det), bool)

        def associate(tracks: IntArray, dets: IntArray, min_iou: float) -> None:
            if not len(tracks) or not len(dets):
                return
            rows, cols = _match(cost_all[np.ix_(tracks, dets)], 1.0 - min_iou)
            det_of[tracks[rows]] = dets[cols]
            used[dets[cols]] = True

        confirmed = self.ids >= 0
        associate(np.flatnonzero(confirmed), high, cfg.min_iou)
        associate(np.flatnonzero(confirmed & (det_of < 0)), low, _LOW_STAGE_MIN_IOU)
        associate(np.flatnonzero(~confirmed), high[~used[high]], _TENTATIVE_MIN_IOU)

        matched = np.flatnonzero(det_of >= 0)
        self._correct(matched, _to_xyah(det[det_of[matched]]))
        if not cfg.per_label:
            self.labels[matched] = label[det_of[matched]]  # class-agnostic: the latest label
        self.hits[matched] += 1
        self.seen[matched] = now
        missed = det_of < 0
        self.hits[missed] = 0
        self.matched_last = ~missed

        newly = np.flatnonzero((self.ids < 0) & (self.hits >= cfg.min_hits))
        confirmed_now = list(range(self.next_id, self.next_id + len(newly)))
        self.ids[newly] = confirmed_now
        self.next_id += len(newly)

        expired = (self.ids >= 0) & missed & (now - self.seen > cfg.max_lost_s)
        ended = [int(i) for i in self.ids[expired]]
        keep = ~expired & ~((self.ids < 0) & missed)  # a tentative track that misses is dropped
        ids_per_det = np.full(len(det), -1, np.int64)
        ids_per_det[det_of[matched]] = self.ids[matched]
        lost = [int(i) for i in self.ids[keep & missed & (self.ids >= 0)]]
        self._keep(keep)
        new = high[~used[high] & (score[high] >= cfg.new_track_score)]
        started = self._start(new, det, label, now)
        ids_per_det[new] = started
        confirmed_now += [int(i) for i in started if i >= 0]
        return TrackStep(ids_per_det, confirmed_now, ended, lost)

    def end_all(self) -> list[int]:
        """End every confirmed track (the pipeline stops or tracking is turned off); returns their ids."""
        ended = [int(i) for i in self.ids[self.ids >= 0]]
        self._keep(np.zeros(len(self.ids), bool))
        return ended

    def boxes(self) -> dict[int, list[float]]:
        """Each confirmed track's current (predicted or corrected) box."""
        alive = self.ids >= 0
        return {
            int(i): [float(v) for v in box]
            for i, box in zip(self.ids[alive], _to_xyxy(self.mean[alive]), strict=True)
        }

    # --- Kalman filter: constant velocity on (cx, cy, aspect, height) -----------------------------

    def _predict(self, dt: float) -> None:
        if not len(self.mean) or dt <= 0:
            return
        lost = ~self.matched_last
        self.mean[lost, 7] = 0.0  # a lost track's height stops changing (ByteTrack)
        steps = dt * _NOMINAL_FPS  # noise per nominal frame, times the frames this step spans
        std = _noise_std(self.mean[:, 3], _POS_NOISE, _VEL_NOISE * _NOMINAL_FPS)
        # x' = F x and P' = F P F^T + Q with F = [[I, dt I], [0, I]], written out by blocks.
        self.mean[:, :4] += dt * self.mean[:, 4:]
        cov = self.cov
        top_right = cov[:, :4, 4:] + dt * cov[:, 4:, 4:]
        cov[:, :4, :4] += dt * (cov[:, 4:, :4] + top_right)
        cov[:, :4, 4:] = top_right
        cov[:, 4:, :4] = top_right.transpose(0, 2, 1)
        cov += _diagonal(std**2 * steps)

    def _correct(self, rows: IntArray, measured: Array) -> None:
        if not len(rows):
            return
        mean, cov = self.mean[rows], self.cov[rows]
        # The filter observes the first four of the eight states: H P H^T and P H^T are slices of P.
        std = _noise_std(mean[:, 3], _POS_NOISE, 0.0)[:, :4]
        innovation_cov = cov[:, :4, :4] + _diagonal(std**2)
        gain = cov[:, :, :4] @ np.linalg.inv(innovation_cov)
        self.mean[rows] = mean + (gain @ (measured - mean[:, :4])[:, :, None])[:, :, 0]
        self.cov[rows] = cov - gain @ cov[:, :4, :]

    def _start(self, new: IntArray, det: Array, label: IntArray, now: float) -> IntArray:
        """Tracks for the detections `new`; returns their ids (-1: tentative until min_hits)."""
        if not len(new):
            return np.zeros(0, np.int64)
        mean = np.zeros((len(new), 8))
        mean[:, :4] = _to_xyah(det[new])
        std = _noise_std(mean[:, 3], 2 * _POS_NOISE, 10 * _VEL_NOISE * _NOMINAL_FPS)
        ids = np.full(len(new), -1, np.int64)
        if self.config.min_hits <= 1:  # confirmed at first sight
            ids = np.arange(self.next_id, self.next_id + len(new), dtype=np.int64)
            self.next_id += len(new)
        self.mean = np.concatenate([self.mean, mean])
        self.cov = np.concatenate([self.cov, _diagonal(std**2)])
        self.ids = np.concatenate([self.ids, ids])
        self.labels = np.concatenate([self.labels, label[new]])
        self.hits = np.concatenate([self.hits, np.ones(len(new), np.int64)])
        self.seen = np.concatenate([self.seen, np.full(len(new), now)])
        self.matched_last = np.concatenate([self.matched_last, np.ones(len(new), bool)])
        return ids

    def _keep(self, keep: npt.NDArray[np.bool_]) -> None:
        self.mean, self.cov, self.ids = self.mean[keep], self.cov[keep], self.ids[keep]
        self.labels, self.hits, self.seen = self.labels[keep], self.hits[keep], self.seen[keep]
        self.matched_last = self.matched_last[keep]
