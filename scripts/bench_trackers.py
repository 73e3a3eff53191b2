#!/usr/bin/env python3
"""Measure what candidate object trackers cost in import time, resident memory and
per-frame time, on synthetic detections (issue 27; results in docs/tracking-choice.md).

Not imported by the tests and not part of the daemon. Each candidate runs in a fresh
child process of the venv that holds it, so one venv per candidate is fine:

    python scripts/bench_trackers.py run --repeat 5 \\
        --cand own=/tmp/trk-misc/bin/python \\
        --cand trackers=/tmp/trk-trackers/bin/python \\
        --cand norfair=/tmp/trk-norfair/bin/python \\
        --cand boxmot=/tmp/trk-boxmot/bin/python \\
        --out /tmp/trk-out
    python scripts/bench_trackers.py assign --py scipy=/tmp/trk-misc/bin/python \\
        --py lap=/tmp/trk-lap/bin/python --py lapx=/tmp/trk-misc/bin/python
    /tmp/trk-misc/bin/python scripts/bench_trackers.py evaluate --out /tmp/trk-out

`own` is a ~150-line ByteTrack (numpy + scipy's linear_sum_assignment) kept in this
file only to show what a hand-written tracker would cost; it is a measurement aid,
not the daemon's tracker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

FRAMES = 1000
OBJECTS = 50
W, H = 1920, 1080


# --------------------------------------------------------------------------- data
def synthetic(frames: int = FRAMES, objects: int = OBJECTS, seed: int = 27, dtype: str = "float32"):
    """Known tracks with noise, misses, low-score detections and false positives.

    Returns (dets, gts): per frame an (N, 5) array x1,y1,x2,y2,score (of `dtype`) and an
    (M, 5) array id,x1,y1,x2,y2 of every object in view (missed or not). Also the
    `bouncing` scenario of tests/tracking_sequences.py."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pos = rng.uniform([100, 100], [W - 100, H - 100], size=(objects, 2))
    vel = rng.uniform(-6, 6, size=(objects, 2))
    size = rng.uniform([30, 50], [90, 160], size=(objects, 2))
    dets, gts = [], []
    for _ in range(frames):
        pos += vel
        for axis, lim in ((0, W), (1, H)):
            low = pos[:, axis] < size[:, axis] / 2
            high = pos[:, axis] > lim - size[:, axis] / 2
            vel[low | high, axis] *= -1
            pos[:, axis] = np.clip(pos[:, axis], size[:, axis] / 2, lim - size[:, axis] / 2)
        boxes = np.hstack([pos - size / 2, pos + size / 2])
        gts.append(np.hstack([np.arange(objects)[:, None], boxes]))
        seen = rng.random(objects) > 0.05  # 5 % missed detections
        noisy = boxes[seen] + rng.normal(0, 2.0, size=(int(seen.sum()), 4))
        score = np.where(
            rng.random(len(noisy)) < 0.85,
            rng.uniform(0.6, 0.95, len(noisy)),
            rng.uniform(0.15, 0.5, len(noisy)),
        )
        nfp = rng.poisson(2)  # false positives, low scores
        fp_xy = rng.uniform([0, 0], [W - 80, H - 80], size=(nfp, 2))
        fp = np.hstack([fp_xy, fp_xy + rng.uniform(30, 80, size=(nfp, 2)), rng.uniform(0.1, 0.45, (nfp, 1))])
        dets.append(np.vstack([np.hstack([noisy, score[:, None]]), fp]).astype(dtype))
    return dets, gts


# ------------------------------------------------------------- own ByteTrack (aid)
class OwnByteTrack:
    """ByteTrack: Kalman (cx, cy, a, h) constant velocity, two-stage IoU association."""

    def __init__(
        self, track_thresh=0.5, low_thresh=0.1, match_thresh=0.8, max_age=30, new_thresh=0.6, solver="scipy"
    ):
        import numpy as np

        if solver == "scipy":
            from scipy.optimize import linear_sum_assignment

            self._solve = linear_sum_assignment
        else:  # lap 0.5 or lapx: both install the module `lap`
            import lap

            def lapjv(cost):
                _, x, _ = lap.lapjv(cost, extend_cost=True)
                rows = np.flatnonzero(x >= 0)
                return rows, x[rows]

            self._solve = lapjv

        self.np = np
        self.track_thresh, self.low_thresh = track_thresh, low_thresh
        self.match_thresh, self.max_age, self.new_thresh = match_thresh, max_age, new_thresh
        self.mean = np.zeros((0, 8))
        self.cov = np.zeros((0, 8, 8))
        self.ids = np.zeros(0, int)
        self.state = np.zeros(0, int)  # 0 tentative, 1 tracked, 2 lost
        self.last = np.zeros(0, int)
        self.frame, self.next_id = 0, 1
        self.F = np.eye(8)
        self.F[:4, 4:] = np.eye(4)
        self.Hm = np.eye(4, 8)

    def _xyah(self, b):
        np = self.np
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        return np.stack([b[:, 0] + w / 2, b[:, 1] + h / 2, w / h, h], 1)

    def boxes(self, mean):
        np = self.np
        h = mean[:, 3]
        w = mean[:, 2] * h
        return np.stack([mean[:, 0] - w / 2, mean[:, 1] - h / 2, mean[:, 0] + w / 2, mean[:, 1] + h / 2], 1)

    def _iou(self, a, b):
        np = self.np
        if not len(a) or not len(b):
            return np.zeros((len(a), len(b)))
        lt = np.maximum(a[:, None, :2], b[None, :, :2])
        rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
        inter = np.prod(np.clip(rb - lt, 0, None), 2)
        area_a = np.prod(a[:, 2:] - a[:, :2], 1)
        area_b = np.prod(b[:, 2:] - b[:, :2], 1)
        return inter / (area_a[:, None] + area_b[None, :] - inter + 1e-9)

    def _match(self, cost, thresh):
        np = self.np
        if cost.size == 0:
            return np.zeros((0, 2), int)
        r, c = self._solve(np.where(cost > thresh, 1e5, cost))
        keep = cost[r, c] <= thresh
        return np.stack([r[keep], c[keep]], 1)

    def _predict(self):
        np = self.np
        h = self.mean[:, 3]
        std = np.stack(
            [h / 20, h / 20, np.full_like(h, 1e-2), h / 20, h / 160, h / 160, np.full_like(h, 1e-5), h / 160],
            1,
        )
        q = np.zeros_like(self.cov)
        idx = np.arange(8)
        q[:, idx, idx] = std**2
        lost = self.state == 2
        self.mean[lost, 7] = 0
        self.mean = self.mean @ self.F.T
        self.cov = self.F @ self.cov @ self.F.T + q

    def _update(self, rows, z):
        np = self.np
        m, p = self.mean[rows], self.cov[rows]
        h = m[:, 3]
        r = np.zeros((len(rows), 4, 4))
        r[:, [0, 1, 3], [0, 1, 3]] = (h / 20)[:, None] ** 2
        r[:, 2, 2] = 1e-2**2
        s = self.Hm @ p @ self.Hm.T + r
        k = p @ self.Hm.T @ np.linalg.inv(s)
        self.mean[rows] = m + (k @ (z - m[:, :4])[:, :, None])[:, :, 0]
        self.cov[rows] = p - k @ self.Hm @ p

    def update(self, dets):
        """dets: (N, 5) x1,y1,x2,y2,score. Returns (M, 5) id,x1,y1,x2,y2."""
        np = self.np
        self.frame += 1
        if len(self.mean):
            self._predict()
        score = dets[:, 4]
        hi = np.flatnonzero(score >= self.track_thresh)
        lo = np.flatnonzero((score >= self.low_thresh) & (score < self.track_thresh))
        z = self._xyah(dets[:, :4].astype(np.float64))
        tboxes = self.boxes(self.mean)
        det_of = np.full(len(self.mean), -1)
        used = np.zeros(len(dets), bool)

        def stage(pool, cand, thresh, fuse):
            iou = self._iou(tboxes[pool], dets[cand, :4])
            cost = 1 - (iou * score[cand][None, :] if fuse else iou)
            for i, j in self._match(cost, thresh):
                det_of[pool[i]] = cand[j]
                used[cand[j]] = True

        stage(np.flatnonzero(self.state >= 1), hi, self.match_thresh, True)
        stage(np.flatnonzero((self.state == 1) & (det_of < 0)), lo, 0.5, False)
        stage(np.flatnonzero(self.state == 0), hi[~used[hi]], 0.7, False)
        rows = np.flatnonzero(det_of >= 0)
        if len(rows):
            self._update(rows, z[det_of[rows]])
            self.state[rows] = 1
            self.last[rows] = self.frame
        miss = det_of < 0
        self.state[miss & (self.state == 1)] = 2
        keep = ~(miss & (self.state == 0)) & (self.frame - self.last <= self.max_age)
        new = hi[~used[hi] & (score[hi] >= self.new_thresh)]
        mean_new = np.zeros((len(new), 8))
        mean_new[:, :4] = z[new]
        h = z[new, 3]
        std = np.stack(
            [h / 10, h / 10, np.full_like(h, 1e-2), h / 10, h / 16, h / 16, np.full_like(h, 1e-5), h / 16], 1
        )
        cov_new = np.zeros((len(new), 8, 8))
        cov_new[:, np.arange(8), np.arange(8)] = std**2
        first = self.frame == 1
        self.mean = np.concatenate([self.mean[keep], mean_new])
        self.cov = np.concatenate([self.cov[keep], cov_new])
        self.ids = np.concatenate([self.ids[keep], np.arange(self.next_id, self.next_id + len(new))])
        self.next_id += len(new)
        self.state = np.concatenate([self.state[keep], np.full(len(new), 1 if first else 0)])
        self.last = np.concatenate([self.last[keep], np.full(len(new), self.frame)])
        out = (self.state == 1) & (self.last == self.frame)
        return np.hstack([self.ids[out][:, None], self.boxes(self.mean[out])])


# ------------------------------------------------------------------ candidates
def make_candidate(name: str):
    """Import the library (timed by the caller) and return step(dets) -> (M, 5)."""
    import numpy as np

    if name in ("own", "own-lap", "own-lapx"):  # own-lap*: module `lap` (lap or lapx)
        return OwnByteTrack(solver="scipy" if name == "own" else "lap").update
    if name == "trackers":
        import supervision as sv
        from trackers import ByteTrackTracker

        tracker = ByteTrackTracker(lost_track_buffer=30, frame_rate=30.0)

        def step(dets):
            out = tracker.update(
                sv.Detections(xyxy=dets[:, :4], confidence=dets[:, 4], class_id=np.zeros(len(dets), int))
            )
            ok = out.tracker_id >= 0
            return np.hstack([out.tracker_id[ok][:, None], out.xyxy[ok]])

        return step
    if name == "norfair":
        from norfair import Detection, Tracker

        tracker = Tracker(
            distance_function="iou", distance_threshold=0.7, hit_counter_max=30, initialization_delay=1
        )

        def step(dets):
            objs = tracker.update(
                [Detection(points=d[:4].reshape(2, 2), scores=np.array([d[4], d[4]])) for d in dets]
            )
            if not objs:
                return np.zeros((0, 5))
            return np.array([[o.id, *o.estimate.reshape(4)] for o in objs])

        return step
    if name == "boxmot":
        from boxmot import ByteTrack

        tracker = ByteTrack()

        def step(dets):
            out = tracker.update(np.hstack([dets, np.zeros((len(dets), 1), np.float32)]), None)
            if not len(out):
                return np.zeros((0, 5))
            return np.hstack([out[:, 4:5], out[:, :4]])

        return step
    raise SystemExit(f"unknown candidate {name}")


def child(name: str, out_dir: str | None) -> dict:
    """One fresh process: daemon-like baseline, import, 1,000 frames."""
    import gc

    import cv2  # noqa: F401  (the daemon already has numpy and cv2 loaded)
    import numpy as np
    import psutil

    dets, _ = synthetic()
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    step = make_candidate(name)
    import_s = time.perf_counter() - t0
    rss1 = proc.memory_info().rss
    per, tracks = [], []
    for i, d in enumerate(dets):
        t = time.perf_counter()
        out = step(d)
        per.append(time.perf_counter() - t)
        if out_dir:  # kept only when saving, so it does not count in the RSS runs
            tracks.append(np.hstack([np.full((len(out), 1), i), out]))
    gc.collect()
    rss2 = proc.memory_info().rss
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        np.save(Path(out_dir) / f"{name}.npy", np.vstack(tracks))
    return {
        "candidate": name,
        "import_ms": import_s * 1e3,
        "rss_import_mb": (rss1 - rss0) / 2**20,
        "rss_total_mb": (rss2 - rss0) / 2**20,
        "frame_ms_median": statistics.median(per) * 1e3,
        "frame_ms_p95": sorted(per)[int(0.95 * len(per))] * 1e3,
        "frame_ms_first": per[0] * 1e3,
    }


def run(args) -> None:
    cands = [c.split("=", 1) for c in args.cand]
    results: dict[str, list[dict]] = {n: [] for n, _ in cands}
    for _ in range(args.repeat):  # interleaved, so noise hits all alike
        for name, py in cands:
            cmd = [py, __file__, "child", name]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode:
                print(f"{name}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
                continue
            results[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
    if args.out:  # one more untimed pass per candidate that saves its tracks
        for name, py in cands:
            subprocess.run([py, __file__, "child", name, "--out", args.out], capture_output=True, check=False)
    keys = ["import_ms", "rss_import_mb", "rss_total_mb", "frame_ms_median", "frame_ms_p95"]
    print(f"{'candidate':10} " + " ".join(f"{k:>16}" for k in keys) + "   (median of runs)")
    summary = {}
    for name, rs in results.items():
        if not rs:
            continue
        summary[name] = {k: statistics.median(r[k] for r in rs) for k in keys}
        print(f"{name:10} " + " ".join(f"{summary[name][k]:16.2f}" for k in keys))
    if "own" in summary:
        print(
            "ratios to own: "
            + ", ".join(
                f"{n}: import x{s['import_ms'] / summary['own']['import_ms']:.1f}, "
                f"frame x{s['frame_ms_median'] / summary['own']['frame_ms_median']:.1f}"
                for n, s in summary.items()
                if n != "own"
            )
        )
    print(json.dumps(results))


# ------------------------------------------------------------- assignment solvers
ASSIGN_CHILD = r"""
import json, statistics, time, sys, gc
import numpy as np, cv2, psutil
rng = np.random.default_rng(0)
mats = [rng.random((50, 50)) for _ in range(1000)]
proc = psutil.Process(); gc.collect(); rss0 = proc.memory_info().rss
t0 = time.perf_counter()
kind = sys.argv[1]
if kind == "scipy":
    from scipy.optimize import linear_sum_assignment as solve
else:
    import lap
    def solve(c):
        return lap.lapjv(c, extend_cost=True)
imp = (time.perf_counter() - t0) * 1e3
per = []
for c in mats:
    t = time.perf_counter(); solve(c); per.append(time.perf_counter() - t)
rss = (proc.memory_info().rss - rss0) / 2**20
print(json.dumps({"kind": kind, "import_ms": imp, "rss_mb": rss,
                  "solve_us_median": statistics.median(per) * 1e6}))
"""


def assign(args) -> None:
    rows: dict[str, list[dict]] = {}
    for _ in range(args.repeat):
        for spec in args.py:
            name, py = spec.split("=", 1)
            res = subprocess.run(
                [py, "-c", ASSIGN_CHILD, "scipy" if name == "scipy" else "lap"],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.setdefault(name, []).append(json.loads(res.stdout))
    for name, rs in rows.items():
        print(
            f"{name:6} import {statistics.median(r['import_ms'] for r in rs):7.1f} ms   "
            f"RSS +{statistics.median(r['rss_mb'] for r in rs):5.1f} MB   "
            f"50x50 solve {statistics.median(r['solve_us_median'] for r in rs):7.1f} us"
        )


# ------------------------------------------------------------------- motmetrics
def iou_distance(a, b, max_d=0.5):
    """1 - IoU, NaN beyond max_d: motmetrics 1.4.0's own iou_matrix calls
    np.asfarray, which numpy 2 removed, so the distances are computed here."""
    import numpy as np

    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), 2)
    union = np.prod(a[:, 2:] - a[:, :2], 1)[:, None] + np.prod(b[:, 2:] - b[:, :2], 1)[None, :] - inter
    d = 1 - inter / np.maximum(union, 1e-9)
    return np.where(d > max_d, np.nan, d)


def evaluate(args) -> None:
    import numpy as np

    t0 = time.perf_counter()
    import motmetrics as mm

    imp = time.perf_counter() - t0
    _, gts = synthetic()
    for path in sorted(Path(args.out).glob("*.npy")):
        hyp = np.load(path)
        t = time.perf_counter()
        acc = mm.MOTAccumulator(auto_id=True)
        for f, gt in enumerate(gts):
            h = hyp[hyp[:, 0] == f]
            acc.update(gt[:, 0].astype(int), h[:, 1].astype(int), iou_distance(gt[:, 1:], h[:, 2:]))
        m = mm.metrics.create().compute(acc, metrics=["mota", "idf1", "num_switches"], name=path.stem)
        print(
            f"{path.stem:10} MOTA {m['mota'].iloc[0]:.3f}  IDF1 {m['idf1'].iloc[0]:.3f}  "
            f"ID switches {int(m['num_switches'].iloc[0]):4d}  "
            f"(motmetrics: {time.perf_counter() - t:.2f} s for {len(gts)} frames)"
        )
    print(f"import motmetrics: {imp * 1e3:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("name")
    c.add_argument("--out")
    r = sub.add_parser("run")
    r.add_argument("--cand", action="append", required=True, help="name=/path/to/venv/bin/python")
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--out", help="save each candidate's tracks here (for evaluate)")
    a = sub.add_parser("assign")
    a.add_argument(
        "--py",
        action="append",
        required=True,
        help="scipy=PY, lap=PY (lap 0.5), lapx=PY (lapx installs module 'lap')",
    )
    a.add_argument("--repeat", type=int, default=5)
    e = sub.add_parser("evaluate")
    e.add_argument("--out", required=True)
    ns = ap.parse_args()
    if ns.cmd == "child":
        print(json.dumps(child(ns.name, ns.out)))
    elif ns.cmd == "run":
        run(ns)
    elif ns.cmd == "assign":
        assign(ns)
    else:
        evaluate(ns)


if __name__ == "__main__":
    main()
