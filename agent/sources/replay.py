"""Recorded sensor data replayed from CSV or JSON Lines files, at the recorded pace (a time column),
at a fixed rate, or as fast as the model takes it, cut into windows like live sensor values.

A replay never drops values: when the model falls behind, reading waits for room in the queue.
A row that has no number where one is expected is counted and named (file:line), never fatal.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path
from typing import Any

from agent.config import ReplaySourceConfig
from agent.retry import backoff_delay
from agent.sources.base import ThreadedSource
from agent.sources.frames import FrameQueue, Windower
from agent.sources.sensors import parse_values
from agent.status import ReplayCounters

log = logging.getLogger(__name__)


def read_rows(
    path: Path, field: str | None, time_field: str | None
) -> list[tuple[int, list[float] | str, float | None]]:
    """(line number, values or what is wrong, time) for every data row of a .csv or .jsonl file.

    OSError when the file cannot be read; a row's own problems are returned, not raised.
    """
    rows: list[tuple[int, list[float] | str, float | None]] = []
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            if field is not None and field not in columns:
                raise OSError(f"{path}: no column {field!r} (columns: {', '.join(columns)})")
            for row in reader:
                line = reader.line_num
                try:
                    wanted = row[field] if field is not None else next(v for v in row.values() if _number(v))
                    values = [float(wanted)]
                    when = float(row[time_field]) if time_field is not None else None
                except (StopIteration, TypeError, ValueError, KeyError):
                    rows.append((line, f"no number in column {field or '(any)'}", None))
                    continue
                rows.append((line, values, when))
            return rows
        for line, text in enumerate(f, start=1):  # JSON Lines
            if not text.strip():
                continue
            try:
                values = parse_values(text.encode(), field)
                when = _time_of(text, time_field)
            except ValueError as exc:
                rows.append((line, str(exc), None))
                continue
            rows.append((line, values, when))
    return rows


def _number(text: str | None) -> bool:
    try:
        float(text or "")
    except ValueError:
        return False
    return True


def _time_of(text: str, time_field: str | None) -> float | None:
    if time_field is None:
        return None
    value: Any = json.loads(text)
    for key in time_field.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"no time field {time_field!r}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"time field {time_field!r} is not a number")
    return float(value)


class ReplaySource(ThreadedSource):
    kind = "replay"

    def __init__(self, config: ReplaySourceConfig, name: str, queue: FrameQueue) -> None:
        super().__init__(name, queue, config.uri)
        self.config = config
        self._windows = Windower(queue, config.window, config.hop or config.window)
        self.rows = 0
        self.bad_rows = 0
        self.last_bad_row: str | None = None

    def _counters(self) -> ReplayCounters:
        return ReplayCounters(self.rows, self.bad_rows, self.last_bad_row, self._windows.index)

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                path = Path(self.config.uri)
                try:
                    rows = read_rows(path, self.config.field, self.config.time_field)
                except OSError as exc:
                    failures += 1
                    self._count_reconnect()
                    self._fail(str(exc) if str(path) in str(exc) else f"cannot read {path}: {exc}")
                    self._stop.wait(
                        backoff_delay(failures, self.config.reopen_min_s, self.config.reopen_max_s)
                    )
                    continue
                self._set_state("streaming")
                failures = 0
                self._windows.restart()
                self._play(rows, path)
                if self._stop.is_set():
                    return
                if not self.config.loop:
                    self._set_state("finished")
                    return
        finally:
            if self.state != "finished":
                self._set_state("stopped", self.error)
            self.slot.close()

    def _play(self, rows: list[tuple[int, list[float] | str, float | None]], path: Path) -> None:
        started = time.monotonic()
        first_time = next((t for _, v, t in rows if isinstance(v, list) and t is not None), None)
        for number, (line, values, when) in enumerate(rows):
            if isinstance(values, str):
                with self._lock:
                    self.bad_rows += 1
                    self.last_bad_row = f"{path.name}:{line}: {values}"
                continue
            if when is not None and first_time is not None:
                due = started + (when - first_time)  # the recorded pace
            elif self.config.rate:
                due = started + number / self.config.rate
            else:
                due = 0.0
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            # A replay can wait: never overflow the queue (a live sensor cannot, and drops instead).
            while len(self.slot) >= self.config.max_queue and not self._stop.wait(0.01):
                pass
            position = (when - first_time) if when is not None and first_time is not None else None
            self._windows.add(values, time.time(), position)
            with self._lock:
                self.rows += 1
