"""agent/snapshots.py with real photos and a real directory: a snapshot shows the object with its box
(and its crop is the object's region), the retention bound holds by count and by bytes with the
oldest removed first, across a restart and under concurrent saves, and write failures are clear."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.config.analytics import SnapshotRetentionConfig
from agent.processing.drawing import track_colour
from agent.snapshots import Snapshot, SnapshotError, SnapshotStore, crop_region
from tests.media_fixtures import astronaut_bgr

FACE = [173.0, 82.0, 274.0, 180.0]  # the astronaut's face in the 512x512 photo
MIB = 1024 * 1024


def decode(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG OpenCV can read"
    return image


def retention(**values: int) -> SnapshotRetentionConfig:
    return SnapshotRetentionConfig.model_validate(values)


def on_disk(root: Path) -> dict[str, int]:
    """Every file under root (relative path -> size)."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def kept_ids(root: Path, pipeline: str = "yard") -> set[str]:
    return {p.name.removesuffix(".jpg") for p in (root / pipeline).glob("*.jpg") if ".crop." not in p.name}


def save_face(store: SnapshotStore, track_id: int, at: float, *, label: str = "person", crop: bool = False,
              pipeline: str = "yard", quality: int = 80) -> Snapshot:  # fmt: skip
    return store.save(
        pipeline, track_id, label, astronaut_bgr(), FACE, quality=quality, crop=crop, captured_at=at
    )


def test_a_snapshot_shows_the_object_with_its_box(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, retention())
    photo = astronaut_bgr()
    snap = store.save("yard", 7, "person", photo, FACE, quality=95, crop=True, captured_at=1_700_000_000.5)
    assert re.fullmatch(r"7-[0-9a-f]{10}", snap.id)
    assert (
        snap.path == root / "yard" / f"{snap.id}.jpg"
        and snap.crop_path == root / "yard" / f"{snap.id}.crop.jpg"
    )
    assert (snap.label, snap.track_id, snap.pipeline, snap.captured_at) == (
        "person",
        7,
        "yard",
        1_700_000_000.5,
    )
    assert snap.bytes == snap.path.stat().st_size + snap.crop_path.stat().st_size
    assert on_disk(root) == {f"yard/{snap.id}.jpg": snap.path.stat().st_size,
                             f"yard/{snap.id}.crop.jpg": snap.crop_path.stat().st_size}  # fmt: skip

    image = decode(snap.path.read_bytes())
    assert image.shape == photo.shape
    colour = np.array(track_colour(7), int)
    x1, y1, x2, y2 = (round(v) for v in FACE)
    # Along the outline: the track's colour, not the photo.
    outline = np.concatenate([image[y2, x1:x2], image[y1:y2, x1], image[y1:y2, x2]]).astype(int)
    original = np.concatenate([photo[y2, x1:x2], photo[y1:y2, x1], photo[y1:y2, x2]]).astype(int)
    assert np.abs(outline - colour).sum(axis=1).mean() < 60
    assert np.abs(outline - original).sum(axis=1).mean() > 150
    # Inside the box and far from it: the photo (JPEG aside).
    inside = np.abs(
        image[y1 + 4 : y2 - 3, x1 + 4 : x2 - 3].astype(int) - photo[y1 + 4 : y2 - 3, x1 + 4 : x2 - 3]
    )
    assert inside.mean() < 6
    assert np.abs(image[300:, :].astype(int) - photo[300:, :]).mean() < 6

    # The crop: the box's region and a small margin, not drawn on.
    region = crop_region(FACE, 512, 512)
    assert region is not None
    cx1, cy1, cx2, cy2 = region
    assert cx1 < x1 and cy1 < y1 and cx2 > x2 and cy2 > y2 and cx2 - cx1 < (x2 - x1) * 1.2
    cropped = decode(snap.crop_path.read_bytes())
    assert cropped.shape == (cy2 - cy1, cx2 - cx1, 3)
    assert np.abs(cropped.astype(int) - photo[cy1:cy2, cx1:cx2]).mean() < 6

    # The latest picture of a person in this pipeline, for the retained image topic.
    assert store.latest("yard", "person") == snap.path.read_bytes()
    assert store.latest("yard", "car") is None and store.latest("gate", "person") is None
    assert store.path_of(snap.id, "yard") == snap.path
    assert store.path_of(snap.id, "gate") is None and store.path_of("../../etc/passwd", "yard") is None
    assert store.stats() == {"count": 1, "bytes": snap.bytes, "removed": 0}


def test_the_crop_is_clamped_to_the_frame() -> None:
    assert crop_region([480.0, 490.0, 530.0, 540.0], 512, 512) == (477, 487, 512, 512)
    assert crop_region([600.0, 600.0, 700.0, 700.0], 512, 512) is None


def test_the_count_bound_removes_the_oldest_by_capture_time(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, retention(max_count=3))
    snaps = [save_face(store, i, at=100.0 + i, crop=i % 2 == 0) for i in range(3)]
    assert kept_ids(root) == {s.id for s in snaps}
    newest = save_face(store, 3, at=103.0)
    assert kept_ids(root) == {snaps[1].id, snaps[2].id, newest.id}  # the oldest (and only it) went
    assert not snaps[0].path.exists() and snaps[0].crop_path is not None and not snaps[0].crop_path.exists()
    # By capture time, not by when it was saved: a late picture of an older frame is the oldest.
    late = save_face(store, 4, at=50.0)
    assert kept_ids(root) == {snaps[1].id, snaps[2].id, newest.id} and not late.path.exists()
    stats = store.stats()
    assert stats["count"] == 3 and stats["removed"] == 2
    assert stats["bytes"] == sum(on_disk(root).values())
    # A smaller bound on reload removes the oldest at once.
    store.use(retention(max_count=1))
    assert kept_ids(root) == {newest.id}
    assert store.stats() == {"count": 1, "bytes": sum(on_disk(root).values()), "removed": 4}


def test_the_bytes_bound_removes_the_oldest_counting_a_crop_with_its_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, retention(max_count=1000, max_bytes=MIB))
    snaps: list[Snapshot] = []
    for i in range(20):
        snaps.append(save_face(store, i, at=1000.0 + i, crop=True, quality=95))
        files = on_disk(root)
        assert sum(files.values()) <= MIB and store.stats()["bytes"] == sum(files.values())
    kept = kept_ids(root)
    count = len(kept)
    assert 3 <= count < 20  # the bytes bound, not the count, did it (each is ~100 KiB)
    # The newest ones stayed, the oldest went, each with its crop; no more than needed were removed.
    assert kept == {s.id for s in snaps[-count:]}
    assert all(not s.path.exists() and s.crop_path and not s.crop_path.exists() for s in snaps[:-count])
    assert sum(s.bytes for s in snaps[-count - 1 :]) > MIB
    assert store.stats() == {"count": count, "bytes": sum(on_disk(root).values()), "removed": 20 - count}


def test_a_restart_keeps_the_bound_and_knows_its_files_again(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    first = SnapshotStore(root, retention(max_count=10))
    people = [save_face(first, i, at=200.0 + i, crop=i == 5) for i in range(6)]
    car = save_face(first, 9, at=150.0, label="car", pipeline="gate")
    # What a crash leaves: a temp file of a write it never finished. And a file that is not ours.
    (root / "yard" / f"{people[0].id}.jpg.tmp-1-2-abcd").write_bytes(b"half")
    (root / "yard" / "notes.txt").write_text("mine")

    again = SnapshotStore(root, retention(max_count=4))
    # The bound holds at once: the oldest (the car, then the first two people) went.
    assert kept_ids(root) == {s.id for s in people[2:]} and kept_ids(root, "gate") == set()
    assert not car.path.exists()
    assert not list(root.rglob("*.tmp-*")) and (root / "yard" / "notes.txt").read_text() == "mine"
    jpeg_bytes = sum(size for name, size in on_disk(root).items() if name.endswith(".jpg"))
    assert again.stats() == {"count": 4, "bytes": jpeg_bytes, "removed": 3}
    # It knows labels, capture times and crops again: the latest person is the newest one.
    assert again.latest("yard", "person") == people[5].path.read_bytes()
    assert again.path_of(people[5].id, "yard") == people[5].path
    assert again.get("yard", people[5].id) == people[5]
    # New snapshots push out the old run's oldest first.
    newer = [save_face(again, 20 + i, at=300.0 + i) for i in range(2)]
    assert kept_ids(root) == {people[4].id, people[5].id} | {s.id for s in newer}
    assert again.latest("yard", "person") == newer[1].path.read_bytes()


def test_a_restart_counts_a_cut_short_file_and_removes_a_lone_crop(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    first = SnapshotStore(root, retention(max_count=3))
    kept = [save_face(first, i, at=1_000.0 + i, crop=True) for i in range(2)]
    # A power cut: a file cut short (no metadata), and a crop whose frame went behind our back.
    cut = root / "yard" / "5-0123456789.jpg"
    cut.write_bytes(kept[0].path.read_bytes()[:40])
    os.utime(cut, (500.0, 500.0))
    kept[1].path.unlink()

    again = SnapshotStore(root, retention(max_count=3))
    assert kept[1].crop_path is not None and not kept[1].crop_path.exists()
    assert again.stats() == {"count": 2, "bytes": kept[0].bytes + 40, "removed": 0}
    assert again.latest("yard", "person") == kept[0].path.read_bytes()  # the cut file has no label
    # It is the oldest by its modification time: the first to go.
    newer = [save_face(again, 10 + i, at=2_000.0 + i) for i in range(2)]
    assert kept_ids(root) == {kept[0].id} | {s.id for s in newer} and not cut.exists()


def test_concurrent_saves_keep_the_bound_and_the_accounting(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, retention(max_count=10))
    photo = cv2.resize(astronaut_bgr(), (128, 128), interpolation=cv2.INTER_AREA)
    threads, per_thread = 4, 15
    start = threading.Barrier(threads)
    saved: list[Snapshot] = []
    errors: list[BaseException] = []
    saved_lock = threading.Lock()

    def work(n: int) -> None:
        try:
            start.wait(timeout=30)
            for j in range(per_thread):
                at = float(j * threads + n)  # every capture time different, the threads interleaved
                snap = store.save(f"cam{n % 2}", j, "person", photo, [20.0, 20.0, 90.0, 100.0], quality=80,
                                  crop=j % 3 == 0, captured_at=at)  # fmt: skip
                with saved_lock:
                    saved.append(snap)
                assert store.stats()["count"] <= 10
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers) and not errors, errors
    assert len(saved) == threads * per_thread
    # The ten newest by capture time are kept, with their crops; the accounting matches the disk.
    newest = sorted(saved, key=lambda s: s.captured_at)[-10:]
    expected = {f"{s.pipeline}/{s.id}.jpg" for s in newest}
    expected |= {f"{s.pipeline}/{s.id}.crop.jpg" for s in newest if s.crop_path}
    files = on_disk(root)
    assert set(files) == expected
    assert store.stats() == {"count": 10, "bytes": sum(files.values()), "removed": threads * per_thread - 10}
    assert (
        store.latest("cam1", "person")
        == max((s for s in saved if s.pipeline == "cam1"), key=lambda s: s.captured_at).path.read_bytes()
    )


def test_removing_a_snapshot_falls_back_to_the_previous_latest(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", retention())
    older, newer = save_face(store, 1, at=10.0, crop=True), save_face(store, 2, at=20.0)
    assert store.latest("yard", "person") == newer.path.read_bytes()
    assert store.remove("yard", newer.id) and not store.remove("yard", newer.id)
    assert not newer.path.exists() and store.latest("yard", "person") == older.path.read_bytes()
    assert store.remove("yard", older.id) and store.latest("yard", "person") is None
    assert store.stats() == {"count": 0, "bytes": 0, "removed": 2}
    assert on_disk(tmp_path / "snapshots") == {}


def test_a_bad_root_or_a_failed_write_is_a_clear_error(tmp_path: Path) -> None:
    blocked = tmp_path / "state" / "snapshots"
    blocked.parent.mkdir()
    blocked.write_text("not a directory")
    with pytest.raises(SnapshotError, match=re.escape(f"cannot use {blocked} as the snapshot directory")):
        SnapshotStore(blocked, retention())
    with pytest.raises(SnapshotError, match=re.escape(str(blocked))):
        SnapshotStore(blocked / "below", retention())

    # A file where a pipeline's directory should be: that save fails, naming it, and leaves nothing.
    root = tmp_path / "snapshots"
    store = SnapshotStore(root, retention())
    kept = save_face(store, 1, at=1.0, pipeline="yard")
    (root / "gate").write_text("in the way")
    with pytest.raises(SnapshotError, match=re.escape(str(root / "gate"))) as caught:
        save_face(store, 2, at=2.0, pipeline="gate", crop=True)
    assert isinstance(caught.value.__cause__, OSError)
    assert store.stats() == {"count": 1, "bytes": kept.bytes, "removed": 0}
    assert set(on_disk(root)) == {"gate", f"yard/{kept.id}.jpg"}
    # Bad arguments are the caller's mistake, said as such.
    with pytest.raises(ValueError, match="not a pipeline name"):
        save_face(store, 3, at=3.0, pipeline="../up")
    with pytest.raises(ValueError, match="not \\[x1, y1, x2, y2\\]"):
        store.save(
            "yard", 3, "person", astronaut_bgr(), [1.0, 2.0, 3.0], quality=80, crop=False, captured_at=3.0
        )
