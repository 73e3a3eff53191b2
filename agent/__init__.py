"""edge-agent: the edge ML deployment daemon (see docs/architecture.md)."""

import os

__version__ = "0.1.0"

# Before any module imports cv2: OpenCV's own "[ WARN:0@...] cap.cpp ..." lines on every camera
# retry say less than the agent's log line about the same failure (agent/sources/diagnose.py).
os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
