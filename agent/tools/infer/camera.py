"""Frames from a camera or stream (rtsp://, http(s)://, /dev/videoN, gst:PIPELINE) for `infer` and
`source --save`: read through the daemon's own VideoSource (agent/sources/video.py), so a URL that
works here works in a pipeline, and a camera that does not answer says why (its error), never hangs."""

from __future__ import annotations

import time
from collections.abc import Generator

import numpy as np

from agent.config import VideoSourceConfig
from agent.errors import EdgeAgentError
from agent.sources import Frame, VideoSource, open_source, redact_uri
from agent.sources.video import source_kind

CAMERA_KINDS = ("url", "device", "gstreamer")
# How long a camera may take to give its first frame (open, the RTSP handshake, the first keyframe).
FIRST_FRAME_S = 15.0


def is_camera(uri: str) -> bool:
    """A camera or stream the video source opens, not a file on disk."""
    return source_kind(uri) in CAMERA_KINDS


def camera_frames(
    uri: str, seconds: float | None, first_within_s: float = FIRST_FRAME_S
) -> Generator[Frame, None, None]:
    """The frames `uri` gives: the first within `first_within_s`, then those of the next `seconds`
    (None: the first only). The newest frame each time (a slow reader skips frames, as a pipeline
    does). EdgeAgentError with the source's reason when no frame comes."""
    source, slot = open_source(VideoSourceConfig(type="video", uri=uri), "infer")
    assert isinstance(source, VideoSource)
    source.fit_within(min(first_within_s, 8.0))
    source.start()
    try:
        began = time.monotonic()
        deadline = began + first_within_s
        first = True
        while time.monotonic() < deadline:
            frame = slot.get(timeout=min(0.2, max(0.01, deadline - time.monotonic())))
            if frame is None:
                if source.state in ("finished", "stopped") and len(slot) == 0:
                    break
                if first and source.state == "retrying":
                    break  # it could not open (or gave nothing): its error says why, no retrying here
                continue
            yield frame
            if seconds is None:
                return
            if first:
                first = False
                deadline = time.monotonic() + seconds
        if first:
            stats = source.stats()
            why = stats.error or f"no frame within {first_within_s:g} s"
            raise EdgeAgentError(
                f"{redact_uri(uri)}: {why}", hint=f"edge-agent source {redact_uri(uri)} says more"
            )
    finally:
        source.stop(timeout=5)


def camera_frame(uri: str, first_within_s: float = FIRST_FRAME_S) -> np.ndarray:
    """The first frame `uri` gives (BGR), the source stopped after it."""
    frames = camera_frames(uri, None, first_within_s)
    try:
        return next(frames).data
    finally:
        frames.close()
