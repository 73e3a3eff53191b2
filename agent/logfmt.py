"""How the agent's log lines look: plain text (under systemd without a time stamp: journald adds
its own), or JSON lines for log shippers (`log_format: json`, `run --log-format json`); and how
often a problem that repeats is logged (`first_or_every`)."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Literal, get_args

from agent.clock import iso_utc

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)


class JsonLines(logging.Formatter):
    """One JSON object per line: time (UTC, ms), level, logger, message, and the traceback, if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    """The root logger at `level`, to stderr, in `fmt`."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLines())
    else:
        with_time = "JOURNAL_STREAM" not in os.environ  # journald stamps lines itself
        handler.setFormatter(
            logging.Formatter(("%(asctime)s " if with_time else "") + "%(levelname)s %(name)s: %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)


def first_or_every(count: int, every: int = 100) -> bool:
    """Whether the `count`th time something happened (counted from 1) is logged: the first time, then
    every `every`th (1, 100, 200, ...), so a problem that repeats each frame or message is not a
    line each time. The caller counts (under its own lock) and says "so far" in the line."""
    return count == 1 or count % every == 0
