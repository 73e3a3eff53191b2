#!/usr/bin/env python3
"""Render a clip of faces walking on known paths, and what a pipeline's zones and lines should count
in it (the tracking quick start's clip, scripts/demo_tracking.sh; tests/test_tracking_video.py renders
its own walks with `render` too).

A walking "person" is the astronaut's face (a real photo shipped in scikit-image) pasted on a plain,
gently shaded background, its centre moving on straight lines between key points (`Walk`); the real
YOLOv8n face detector of the nudenet wheel finds it as FACE_FEMALE (~0.8) on every frame (checked in
tests/test_tracking_video.py). The ground truth is plain geometry on those paths, written here and not
taken from the agent: each face's anchor (the bottom centre of its face box, the part in the picture)
against rectangular zones and straight lines of a pipeline's config.

The shop (`SHOP`): a camera over a shop's door, the door line across the lower part of the picture,
the counter at the top right. Three people walk through and one waits at the counter:

    A   comes in at the left and walks up out of the picture (crosses the door `in`);
    B   comes in at the right, walks up past the counter without stopping (in the counter ~1 s);
    C   walks down from the top and out through the door (`out`);
    D   comes in, waits at the counter ~7 s (longer than its dwell_s: a `dwell`), leaves at the top.

Usage: make_tracking_video.py OUT.avi --config agent.yaml [--pipeline NAME] [--truth OUT.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml
from skimage import data as skimage_data

# (t seconds, x, y) key points of a face's centre in frame pixels, straight lines between them. A face
# is drawn from its first key point's time until its last one's; a centre beyond the frame's edge is
# drawn cut (wholly out of the picture when far enough).
Walk = list[tuple[float, float, float]]

FACE_IN_PHOTO = (173, 82, 274, 180)  # the astronaut's face in the 512x512 photo (../shared/MODELS.md)
MARGIN = 20  # photo pixels kept around the face: some hair and helmet, so the detector sees a face
SCALE = 1.2  # the face is ~121x118 px in the clip: ~60 px at the model's 320 letterbox, score ~0.8


@dataclass(frozen=True)
class Clip:
    """A clip's frame size, rate, length and walks."""

    walks: dict[str, Walk]
    seconds: float
    width: int = 640
    height: int = 480
    fps: int = 10
    face_scale: float = SCALE  # the face's size against the photo's (a bigger frame wants a bigger face)

    @property
    def frames(self) -> int:
        return round(self.seconds * self.fps)


@dataclass(frozen=True)
class Truth:
    """Frame `index`'s faces: name -> the face's box in the frame, clipped to it (visible part)."""

    index: int
    faces: dict[str, tuple[float, float, float, float]]
    whole: dict[str, bool]  # the face is wholly inside the frame


def photo_patch(scale: float = SCALE) -> tuple[np.ndarray, np.ndarray]:
    """The face with its margin, scaled, and the face's box inside it (x1, y1, x2, y2)."""
    x1, y1, x2, y2 = FACE_IN_PHOTO
    photo = cv2.cvtColor(skimage_data.astronaut(), cv2.COLOR_RGB2BGR)
    crop = photo[y1 - MARGIN : y2 + MARGIN, x1 - MARGIN : x2 + MARGIN]
    interpolation = cv2.INTER_AREA if scale <= 1 else cv2.INTER_LINEAR
    patch = cv2.resize(crop, None, fx=scale, fy=scale, interpolation=interpolation)
    face = np.array([MARGIN, MARGIN, MARGIN + x2 - x1, MARGIN + y2 - y1], np.float64) * scale
    return patch, face


def background(width: int, height: int) -> np.ndarray:
    """A plain, gently shaded background (the detector finds nothing in it: checked)."""
    y, x = np.mgrid[0:height, 0:width]
    shade = np.stack([90 + 30 * x / width, 110 + 20 * y / height, np.full(x.shape, 100.0)], axis=-1)
    return shade.astype(np.uint8)


def centre_at(walk: Walk, t: float) -> tuple[float, float] | None:
    times = [k[0] for k in walk]
    if not times[0] <= t < times[-1]:
        return None
    return float(np.interp(t, times, [k[1] for k in walk])), float(np.interp(t, times, [k[2] for k in walk]))


def render(path: Path, clip: Clip, scene: np.ndarray | None = None, noise: float = 0.0) -> list[Truth]:
    """Write the clip (MJPG in AVI: every frame a JPEG, no inter-frame smearing) and return each
    frame's ground truth. `scene`: the still background (BGR, the clip's size; default the plain
    shade); `noise`: a camera sensor's grain, the standard deviation in grey levels, new each frame
    (scripts/bench_capacity.py: a camera's picture is never perfectly still)."""
    patch, face = photo_patch(clip.face_scale)
    ph, pw = patch.shape[:2]
    w, h = clip.width, clip.height
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), clip.fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write MJPG to {path}")
    still = background(w, h) if scene is None else scene
    if still.shape != (h, w, 3):
        raise ValueError(f"the scene is {still.shape}, the clip {(h, w, 3)}")
    grain = _Grain(still.shape, noise) if noise > 0 else None
    truth = []
    try:
        for index in range(clip.frames):
            frame, faces, whole = still.copy(), {}, {}
            for name, walk in clip.walks.items():
                centre = centre_at(walk, index / clip.fps)
                if centre is None:
                    continue
                x0, y0 = round(centre[0] - pw / 2), round(centre[1] - ph / 2)
                xs, ys, xe, ye = max(0, x0), max(0, y0), min(w, x0 + pw), min(h, y0 + ph)
                if xe <= xs or ye <= ys:
                    continue
                frame[ys:ye, xs:xe] = patch[ys - y0 : ye - y0, xs - x0 : xe - x0]
                box = face + np.array([x0, y0, x0, y0], np.float64)
                clipped = np.clip(box, 0, [w, h, w, h])
                if clipped[2] - clipped[0] > 0 and clipped[3] - clipped[1] > 0:
                    x1, y1, x2, y2 = (float(v) for v in clipped)
                    faces[name] = (x1, y1, x2, y2)
                    whole[name] = bool((clipped == box).all())
            writer.write(frame if grain is None else grain.add(frame, index))
            truth.append(Truth(index, faces, whole))
    finally:
        writer.release()
    return truth


class _Grain:
    """Sensor noise: a few fields of Gaussian grain drawn once (drawing 2.7 M numbers a frame costs more
    than the rest of a 720p frame), each frame one of them shifted by a pseudo-random offset."""

    FIELDS = 4

    def __init__(self, shape: tuple[int, ...], sigma: float) -> None:
        rng = np.random.default_rng(0)
        self.fields = [rng.normal(0, sigma, shape).astype(np.int16) for _ in range(self.FIELDS)]

    def add(self, frame: np.ndarray, index: int) -> np.ndarray:
        base = self.fields[index % self.FIELDS]
        shift = (index * 7919) % base.shape[0], (index * 104729) % base.shape[1]
        grain = np.roll(base, shift, axis=(0, 1))
        return np.clip(frame.astype(np.int16) + grain, 0, 255).astype(np.uint8)


# --- what zones and lines should count -----------------------------------------------------------------


@dataclass
class Visit:
    """One face's time in the picture (a face out of it and back is another visit): its zones in
    the order it entered them, its line crossings (line, direction) and when each happened, and each
    stay in a zone (zone, seconds: consecutive frames inside)."""

    name: str
    entered: list[str] = field(default_factory=list)
    crossings: list[tuple[str, str]] = field(default_factory=list)
    crossed_at: list[float] = field(default_factory=list)  # each crossing's time: its first frame past it
    stays: list[tuple[str, float]] = field(default_factory=list)


def _pixels(points: Sequence[Sequence[float]], shape: Mapping[str, Any], clip: Clip) -> np.ndarray:
    scale = [1.0, 1.0] if shape.get("units") == "pixels" else [clip.width, clip.height]
    return np.asarray(points, np.float64) * scale


def _rectangle(zone: Mapping[str, Any], clip: Clip) -> tuple[float, float, float, float]:
    """A zone's (left, top, right, bottom): the truth knows only upright rectangles."""
    points = _pixels(zone["points"], zone, clip)
    xs, ys = sorted({float(p) for p in points[:, 0]}), sorted({float(p) for p in points[:, 1]})
    if len(points) != 4 or len(xs) != 2 or len(ys) != 2:
        raise ValueError(f"zone {zone['name']}: the clip's truth needs an upright rectangle, got {points}")
    return xs[0], ys[0], xs[1], ys[1]


def _side(a: np.ndarray, b: np.ndarray, p: tuple[float, float]) -> float:
    """> 0 when p is right of the line a -> b as seen in the picture (y down), < 0 left, 0 on it."""
    return float((b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]))


def _crossing(
    line: Mapping[str, Any], clip: Clip, p0: tuple[float, float], p1: tuple[float, float]
) -> str | None:
    """The direction in which the step p0 -> p1 crosses `line` (docs/analytics.md: walking the line
    from its first point to its second, from its right side to its left is `in`), or None."""
    a, b = _pixels(line["points"], line, clip)
    s0, s1 = _side(a, b, p0), _side(a, b, p1)
    if s0 * s1 >= 0:
        return None
    pa = np.array(p0)
    pb = np.array(p1)
    if _side(pa, pb, (float(a[0]), float(a[1]))) * _side(pa, pb, (float(b[0]), float(b[1]))) > 0:
        return None  # beyond the line's ends
    return str(line.get("in", "in")) if s0 > 0 else str(line.get("out", "out"))


def visits(
    truth: Sequence[Truth], clip: Clip, zones: Sequence[Mapping[str, Any]], lines: Sequence[Mapping[str, Any]]
) -> list[Visit]:
    """What each face's anchor (the bottom centre of its box's visible part) did, visit by visit."""
    rectangles = {zone["name"]: _rectangle(zone, clip) for zone in zones}
    found: list[Visit] = []
    current: dict[str, Visit] = {}
    last: dict[str, tuple[int, tuple[float, float], dict[str, int]]] = {}  # frame, anchor, frames in zones
    for t in truth:
        for name, (x1, _, x2, y2) in t.faces.items():
            anchor = ((x1 + x2) / 2, y2)
            seen = last.get(name)
            if seen is None or seen[0] != t.index - 1:
                if seen is not None:
                    _close(current[name], seen[2], clip)
                current[name] = Visit(name)
                found.append(current[name])
                seen = (t.index, anchor, {})
            visit, inside = current[name], dict(seen[2])
            for zone_name, (left, top, right, bottom) in rectangles.items():
                if left <= anchor[0] <= right and top <= anchor[1] <= bottom:
                    if zone_name not in visit.entered:
                        visit.entered.append(zone_name)
                    inside[zone_name] = inside.get(zone_name, 0) + 1
                elif zone_name in inside:
                    visit.stays.append((zone_name, inside.pop(zone_name) / clip.fps))
            for line in lines:
                direction = _crossing(line, clip, seen[1], anchor)
                if direction is not None:
                    visit.crossings.append((str(line["name"]), direction))
                    visit.crossed_at.append(t.index / clip.fps)
            last[name] = (t.index, anchor, inside)
    for name, (_, _, inside) in last.items():
        _close(current[name], inside, clip)
    return found


def _close(visit: Visit, inside: dict[str, int], clip: Clip) -> None:
    visit.stays.extend((zone, frames / clip.fps) for zone, frames in inside.items())


def counts(
    found: Sequence[Visit], zones: Sequence[Mapping[str, Any]], lines: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The counts a pipeline should publish: per line and direction its crossings; per zone its
    entries and its dwell events (a stay longer than the zone's dwell_s)."""
    return {
        "lines": {
            line["name"]: {
                d: sum(v.crossings.count((line["name"], d)) for v in found)
                for d in (line.get("in", "in"), line.get("out", "out"))
            }
            for line in lines
        },
        "zones": {
            zone["name"]: {
                "entries": sum(zone["name"] in v.entered for v in found),
                "dwell": sum(
                    zone.get("dwell_s") is not None and stay > zone["dwell_s"]
                    for v in found
                    for z, stay in v.stays
                    if z == zone["name"]
                ),
            }
            for zone in zones
        },
    }


# --- the shop of the tracking quick start ----------------------------------------------------------------

SHOP = Clip(
    walks={
        "A": [(0.3, 160, 570), (4.3, 160, -90)],
        "B": [(1.5, 560, 570), (5.5, 560, -90)],
        "C": [(4.5, 330, -90), (8.5, 330, 570)],
        "D": [(6.0, 540, 570), (9.0, 540, 120), (15.0, 540, 120), (16.5, 540, -90)],
    },
    # The last face leaves at ~16.3 s; its track ends (`lost`) max_lost_s (1 s) later, on frames of
    # the empty shop.
    seconds=18.5,
)


def pipeline_of(config: Path, name: str | None) -> dict[str, Any]:
    """The pipeline `name` (default: the first with zones or lines) of an agent.yaml."""
    pipelines = yaml.safe_load(config.read_text()).get("pipelines") or []
    for pipeline in pipelines:
        counts_something = bool(pipeline.get("zones") or pipeline.get("lines"))
        if pipeline.get("name") == name or (name is None and counts_something):
            return dict(pipeline)
    raise SystemExit(f"{config}: " + (f"no pipeline {name!r}" if name else "no pipeline has zones or lines"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="The clip to write (.avi, MJPG).")
    parser.add_argument("--config", type=Path, required=True, help="The agent.yaml with the zones and lines.")
    parser.add_argument("--pipeline", help="Its pipeline (default: the first with zones or lines).")
    parser.add_argument("--truth", type=Path, help="Write what the zones and lines should count here (JSON).")
    args = parser.parse_args()
    pipeline = pipeline_of(args.config, args.pipeline)
    zones, lines = pipeline.get("zones") or [], pipeline.get("lines") or []
    truth = render(args.out, SHOP)
    found = visits(truth, SHOP, zones, lines)
    expected = counts(found, zones, lines)
    if args.truth:
        document = {
            "clip": {"file": str(args.out), "seconds": SHOP.seconds, "fps": SHOP.fps, "frames": SHOP.frames},
            "pipeline": pipeline["name"],
            **expected,
            "visits": [
                {"face": v.name, "entered": v.entered, "crossings": v.crossings, "stays": v.stays}
                for v in found
            ],
        }
        args.truth.write_text(json.dumps(document, indent=2))
    length = f"{SHOP.frames} frames ({SHOP.seconds:g} s at {SHOP.fps} fps)"
    print(f"wrote {args.out}: {length}, {len(SHOP.walks)} people")


if __name__ == "__main__":
    main()
