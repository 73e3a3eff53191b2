"""Sources yield timestamped frames; camera sources keep only the newest one."""

from agent.sources.frames import Frame, LatestFrameSlot
from agent.sources.video import VideoSource, redact_uri

__all__ = ["Frame", "LatestFrameSlot", "VideoSource", "redact_uri"]
