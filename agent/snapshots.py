"""Snapshots: each tracked object's best picture, kept on disk with a bounded retention.

A snapshot is the whole frame with that object's box drawn (JPEG), and optionally a clean crop of the
object. Files live under the store's root (the daemon's <state_dir>/snapshots):

    <root>/<pipeline>/<id>.jpg        the frame with the box
    <root>/<pipeline>/<id>.crop.jpg   the crop (when asked for)

An id is `<track id>-<10 hex digits>`: unique across restarts (track ids start again), and safe in
file names, MQTT topics and payloads. Each JPEG carries its snapshot's pipeline, label, track id,
capture time and the object's attributes read by then (second models: name -> {value, score, at, runs})
in a comment segment, so a restarted store knows its files again (their order and each label's latest)
without a second file to keep in step, and whoever gets the picture (the Home Assistant image, a
download) has what was read on it; the attributes are also in the drawn box's caption.

Retention (the agent's `snapshots:`, SnapshotRetentionConfig): after every save the oldest snapshots
(by capture time, then id) are removed until at most `max_count` remain and their files (a snapshot
and its crop counted as one, their bytes summed) take at most `max_bytes`. A new store scans its root
first, so the bound holds across restarts, and removes the temp files a crash left behind. One
process per root (the daemon's instance lock sees to it).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import math
import os
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.config.analytics import SnapshotRetentionConfig
from agent.config.base import NAME_PATTERN
from agent.errors import EdgeAgentError
from agent.fsutil import atomic_write_bytes
from agent.processing.drawing import draw_boxes, encode_jpeg

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"-?[0-9]+-[0-9a-f]{10}")
_PIPELINE_RE = re.compile(NAME_PATTERN)
_CROP_SUFFIX = ".crop.jpg"
_SUFFIX = ".jpg"
_TEMP_MARK = ".jpg.tmp-"  # fsutil.temp_name's names for our files
_COMMENT_PREFIX = b"edge-agent snapshot "
_MAX_META_BYTES = 32_768  # a JPEG comment holds 64 KiB at most
_CROP_MARGIN = 0.05  # of the box's longer side, around the crop: a little context


class SnapshotError(EdgeAgentError):
    """A snapshot cannot be written (disk full, permissions, a file where a directory should be), or
    the snapshot directory cannot be used. The message names the path."""


@dataclass(frozen=True)
class Snapshot:
    """One saved snapshot. `bytes`: its files' sizes together. `captured_at`: wall clock (time.time())."""

    id: str
    path: Path
    crop_path: Path | None
    bytes: int
    label: str
    track_id: int
    pipeline: str
    captured_at: float
    attributes: dict[str, Any] = field(default_factory=dict)  # what second models had read on the object


def crop_region(box: list[float], width: int, height: int) -> tuple[int, int, int, int] | None:
    """The pixels [x1, x2) x [y1, y2) of a box's crop: the box and a small margin, clamped to the
    width x height frame; None when nothing of it is inside the frame."""
    x1, y1, x2, y2 = (float(v) for v in box)
    x1, x2 = min(x1, x2), max(x1, x2)
    y1, y2 = min(y1, y2), max(y1, y2)
    margin = _CROP_MARGIN * max(x2 - x1, y2 - y1)
    left, top = max(0, math.floor(x1 - margin)), max(0, math.floor(y1 - margin))
    right, bottom = min(width, math.ceil(x2 + margin)), min(height, math.ceil(y2 + margin))
    if right <= left or bottom <= top:
        return None
    return left, top, right, bottom


def _with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The JPEG with a comment (COM) segment after its SOI and JFIF header (APP0 must come first)."""
    body = _COMMENT_PREFIX + text
    if len(body) + 2 > 0xFFFF:
        raise ValueError(f"snapshot metadata of {len(body)} bytes does not fit a JPEG comment")
    at = 2
    if jpeg[2:4] == b"\xff\xe0":
        at = 4 + int.from_bytes(jpeg[4:6], "big")
    segment = b"\xff\xfe" + (len(body) + 2).to_bytes(2, "big") + body
    return jpeg[:at] + segment + jpeg[at:]


def _read_comment(path: Path) -> dict[str, Any] | None:
    """Our metadata from the file's JPEG comment; None when it has none (or is no JPEG, or is cut
    short: a file a power cut left half-written)."""
    try:
        with path.open("rb") as f:
            if f.read(2) != b"\xff\xd8":
                return None
            for _ in range(32):  # our comment comes within the first few segments
                head = f.read(4)
                if len(head) < 4 or head[0] != 0xFF or head[1] in (0xD9, 0xDA):
                    return None
                length = int.from_bytes(head[2:4], "big")
                if head[1] != 0xFE:
                    f.seek(length - 2, os.SEEK_CUR)
                    continue
                body = f.read(length - 2)
                if body.startswith(_COMMENT_PREFIX):
                    meta = json.loads(body[len(_COMMENT_PREFIX) :])
                    return meta if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None
    return None


class SnapshotStore:
    """The snapshots on disk under `root`, bounded by `retention` (the module's docstring).

    Thread-safe: the pipelines' report threads call `save` at once (the encoding and writing run in
    parallel; the accounting and the removals under one lock)."""

    def __init__(self, root: Path, retention: SnapshotRetentionConfig) -> None:
        self.root = root
        self._retention = retention
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], Snapshot] = {}  # (pipeline, id) -> snapshot
        # A heap of (captured_at, id, pipeline); rows of snapshots removed out of turn are skipped.
        self._oldest: list[tuple[float, str, str]] = []
        self._latest: dict[tuple[str, str], str] = {}  # (pipeline, label) -> id
        self._per_label: dict[tuple[str, str], int] = {}  # (pipeline, label) -> snapshots kept
        self._bytes = 0
        self._removed = 0
        try:
            root.mkdir(parents=True, exist_ok=True)
            if not root.is_dir():
                raise NotADirectoryError(f"{root} is not a directory")
        except OSError as exc:
            raise SnapshotError(
                f"cannot use {root} as the snapshot directory: {exc.strerror or exc}",
                hint="it must be a directory the agent can write (it lives under the state dir)",
            ) from exc
        self._scan()
        with self._lock:
            self._enforce()

    # --- what is on disk already --------------------------------------------------------------------

    def _scan(self) -> None:
        """Learn the snapshots a previous run left; remove its temp files (writes it never finished)."""
        try:
            pipeline_dirs = [p for p in self.root.iterdir() if _PIPELINE_RE.fullmatch(p.name) and p.is_dir()]
        except OSError as exc:
            raise SnapshotError(f"cannot read the snapshot directory {self.root}: {exc.strerror}") from exc
        for directory in pipeline_dirs:
            files: dict[str, dict[str, Path]] = {}  # id -> {"main"|"crop": path}
            try:
                entries = list(directory.iterdir())
            except OSError as exc:
                raise SnapshotError(
                    f"cannot read the snapshot directory {directory}: {exc.strerror}"
                ) from exc
            for path in entries:
                name = path.name
                if _TEMP_MARK in name:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    continue
                kind = "crop" if name.endswith(_CROP_SUFFIX) else "main" if name.endswith(_SUFFIX) else None
                snapshot_id = name[: -len(_CROP_SUFFIX if kind == "crop" else _SUFFIX)] if kind else ""
                if kind and _ID_RE.fullmatch(snapshot_id):  # files not named like ours are not ours
                    files.setdefault(snapshot_id, {})[kind] = path
            for snapshot_id, parts in files.items():
                if "main" not in parts:  # its frame was removed behind our back: the crop alone is litter
                    with contextlib.suppress(FileNotFoundError):
                        parts["crop"].unlink()
                    continue
                self._add(self._recovered(directory.name, snapshot_id, parts))

    def _recovered(self, pipeline: str, snapshot_id: str, parts: dict[str, Path]) -> Snapshot:
        size, mtime = 0, 0.0
        for path in parts.values():
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                size += st.st_size
                mtime = max(mtime, st.st_mtime)
        # A file without our comment (cut short by a power cut) is still counted, and removed in its
        # turn: by its modification time, with no label.
        meta = _read_comment(parts["main"]) or {}
        captured_at = meta.get("captured_at")
        label = meta.get("label")
        attributes = meta.get("attributes")
        return Snapshot(
            id=snapshot_id,
            path=parts["main"],
            crop_path=parts.get("crop"),
            bytes=size,
            label=label if isinstance(label, str) else "",
            track_id=int(snapshot_id.rsplit("-", 1)[0]),
            pipeline=pipeline,
            captured_at=float(captured_at) if isinstance(captured_at, (int, float)) else mtime,
            attributes=attributes if isinstance(attributes, dict) else {},
        )

    # --- accounting (under the lock, or before the store is shared) ---------------------------------

    def _add(self, snapshot: Snapshot) -> None:
        key = (snapshot.pipeline, snapshot.id)
        self._kept[key] = snapshot
        self._bytes += snapshot.bytes
        heapq.heappush(self._oldest, (snapshot.captured_at, snapshot.id, snapshot.pipeline))
        if snapshot.label:
            label_key = (snapshot.pipeline, snapshot.label)
            self._per_label[label_key] = self._per_label.get(label_key, 0) + 1
            latest = self._kept.get((snapshot.pipeline, self._latest.get(label_key, "")))
            if latest is None or (latest.captured_at, latest.id) <= (snapshot.captured_at, snapshot.id):
                self._latest[label_key] = snapshot.id

    def _drop(self, snapshot: Snapshot) -> None:
        """Forget a snapshot and remove its files (a file already gone is fine)."""
        del self._kept[(snapshot.pipeline, snapshot.id)]
        self._bytes -= snapshot.bytes
        self._removed += 1
        for path in (snapshot.crop_path, snapshot.path):
            if path is None:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # counted as gone all the same: it cannot be removed again either
                log.warning("cannot remove snapshot file %s: %s", path, exc.strerror)
        if not snapshot.label:
            return
        key = (snapshot.pipeline, snapshot.label)
        self._per_label[key] -= 1
        if not self._per_label[key]:
            del self._per_label[key]
            self._latest.pop(key, None)
        elif self._latest.get(key) == snapshot.id:  # removed out of turn (`remove`): the oldest is no latest
            rest = (s for s in self._kept.values() if (s.pipeline, s.label) == key)
            self._latest[key] = max(rest, key=lambda s: (s.captured_at, s.id)).id
        if len(self._oldest) > 2 * len(self._kept) + 64:
            # Rows of snapshots removed out of turn would pile up while the bound is never reached.
            self._oldest = [(s.captured_at, s.id, s.pipeline) for s in self._kept.values()]
            heapq.heapify(self._oldest)

    def _enforce(self) -> None:
        """Remove the oldest snapshots until the retention holds."""
        limit = self._retention
        while self._kept and (len(self._kept) > limit.max_count or self._bytes > limit.max_bytes):
            captured_at, snapshot_id, pipeline = heapq.heappop(self._oldest)
            snapshot = self._kept.get((pipeline, snapshot_id))
            if snapshot is None or snapshot.captured_at != captured_at:
                continue  # a row for a snapshot removed some other way
            log.debug("removing snapshot %s/%s (retention)", pipeline, snapshot_id)
            self._drop(snapshot)

    # --- the API ----------------------------------------------------------------------------------

    def use(self, retention: SnapshotRetentionConfig) -> None:
        """A new retention (a reload): a smaller bound removes the oldest at once."""
        with self._lock:
            self._retention = retention
            self._enforce()

    def save(
        self,
        pipeline: str,
        track_id: int,
        label: str,
        frame_bgr: np.ndarray,
        box: list[float],
        *,
        quality: int,
        crop: bool,
        captured_at: float,
        attributes: Mapping[str, Any] | None = None,
    ) -> Snapshot:
        """Save object `track_id`'s snapshot from `frame_bgr` (BGR uint8): the frame with its `box`
        ([x1, y1, x2, y2] pixels) and caption drawn, JPEG at `quality`; with `crop`, also the box's
        region and a small margin (`crop_region`) undrawn (none when the box is wholly outside the
        frame). `attributes`: what second models had read on the object (name -> {value, score, at,
        runs}): in the caption and the JPEG's metadata. A JPEG larger than the retention's max_bytes
        is scaled down to fit. Then the oldest
        snapshots go until the retention holds (this one too, when it is the oldest of all).

        Raises ValueError on a bad argument, and SnapshotError when the files cannot be written
        (naming the path: disk full, permissions, a file where the pipeline's directory should be) or
        the picture cannot fit max_bytes.
        Nothing of a failed save stays on disk or in the accounting. The caller (the pipeline) logs
        the error and goes on: a missing picture never stops detection."""
        if not _PIPELINE_RE.fullmatch(pipeline):
            raise ValueError(f"{pipeline!r} is not a pipeline name: it cannot name a snapshot directory")
        try:
            corners = [float(v) for v in box]
        except (TypeError, ValueError):
            corners = []
        if len(corners) != 4 or not all(math.isfinite(v) for v in corners):
            raise ValueError(f"snapshot box {box!r} is not [x1, y1, x2, y2] in pixels")
        if not isinstance(frame_bgr, np.ndarray) or frame_bgr.ndim != 3 or frame_bgr.shape[2] != 3:
            raise ValueError(
                "a snapshot needs a BGR frame (height x width x 3), not "
                f"{getattr(frame_bgr, 'shape', type(frame_bgr).__name__)!r}"
            )
        if not math.isfinite(captured_at):
            raise ValueError(f"snapshot capture time {captured_at!r} is not a time")
        track_id = int(track_id)
        snapshot_id = f"{track_id}-{uuid.uuid4().hex[:10]}"
        read = {str(name): value for name, value in (attributes or {}).items()}
        about: dict[str, Any] = {"pipeline": pipeline, "label": label, "track_id": track_id}
        about["captured_at"] = captured_at
        meta = json.dumps({**about, "attributes": read}, ensure_ascii=True, default=str).encode()
        if not read or len(meta) > _MAX_META_BYTES:  # (a long embedding: in the caption alone)
            kept: dict[str, Any] = {}
            meta = json.dumps(about, ensure_ascii=True).encode()
        else:
            kept = read
        entry = {"box": corners, "label": label, "track_id": track_id, "attributes": read}
        budget = self._retention.max_bytes
        # Bolder than the live image's box: a snapshot is mostly seen as a thumbnail, and JPEG's
        # halved colour resolution washes a thin coloured line out.
        thickness = max(3, round(max(frame_bgr.shape[:2]) / 200))
        pictured = draw_boxes(frame_bgr, [entry], thickness=thickness)
        drawn = encode_jpeg(pictured, quality, budget // 2 if crop else budget)
        if drawn is None:
            raise SnapshotError(
                f"a snapshot of a {frame_bgr.shape[1]}x{frame_bgr.shape[0]} frame does not fit the "
                f"snapshots' max_bytes ({budget}) even at a quarter of its size"
            )
        images = {"main": _with_comment(drawn, meta)}
        if crop:
            region = crop_region(corners, frame_bgr.shape[1], frame_bgr.shape[0])
            if region is not None:
                x1, y1, x2, y2 = region
                cropped = encode_jpeg(
                    np.ascontiguousarray(frame_bgr[y1:y2, x1:x2]), quality, budget - len(drawn)
                )
                if cropped is not None:  # too big for what the frame left: the frame alone
                    images["crop"] = _with_comment(cropped, meta)
        directory = self.root / pipeline
        paths = {
            "main": directory / f"{snapshot_id}{_SUFFIX}",
            "crop": directory / f"{snapshot_id}{_CROP_SUFFIX}",
        }
        written: list[Path] = []
        try:
            try:
                directory.mkdir(exist_ok=True)
            except OSError as exc:
                raise SnapshotError(
                    f"cannot create the snapshot directory {directory}: {exc.strerror or exc}"
                ) from exc
            for kind, data in images.items():
                try:
                    # Not fsynced: snapshots come often and flash wears; a power cut may lose the
                    # newest (a cut-short file is counted and removed in its turn), never half-write.
                    atomic_write_bytes(paths[kind], data, durable=False)
                except OSError as exc:
                    raise SnapshotError(
                        f"cannot write snapshot {paths[kind]}: {exc.strerror or exc}"
                    ) from exc
                written.append(paths[kind])
        except SnapshotError:
            for path in written:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        snapshot = Snapshot(
            id=snapshot_id,
            path=paths["main"],
            crop_path=paths["crop"] if "crop" in images else None,
            bytes=sum(len(data) for data in images.values()),
            label=label,
            track_id=track_id,
            pipeline=pipeline,
            captured_at=captured_at,
            attributes=kept,
        )
        with self._lock:
            self._add(snapshot)
            self._enforce()
        return snapshot

    def remove(self, pipeline: str, snapshot_id: str) -> bool:
        """Remove a snapshot now (e.g. one a better picture replaced); False when it is not kept."""
        with self._lock:
            snapshot = self._kept.get((pipeline, snapshot_id))
            if snapshot is None:
                return False
            self._drop(snapshot)
            return True

    def get(self, pipeline: str, snapshot_id: str) -> Snapshot | None:
        with self._lock:
            return self._kept.get((pipeline, snapshot_id))

    def path_of(self, snapshot_id: str, pipeline: str) -> Path | None:
        """The JPEG of a kept snapshot (the frame with its box); None when it is not kept. Any string
        may be asked for (an id from a request): only kept snapshots' paths come back."""
        with self._lock:
            snapshot = self._kept.get((pipeline, snapshot_id))
        return snapshot.path if snapshot is not None else None

    def latest(self, pipeline: str, label: str) -> bytes | None:
        """The JPEG bytes of the newest kept snapshot of a `label` object in `pipeline` (for its
        retained image topic); None when there is none. Raises SnapshotError when it cannot be read."""
        for _ in range(8):  # a concurrent save may remove the file between the lookup and the read
            with self._lock:
                snapshot_id = self._latest.get((pipeline, label))
                snapshot = self._kept.get((pipeline, snapshot_id)) if snapshot_id is not None else None
            if snapshot is None:
                return None
            try:
                return snapshot.path.read_bytes()
            except FileNotFoundError:
                with self._lock:
                    if self._kept.get((pipeline, snapshot.id)) is snapshot:
                        self._drop(snapshot)  # removed behind the store's back: forget it
            except OSError as exc:
                raise SnapshotError(f"cannot read snapshot {snapshot.path}: {exc.strerror or exc}") from exc
        return None

    def stats(self) -> dict[str, int]:
        """{"count": snapshots kept, "bytes": their files' bytes, "removed": removed since the start
        (by the retention or `remove`)}."""
        with self._lock:
            return {"count": len(self._kept), "bytes": self._bytes, "removed": self._removed}
