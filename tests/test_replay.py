"""Recorded sensor data replayed from CSV and JSON Lines files: at the recorded pace, without losing a
value when the model is slow, bad rows counted and named by file and line, a missing file retried."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.config import ReplaySourceConfig
from agent.config_loader import parse_config
from agent.errors import ConfigError
from agent.sources import Frame, FrameQueue, ReplaySource
from tests.waits import wait_until


def _replay(path: Path, sources: list[ReplaySource], **settings: Any) -> tuple[ReplaySource, FrameQueue]:
    config = ReplaySourceConfig.model_validate({"type": "replay", "uri": str(path), **settings})
    queue = FrameQueue(config.max_queue)
    source = ReplaySource(config, "replay", queue)
    sources.append(source)
    source.start()
    return source, queue


def _drain(queue: FrameQueue, timeout: float, delay: float = 0.0) -> list[Frame]:
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = queue.get(timeout=0.1)
        if frame is None:
            if queue.closed:
                break
            continue
        frames.append(frame)
        time.sleep(delay)
    return frames


def test_csv_replays_a_column_at_the_recorded_pace(tmp_path: Path, sources: list[ReplaySource]) -> None:
    path = tmp_path / "climate.csv"
    rows = ["time,temp,humidity"] + [f"{100 + i * 0.05:.2f},{20 + i * 0.1:.1f},{40 + i}" for i in range(20)]
    path.write_text("\n".join(rows) + "\n")
    started = time.monotonic()
    source, queue = _replay(path, sources, field="temp", time_field="time", window=5)
    frames = _drain(queue, timeout=60)
    took = time.monotonic() - started
    # The 20 rows span 0.95 s of recorded time: never faster; the upper bound only catches a pace
    # wildly off (10x and more), generous for a busy machine.
    assert 0.9 <= took < 15, took
    assert len(frames) == 4 and source.state == "finished"
    assert np.allclose(np.concatenate([f.data for f in frames]), [20 + i * 0.1 for i in range(20)])
    # Each window's position: the recorded time of the row that completed it.
    assert [f.position_s for f in frames] == pytest.approx([0.2, 0.45, 0.7, 0.95])
    assert source.stats().counters.rows == 20 and source.stats().counters.bad_rows == 0


def test_jsonl_with_bad_lines_loses_no_good_value_to_a_slow_model(
    tmp_path: Path, sources: list[ReplaySource]
) -> None:
    path = tmp_path / "vibration.jsonl"
    lines = []
    for i in range(60):
        lines.append(json.dumps({"sensor": {"rms": i}}))
        if i == 10:
            lines.append("{not json")
        if i == 20:
            lines.append(json.dumps({"sensor": {"peak": 3}}))
    path.write_text("\n".join(lines) + "\n\n")
    # A queue of 2 windows and a consumer slower than the file: the replay waits, drops nothing.
    source, queue = _replay(path, sources, field="sensor.rms", window=10, hop=5, max_queue=2)
    frames = _drain(queue, timeout=60, delay=0.05)
    assert queue.dropped == 0 and len(frames) == (60 - 10) // 5 + 1
    assert [float(f.data[0]) for f in frames] == [float(i) for i in range(0, 55, 5)]
    stats = source.stats()
    assert stats.counters.bad_rows == 2 and stats.counters.rows == 60
    assert stats.counters.last_bad_row == "vibration.jsonl:23: no field 'sensor.rms' (missing 'rms')"


def test_a_missing_file_or_column_is_retried_with_a_clear_error(
    tmp_path: Path, sources: list[ReplaySource]
) -> None:
    path = tmp_path / "later.csv"
    source, queue = _replay(path, sources, field="temp", reopen_min_s=0.05, reopen_max_s=0.1)
    assert wait_until(lambda: source.stats().reconnects >= 2, timeout=30)
    assert source.state == "retrying" and "later.csv" in str(source.stats().error)
    path.write_text("time,pressure\n1,1013\n")
    no_column = "no column 'temp' (columns: time, pressure)"
    assert wait_until(lambda: no_column in str(source.stats().error), timeout=30)
    path.write_text("time,temp\n1,21.5\n2,22.0\n")
    assert wait_until(lambda: source.state == "finished", timeout=30), source.stats()
    assert [float(f.data[0]) for f in _drain(queue, timeout=30)] == [21.5, 22.0]
    assert source.stats().outages == 1


def test_replay_pipelines_need_series_preprocessing() -> None:
    text = (
        "device: {id: a}\nregistry: {url: 'file:///r'}\npipelines:\n  - name: p\n"
        "    model: {name: m, version: '1'}\n    source: {type: replay, uri: data.csv, window: 0}\n"
        "    preprocess: {type: series}\n    postprocess: {type: threshold}\n"
    )
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.source\.window: Input should be greater than"):
        parse_config(text, environ={})
    good = parse_config(text.replace("window: 0", "window: 8, rate: 50"), environ={})
    assert good.pipelines[0].source == ReplaySourceConfig(type="replay", uri="data.csv", window=8, rate=50)
