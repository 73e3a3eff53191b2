"""The outbox's sequence numbers (agent/mqtt/outbox.py): per stream, where numbers continue on open
and the sidecar `<stem>.sequences.json` that reserves them ahead of use (see outbox.py's docstring:
numbers never go backwards, whatever happens to the file)."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

from agent.fsutil import atomic_write_bytes

log = logging.getLogger("agent.mqtt.outbox")  # one logger for the outbox, whichever part speaks

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class SequenceCounters:
    """Per stream: `last`, the last number stored (in a row or the `sequences` table), and
    `reserved`, above which no number has been handed out. The outbox's lock guards them."""

    def __init__(self, outbox: Path, block: int, grouped: bool) -> None:
        if block < 1:
            raise ValueError("sequence_block must be >= 1")
        self.outbox = outbox
        self.path = outbox.with_name(outbox.stem + ".sequences.json")
        self.block = block
        self.grouped = grouped  # power-loss-safe: commits are fsynced, so the table loses none
        self.reserved: dict[str, int] = {}
        self.last: dict[str, int] = {}

    def start(self, conn: sqlite3.Connection, recovered: dict[str, int] | None) -> None:
        """Where each stream's numbers continue (see the module docstring), written to the table
        and the sidecar before any number is handed out."""
        table = self._numbers_on_file(conn)
        sidecar, written_in_boot, grouped = self._read_sidecar()
        boot = _boot_id()
        rebooted = boot is None or written_in_boot != boot
        sources = [table]
        if recovered is not None or (rebooted and not grouped):
            # The table may lack numbers that were handed out, and maybe published: it was damaged,
            # or a power cut may have taken a crash-safe outbox's last commits (not fsynced; a
            # power-loss-safe one fsyncs each commit). After a clean stop the sidecar holds the
            # exact values, so this skips nothing then.
            sources.append(sidecar)
        if recovered is not None:
            sources.append(recovered)
        start: dict[str, int] = {}
        for source in sources:
            for stream, value in source.items():
                start[stream] = max(start.get(stream, 0), value)
        raised = {s: v for s, v in start.items() if v > table.get(s, 0)}
        if raised:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO sequences(stream, value) VALUES (?, ?) "
                    "ON CONFLICT(stream) DO UPDATE SET value = excluded.value",
                    sorted(raised.items()),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            known = {s: max(table.get(s, 0), (recovered or {}).get(s, 0)) for s in raised}
            skipped = {s: v for s, v in raised.items() if v > known[s]}
            if skipped:
                log.warning(
                    "outbox %s: %s, so sequence numbers continue above the reservation in %s: %s; the "
                    "numbers in between are skipped, none is reused",
                    self.outbox,
                    "it was recovered from a damaged file"
                    if recovered is not None
                    else "the machine restarted since the last clean stop (a power cut may have taken "
                    "the last commits)",
                    self.path,
                    ", ".join(
                        f"{s or '-'} continues at {v + 1} (the outbox had {known[s]})"
                        for s, v in sorted(skipped.items())
                    ),
                )
            else:
                log.info(
                    "outbox %s: sequence numbers continue where they were: %s",
                    self.outbox,
                    ", ".join(f"{s or '-'} at {v + 1}" for s, v in sorted(raised.items())),
                )
        # The table's values from here on, kept in memory: a put writes the next one without reading.
        self.last = dict(start)
        reserved = dict(sidecar)
        for stream, value in start.items():
            reserved[stream] = max(reserved.get(stream, 0), value)
        if reserved != sidecar or rebooted or grouped != self.grouped:
            self.write_sidecar(reserved)
        self.reserved = reserved

    def _numbers_on_file(self, conn: sqlite3.Connection) -> dict[str, int]:
        """Per stream, the last number the file records: its `sequences` row, or a queued row's
        own `seq` (a put writes only the row; the table follows when rows are deleted)."""
        numbers: dict[str, int] = {}
        rows = conn.execute(
            "SELECT stream, value FROM sequences UNION ALL "
            "SELECT stream, MAX(seq) FROM messages WHERE seq > 0 GROUP BY stream"
        )
        for stream, value in rows:
            numbers[str(stream)] = max(numbers.get(str(stream), 0), int(value))
        return numbers

    def keep(self, conn: sqlite3.Connection, values: dict[str, int] | None = None) -> None:
        """Write the streams' last numbers (`values`, or every stream's) to the `sequences` table.
        Caller holds the lock in a transaction that deletes rows (an ack, a drop) or uses a number
        without a row: a deleted row takes its `seq` with it, so the table must keep it."""
        conn.executemany(
            "INSERT INTO sequences(stream, value) VALUES (?, ?) "
            "ON CONFLICT(stream) DO UPDATE SET value = MAX(value, excluded.value)",
            sorted((values if values is not None else self.last).items()),
        )

    def _read_sidecar(self) -> tuple[dict[str, int], str | None, bool]:
        """(reserved values per stream, the boot id when it was written, whether its writer committed
        in groups); empty when missing."""
        try:
            data = json.loads(self.path.read_bytes())
            reserved = {str(k): int(v) for k, v in data["reserved"].items()}
            boot = data.get("boot_id")
            return reserved, str(boot) if boot is not None else None, bool(data.get("grouped_commits"))
        except FileNotFoundError:
            return {}, None, False
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error(
                "outbox %s: cannot read the sequence counters in %s (%s); continuing from the outbox's own",
                self.outbox,
                self.path,
                exc,
            )
            return {}, None, False

    def write_sidecar(self, reserved: dict[str, int]) -> None:
        """`reserved`: per stream, no number above it has been handed out. The boot id and the
        commit mode tell the next start whether the table can have lost numbers (`start`)."""
        data = {
            "boot_id": _boot_id(),
            "grouped_commits": self.grouped,
            "reserved": dict(sorted(reserved.items())),
        }
        # Durable: the reservation must be on disk before a number it covers is handed out.
        atomic_write_bytes(self.path, json.dumps(data, indent=1).encode() + b"\n", mode=0o600)

    def take(self, stream: str) -> int:
        """The stream's next sequence number (caller holds the lock). It is stored with the row (or,
        for a number used without a row, in the `sequences` table) in the caller's transaction."""
        value = self.last.get(stream, 0) + 1
        if value > self.reserved.get(stream, 0):
            # Reserve a block in the sidecar first (fsynced): a damaged outbox cannot take the number
            # back with it. Raises OSError (the caller's transaction rolls back) when it cannot.
            self.write_sidecar({**self.reserved, stream: value + self.block - 1})
            self.reserved[stream] = value + self.block - 1
        return value  # the caller records it in `last` once its transaction went through


def _boot_id() -> str | None:
    """This boot's id (Linux); a sidecar written in another boot may predate a power cut."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None
