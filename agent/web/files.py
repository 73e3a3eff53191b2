"""File names from a request (a snapshot's, a clip's) checked before they reach the file system."""

from __future__ import annotations

import re
from pathlib import Path

# One plain file name: letters, digits and . _ - (what the agent names snapshots and clips), not
# starting with a dot. Anything else (/, \\, %, NUL, .., an absolute path, an encoded variant) is
# refused before any path is built, so no decoding layer can turn it into a traversal later.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


class UnsafeName(ValueError):
    """A name that is not one plain file inside the root."""


def safe_child(root: Path, name: str) -> Path:
    """`root / name` when `name` is one plain file name and the file it names (links followed)
    lies inside `root`; UnsafeName otherwise. The file need not exist."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise UnsafeName(f"{name!r} is not a plain file name")
    base = root.resolve()
    path = (base / name).resolve()  # follows a symlink: one pointing out of root is refused
    if path.parent != base:
        raise UnsafeName(f"{name!r} leads out of {root}")
    return path
