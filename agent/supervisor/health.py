"""The health window's verdict on a new stage: error rate, NaN outputs, too few frames, latency."""

from __future__ import annotations

from agent.config import HealthWindowConfig
from agent.stage import Stage

_MIN_INFERENCES_FOR_LATENCY = 5  # the health window judges latency on at least this many frames


def unhealthy(
    stage: Stage, health: HealthWindowConfig, latency_before_ms: float | None, final: bool
) -> str | None:
    """Why the stage fails its health window so far (None: fine). Error rate and NaN are judged as
    frames come; too few frames and latency only at the window's end."""
    stats = stage.stats
    if (
        stats.frames
        and stats.errors / stats.frames > health.max_error_rate
        and stats.frames >= health.min_frames
    ):
        return (
            f"{stats.errors} of {stats.frames} frames failed (over max_error_rate {health.max_error_rate:g})"
            + (f"; last: {stats.last_error}" if stats.last_error else "")
        )
    if health.nan_is_failure and stats.nan_outputs:
        return f"{stats.nan_outputs} of {stats.inferences} inferences gave NaN or infinite outputs"
    if not final:
        return None
    if stats.frames < health.min_frames:
        return f"only {stats.frames} frame(s) in {health.window_s:g} s (min_frames {health.min_frames})"
    if stats.inferences < _MIN_INFERENCES_FOR_LATENCY:
        return None  # too few to tell a slower model from a busy moment
    median = stats.median_latency_ms()
    if median is not None and health.max_latency_ms is not None and median > health.max_latency_ms:
        return f"median inference {median:.1f} ms over max_latency_ms {health.max_latency_ms:g}"
    if median is not None and latency_before_ms and median > latency_before_ms * health.max_latency_ratio:
        return (
            f"median inference {median:.1f} ms, {median / latency_before_ms:.1f}x the previous version's "
            f"{latency_before_ms:.1f} ms (max_latency_ratio {health.max_latency_ratio:g})"
        )
    return None
