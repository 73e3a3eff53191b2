"""Read-only access to a box's files under a root (`Tree`: links followed as a chroot would, nothing
ever raises) and the small parsers of what sysfs, procfs and the device tree hold."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__package__)  # the package's logger, as before it was split

_MAX_READ = 1 << 20  # a /proc or /sys file, /etc/os-release, ...
_MAX_LINK_HOPS = 40


class Tree:
    """Read-only access to a box's files under `root`; every method answers, none raises."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._host_root = os.path.realpath(root) == "/"

    def path(self, rel: str) -> Path | None:
        """Where the box's `/rel` lies on this machine, following links as a chroot would."""
        if self._host_root:
            return Path("/", rel.lstrip("/"))
        pending = [p for p in rel.split("/") if p not in ("", ".")]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = self.root.joinpath(*resolved, part)
            try:
                target = os.readlink(candidate)
            except (OSError, ValueError):  # not a link, or not there: open() decides later
                resolved.append(part)
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return None
            if target.startswith("/"):
                resolved = []
            pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
        return self.root.joinpath(*resolved)

    def read(self, rel: str, limit: int = _MAX_READ) -> str | None:
        """The text of a regular file (at most `limit` bytes, bad UTF-8 replaced), else None."""
        path = self.path(rel)
        if path is None:
            return None
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
            try:
                chunks: list[bytes] = []
                size = 0
                while size < limit:
                    chunk = os.read(fd, min(1 << 16, limit - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, exc)
            return None
        return b"".join(chunks).decode("utf-8", errors="replace")

    def value(self, rel: str) -> str | None:
        """A one-value file (sysfs attribute): stripped of whitespace and NULs; None when empty."""
        text = self.read(rel, 4096)
        if text is None:
            return None
        text = text.strip().strip("\x00").strip()
        return text or None

    def lines(self, rel: str, limit: int) -> Iterator[str]:
        """The lines of a large regular file (at most `limit` bytes), without line ends."""
        path = self.path(rel)
        if path is None:
            return
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return
            with open(path, "rb") as handle:
                size = 0
                for raw in handle:
                    size += len(raw)
                    if size > limit:
                        return
                    yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, exc)

    def listdir(self, rel: str) -> list[str]:
        path = self.path(rel)
        if path is None:
            return []
        try:
            return sorted(os.listdir(path))
        except (OSError, ValueError):
            return []

    def exists(self, rel: str) -> bool:
        path = self.path(rel)
        return path is not None and os.path.exists(path)

    def link_name(self, rel: str) -> str | None:
        """The last component of a link's target (a sysfs `driver` link names the driver)."""
        parent, _, name = rel.rstrip("/").rpartition("/")
        path = self.path(parent)
        if path is None:
            return None
        try:
            target = os.readlink(path / name)
        except (OSError, ValueError):
            return None
        return target.rstrip("/").rpartition("/")[2] or None


# --------------------------------------------------------------------------- small parsers

_HEX = re.compile(r"(?:0x)?([0-9a-fA-F]{1,8})")


def parse_hex(text: str | None) -> int | None:
    if text is None:
        return None
    match = _HEX.fullmatch(text.strip())
    return int(match.group(1), 16) if match else None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d{1,18}", text) else None


def clean_text(text: str | None, limit: int = 200) -> str | None:
    """A name from a file made printable and bounded; None when nothing is left."""
    if text is None:
        return None
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())[:limit]
    return text or None


def colon_fields(text: str | None) -> dict[str, str]:
    """`Key: value` lines (/proc/driver/nvidia/gpus/*/information, uevent-like files)."""
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def uevent_fields(text: str | None) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def dt_strings(text: str | None) -> list[str]:
    """A device-tree string list (NUL-separated, NUL-terminated)."""
    return [s for s in (clean_text(part) for part in (text or "").split("\x00")) if s]
