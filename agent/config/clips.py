"""A pipeline's event clips (`clips:`, docs/analytics.md "Clips"): an MP4 of what its tracked objects
did, from `pre_s` before the first one appeared to `post_s` after the last one left, made from the
frames the pipeline already decodes (agent/clips.py)."""

from __future__ import annotations

from pydantic import Field

from agent.config.base import StrictModel

MAX_CLIP_FPS = 15.0  # a clip's frame rate at most: an event's video, not the camera's full stream


class ClipsConfig(StrictModel):
    """Event clips: H.264 MP4 files under <state_dir>/clips/<pipeline>, needing tracking on a video source."""

    enabled: bool = Field(False, description="Record clips of the tracked objects' events.")
    pre_s: float = Field(3.0, ge=0, le=30, description="Seconds before an object's `new` the clip starts.")
    post_s: float = Field(3.0, ge=0, le=300, description="Seconds after the last object's `end` it stops.")
    max_s: float = Field(
        300.0,
        ge=5,
        le=3600,
        description="A clip longer than this is closed and the next one starts (an object that never "
        "leaves must not grow one file without bound).",
    )
    fps: float | None = Field(
        None,
        gt=0,
        le=MAX_CLIP_FPS,
        description=f"The clip's frame rate; default: the rate frames reach the pipeline's report, at most "
        f"{MAX_CLIP_FPS:g}.",
    )
    quality: int = Field(
        75, ge=10, le=100, description="JPEG quality of the frames held for the pre-roll and the encoder."
    )
    max_clips: int = Field(200, ge=1, le=1_000_000, description="At most this many clips of this pipeline.")
    max_bytes: int = Field(
        1024 * 1024 * 1024, ge=1024 * 1024, description="At most this many bytes of this pipeline's clips."
    )
