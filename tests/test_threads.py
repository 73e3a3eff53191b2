"""The daemon's threads carry their names for the operating system too (agent/threads.py): `top -H`
and /proc show `source-cam` and `pipeline-cam-...`, and threads they start (FFmpeg's decoders) carry
their name, which is how scripts/bench_capacity.py tells decoding's CPU from the pipeline's."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np

from agent.config import VideoSourceConfig
from agent.sources import open_source
from agent.threads import OS_NAME_BYTES, named_thread
from tests.waits import wait_until


def _os_names() -> list[str]:
    return [p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")]


def test_a_named_thread_and_the_threads_it_starts_carry_its_name_for_the_system() -> None:
    seen: dict[str, str] = {}

    def child() -> None:
        seen["child"] = Path("/proc/thread-self/comm").read_text().strip()

    def parent() -> None:
        seen["parent"] = Path("/proc/thread-self/comm").read_text().strip()
        inner = threading.Thread(target=child)  # a plain thread, as a native library's would be
        inner.start()
        inner.join(10)

    thread = named_thread(parent, "pipeline-front-door-prepare")
    thread.start()
    thread.join(10)
    cut = "pipeline-front-door-prepare"[:OS_NAME_BYTES]
    assert seen == {"parent": cut, "child": cut}
    assert thread.name == "pipeline-front-door-prepare" and thread.daemon


def test_a_video_sources_reader_is_named_after_its_pipeline(tmp_path: Path) -> None:
    clip = tmp_path / "tiny.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(10):
        writer.write(np.full((48, 64, 3), 20 * i, np.uint8))
    writer.release()
    source, slot = open_source(VideoSourceConfig(type="video", uri=str(clip), loop=True), "door")
    source.start()
    try:
        wait_until(lambda: slot.get(timeout=0.5) is not None, "a frame from the clip", timeout=30)
        assert "source-door" in _os_names()
    finally:
        source.stop()
