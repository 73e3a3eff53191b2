"""What the soak scripts share: sampling a daemon's resources, the growth fitted to the samples, and
writing a script's own section of docs/soak.md (between `<!-- name -->` and `<!-- /name -->`),
leaving the other scripts' sections as they are. Pure functions besides `sample_process` and
`write_section`; tested in tests/test_soak_report.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

SAMPLE_S = 10.0


def sample_process(proc: psutil.Process, started: float) -> dict[str, Any]:
    """One sample of the daemon: seconds since `started` (monotonic), RSS MB, fds, threads, children."""
    with proc.oneshot():
        return {
            "t_s": round(time.monotonic() - started, 1),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
            "fds": proc.num_fds(),
            "threads": proc.num_threads(),
            "children": len(proc.children(recursive=True)),
        }


def growth_per_hour(rows: list[dict[str, Any]], key: str) -> float:
    """The least-squares slope of `key` per hour over the second half of the samples (after warm-up)."""
    half = [r for r in rows[len(rows) // 2 :] if key in r]
    if len(half) < 3:
        return float("nan")
    t = np.array([r["t_s"] for r in half]) / 3600.0
    y = np.array([r[key] for r in half], dtype=float)
    return float(np.polyfit(t, y, 1)[0])


def value_range(rows: list[dict[str, Any]], key: str) -> str:
    values = [row[key] for row in rows if key in row]
    return f"{min(values)} to {max(values)}" if values else "-"


def section_markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def replace_section(document: str, name: str, body: str) -> str:
    """`document` with the section `name` replaced by `body` (appended when it has none yet)."""
    start, end = section_markers(name)
    section = f"{start}\n{body.rstrip()}\n{end}\n"
    head, found, rest = document.partition(start + "\n")
    if found:
        _, closed, tail = rest.partition(end)
        if not closed:
            raise ValueError(f"{start} has no {end}")
        return head + section + tail.removeprefix("\n")
    return document.rstrip() + ("\n\n" if document.strip() else "") + section


def write_section(path: Path, name: str, body: str) -> None:
    document = path.read_text() if path.exists() else ""
    path.write_text(replace_section(document, name, body))
