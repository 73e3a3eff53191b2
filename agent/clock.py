"""Timestamps as every payload writes them."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(timestamp: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-11-22T10:15:30.123Z."""
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
