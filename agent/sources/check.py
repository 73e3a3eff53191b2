"""Try a source for a few seconds, as `edge-agent source` does: is the camera URL right, does the
GStreamer pipeline start, does the microphone deliver, at what rate and size?"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agent.config import AudioSourceConfig, SourceConfig, VideoSourceConfig
from agent.sources import VideoSource, open_source
from agent.status import SourceStatus

# After `seconds`, how long a source that is still opening may take to say why it gave nothing.
DIAGNOSIS_GRACE_S = 2.0


def source_config_for(uri: str) -> SourceConfig:
    """A source config for a bare URI: audio for alsa:DEVICE and .wav files, else video."""
    if uri.startswith("alsa:") or uri.lower().endswith(".wav"):
        return AudioSourceConfig(type="audio", uri=uri)
    return VideoSourceConfig(type="video", uri=uri)


@dataclass(frozen=True)
class SourceCheck:
    """What a check of a source saw: `ok` when at least one frame (window, reading) arrived."""

    ok: bool
    kind: str
    seconds: float
    received: int  # frames (windows, readings) handed on
    per_second: float | None
    first_after_s: float | None
    shape: list[int] | None
    dtype: str | None
    stats: SourceStatus  # as it stood at the end of the check (streaming, retrying, ...)
    sample: Any = field(default=None, repr=False, compare=False)  # the first frame's data (source --save)

    def to_json(self) -> dict[str, Any]:
        """`edge-agent source --json`."""
        return {
            "ok": self.ok,
            "uri": self.stats.uri,
            "kind": self.kind,
            "seconds": self.seconds,
            "received": self.received,
            "per_second": self.per_second,
            "first_after_s": self.first_after_s,
            "shape": self.shape,
            "dtype": self.dtype,
            "stats": self.stats.to_json(),
        }


def check_source(config: SourceConfig, seconds: float = 3.0, until_first: bool = False) -> SourceCheck:
    """Run the source for `seconds` (a file that ends sooner ends the check) and report what came;
    `until_first`: stop at the first frame (`edge-agent doctor` asks only whether one comes).

    `ok` is true when at least one frame (window, reading) arrived. A camera that gave none says why
    (stats.error) within `seconds` and a short grace, as the daemon does in its status: the network
    timeouts are fitted into `seconds` (VideoSource.fit_within).
    """
    source, slot = open_source(config, "check")
    if isinstance(source, VideoSource):
        source.fit_within(seconds)
    started = time.monotonic()
    first_at: float | None = None
    received = 0
    sample: Any = None
    source.start()
    try:
        deadline = started + seconds
        while time.monotonic() < deadline:
            frame = slot.get(timeout=min(0.2, max(0.01, deadline - time.monotonic())))
            if frame is not None:
                received += 1
                if first_at is None:
                    first_at, sample = time.monotonic() - started, frame.data
                if until_first:
                    break
            elif source.state in ("finished", "stopped") and len(slot) == 0:
                break
        # Nothing came and the camera has not said why yet (its open or diagnosis is just ending).
        late = deadline + DIAGNOSIS_GRACE_S
        while received == 0 and isinstance(source, VideoSource) and source.state == "starting":
            if time.monotonic() >= late:
                break
            slot.peek(timeout=0.05)  # wakes on a frame, which comes after the state changed
        elapsed = time.monotonic() - started
        stats = source.stats()  # as it stood at the end of the check (streaming, retrying, ...)
    finally:
        source.stop(timeout=5)
    return SourceCheck(
        ok=received > 0,
        kind=source.kind,
        seconds=round(elapsed, 2),
        received=received,
        per_second=round(received / elapsed, 2) if elapsed > 0 else None,
        first_after_s=None if first_at is None else round(first_at, 3),
        shape=None if sample is None else list(sample.shape),
        dtype=None if sample is None else str(sample.dtype),
        stats=stats,
        sample=sample,
    )
