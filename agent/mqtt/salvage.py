"""What can still be read from a damaged outbox file, read page by page without SQLite.

SQLite refuses a file whose header is garbage ("file is not a database") and stops at the first
bad page of a truncated one ("database disk image is malformed"); the `sqlite3` shell's `.recover`
fails on both (3.40). So this reads the file format itself (https://sqlite.org/fileformat2.html):
the pages of the main file with the committed frames of its write-ahead log (`-wal`) laid over
them, as SQLite would see them; then the outbox's tables are walked from their b-tree roots,
skipping any page or cell that cannot be read.

- The roots come from the schema (page 1). When page 1 is unreadable, the roots every outbox has
  are tried (its tables are always created in the same order, so `messages` is rooted at page 2,
  and so on); when that fails too, every page is scanned for rows shaped like the outbox's. A scan
  also finds pages SQLite had freed, so in that last case messages already delivered may be
  delivered again (at-least-once: consumers de-duplicate by the result's id).
- Only committed WAL frames whose checksums hold are used, as SQLite does.
- Nothing is written: the damaged files are left as they are, for a post-mortem.
"""

from __future__ import annotations

import contextlib
import io
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

SQLITE_MAGIC = b"SQLite format 3\x00"
_WAL_MAGICS = (0x377F0682, 0x377F0683)
_PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)  # SQLite's default (ours) first
_TABLE_LEAF, _TABLE_INTERIOR = 0x0D, 0x05
# The root pages every outbox's tables have: they are created in this order (outbox._SCHEMA,
# unchanged since the first version; sqlite_sequence comes with the first AUTOINCREMENT table, each
# TEXT PRIMARY KEY brings an index), and without auto-vacuum a root page never moves.
_USUAL_ROOTS = {"messages": 2, "sqlite_sequence": 3, "sequences": 4, "counters": 6}


class _Unreadable(Exception):
    """A page, cell or record that cannot be decoded."""


@dataclass(frozen=True)
class SalvagedMessage:
    id: int
    topic: str
    payload: bytes
    qos: int
    created: float
    stream: str
    seq: int = 0  # the row's own sequence number (0: written before rows carried one)


@dataclass
class Salvage:
    """What was read. `messages()` yields the messages in id order (read lazily: an outbox may be
    larger than the memory that is free)."""

    sequences: dict[str, int] = field(default_factory=dict)  # per-stream counters (table `sequences`)
    counters: dict[str, int] = field(default_factory=dict)  # drop counters (table `counters`)
    max_id: int = 0  # the highest message id the file records (sqlite_sequence); 0: unknown
    how: str = "nothing could be read"
    unreadable_pages: int = 0
    unreadable_rows: int = 0
    may_repeat_delivered: bool = False  # a scan of every page: freed pages may hold delivered messages
    complete: bool = False  # the messages' b-tree was read whole: nothing in it was unreadable
    _reader: _Pages | None = None
    _locations: list[tuple[int, int, int]] = field(default_factory=list)  # (id, page, cell)

    @property
    def message_count(self) -> int:
        return len(self._locations)

    def messages(self) -> Iterator[SalvagedMessage]:
        if self._reader is None:
            return
        for rowid, page, cell in self._locations:
            try:
                message = _as_message(rowid, _leaf_cell(self._reader, page, cell)[1])
            except _Unreadable:
                continue  # read before, so not expected; counted as lost by the caller's totals
            if message is not None:
                yield message

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def salvage(path: Path) -> Salvage:
    """Read what survives of the outbox at `path` and its `-wal` (either may be missing). Never
    raises for bad content; the file stays open for `Salvage.messages()` until `Salvage.close()`."""
    wal = path.with_name(path.name + "-wal")
    db_file: BinaryIO
    try:
        db_file = path.open("rb")
    except FileNotFoundError:
        db_file = io.BytesIO(b"")  # a WAL without its database: what the WAL holds
    except OSError as exc:
        log.warning("cannot read %s to recover from it: %s", path, exc)
        return Salvage()
    wal_bytes = b""
    with contextlib.suppress(OSError):
        wal_bytes = wal.read_bytes() if wal.exists() else b""
    header = db_file.read(100)
    page_size = _header_page_size(header)
    wal_page_size = _wal_page_size(wal_bytes)
    sizes = [s for s in (page_size, wal_page_size) if s] or list(_PAGE_SIZES)
    best: Salvage | None = None
    for size in sizes:
        reserved = header[20] if page_size == size else 0
        reader = _Pages(db_file, size, reserved, wal_bytes if wal_page_size == size else b"")
        found = _salvage_pages(reader)
        if found.complete:
            best = found  # the messages' tree read whole (if empty): this is the page size
            break
        if best is None or found.message_count > best.message_count:
            best = found
        if best.message_count and size == sizes[0]:
            break  # the page size the file (or its WAL) states, or the default, worked
    assert best is not None
    if not best.message_count:  # nothing to read lazily
        db_file.close()
        best._reader = None
    return best


# -- pages --------------------------------------------------------------------------------------


class _Pages:
    """The database as SQLite would see it: main-file pages with committed WAL frames over them."""

    def __init__(self, file: BinaryIO, page_size: int, reserved: int, wal: bytes) -> None:
        self.file = file
        self.page_size = page_size
        self.usable = page_size - reserved
        self.overlay: dict[int, bytes] = {}
        self.wal_frames = 0
        file_pages = self._file_size() // page_size
        db_pages = self._read_wal(wal) if wal else 0
        self.count = db_pages or file_pages

    def _file_size(self) -> int:
        return self.file.seek(0, io.SEEK_END)

    def _read_wal(self, wal: bytes) -> int:
        """Lay the WAL's committed, checksummed frames over the file; the database's size in pages
        after the last commit (0 when the WAL has none)."""
        if len(wal) < 32:
            return 0
        magic, _version, page_size, _ckpt, salt1, salt2, ck1, ck2 = struct.unpack(">8I", wal[:32])
        if magic not in _WAL_MAGICS or page_size != self.page_size:
            return 0
        order = ">" if magic & 1 else "<"
        if _wal_checksum(wal[:24], 0, 0, order) != (ck1, ck2):
            return 0
        s0, s1 = ck1, ck2
        pending: dict[int, bytes] = {}
        db_pages = 0
        offset = 32
        frame = 24 + page_size
        while offset + frame <= len(wal):
            pgno, commit, fsalt1, fsalt2, fck1, fck2 = struct.unpack(">6I", wal[offset : offset + 24])
            if (fsalt1, fsalt2) != (salt1, salt2) or pgno == 0:
                break  # a frame of an earlier generation of the log: the end of this one
            data = wal[offset + 24 : offset + frame]
            s0, s1 = _wal_checksum(wal[offset : offset + 8], s0, s1, order)
            s0, s1 = _wal_checksum(data, s0, s1, order)
            if (s0, s1) != (fck1, fck2):
                break  # torn or damaged: SQLite ignores it and everything after it
            pending[pgno] = data
            if commit:
                self.overlay.update(pending)
                self.wal_frames += len(pending)
                pending.clear()
                db_pages = commit
            offset += frame
        return db_pages

    def get(self, pgno: int) -> bytes:
        if not 1 <= pgno <= self.count:
            raise _Unreadable(f"page {pgno} is beyond the end of the file")
        data = self.overlay.get(pgno)
        if data is not None:
            return data
        self.file.seek((pgno - 1) * self.page_size)
        data = self.file.read(self.page_size)
        if len(data) != self.page_size:
            raise _Unreadable(f"page {pgno} is cut short")
        return bytes(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()


def _header_page_size(header: bytes) -> int:
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return 0
    size = struct.unpack(">H", header[16:18])[0]
    size = 65536 if size == 1 else size
    return size if size in _PAGE_SIZES else 0


def _wal_page_size(wal: bytes) -> int:
    if len(wal) < 32:
        return 0
    magic, _version, size = struct.unpack(">3I", wal[:12])
    return size if magic in _WAL_MAGICS and size in _PAGE_SIZES else 0


def _wal_checksum(data: bytes, s0: int, s1: int, order: str) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


# -- b-trees and records ------------------------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(8):
        if at + i >= len(data):
            raise _Unreadable("varint cut short")
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at + i + 1
    if at + 8 >= len(data):
        raise _Unreadable("varint cut short")
    value = (value << 8) | data[at + 8]
    return value - (1 << 64) if value >= 1 << 63 else value, at + 9


def _page_cells(pages: _Pages, pgno: int) -> tuple[int, list[int], int, bytes]:
    """(page type, cell offsets, right-most child or 0, page bytes) of a table b-tree page."""
    data = pages.get(pgno)
    at = 100 if pgno == 1 else 0
    kind = data[at]
    if kind not in (_TABLE_LEAF, _TABLE_INTERIOR):
        raise _Unreadable(f"page {pgno} is not a table b-tree page (type {kind})")
    count = struct.unpack(">H", data[at + 3 : at + 5])[0]
    header = 8 if kind == _TABLE_LEAF else 12
    right = struct.unpack(">I", data[at + 8 : at + 12])[0] if kind == _TABLE_INTERIOR else 0
    pointers = at + header
    if pointers + 2 * count > pages.usable:
        raise _Unreadable(f"page {pgno}: {count} cells do not fit")
    cells = list(struct.unpack(f">{count}H", data[pointers : pointers + 2 * count]))
    if any(not pointers + 2 * count <= c < pages.usable for c in cells):
        raise _Unreadable(f"page {pgno}: a cell pointer is out of the page")
    return kind, cells, right, data


def _leaf_cell(pages: _Pages, pgno: int, cell: int) -> tuple[int, list[object]]:
    """(rowid, column values) of cell `cell` (an index into the pointer array) of a leaf page."""
    kind, cells, _right, data = _page_cells(pages, pgno)
    if kind != _TABLE_LEAF or cell >= len(cells):
        raise _Unreadable(f"page {pgno} changed")
    return _read_leaf_cell(pages, data, cells[cell])


def _read_leaf_cell(pages: _Pages, data: bytes, at: int) -> tuple[int, list[object]]:
    size, at = _varint(data, at)
    rowid, at = _varint(data, at)
    usable = pages.usable
    if size < 0 or size > 1 << 31:
        raise _Unreadable("implausible payload size")
    most = usable - 35
    if size <= most:
        local = size
    else:
        least = (usable - 12) * 32 // 255 - 23
        local = least + (size - least) % (usable - 4)
        local = local if local <= most else least
    if at + local > usable:
        raise _Unreadable("cell runs off its page")
    payload = bytearray(data[at : at + local])
    if local < size:
        next_page = struct.unpack(">I", data[at + local : at + local + 4])[0]
        seen: set[int] = set()
        while len(payload) < size:
            if next_page in seen or next_page == 0:
                raise _Unreadable("broken overflow chain")
            seen.add(next_page)
            page = pages.get(next_page)
            next_page = struct.unpack(">I", page[:4])[0]
            payload += page[4 : 4 + min(usable - 4, size - len(payload))]
    return rowid, _record(bytes(payload))


def _record(payload: bytes) -> list[object]:
    header_size, at = _varint(payload, 0)
    if not 0 < header_size <= len(payload):
        raise _Unreadable("bad record header")
    types = []
    while at < header_size:
        serial, at = _varint(payload, at)
        types.append(serial)
    body = header_size
    values: list[object] = []
    for serial in types:
        if serial == 0:
            values.append(None)
            continue
        if serial in (8, 9):
            values.append(serial - 8)
            continue
        if serial in (10, 11):
            raise _Unreadable(f"reserved serial type {serial}")
        width = (0, 1, 2, 3, 4, 6, 8, 8)[serial] if serial <= 7 else (serial - 12) // 2
        raw = payload[body : body + width]
        if len(raw) != width:
            raise _Unreadable("record cut short")
        body += width
        if serial <= 6:
            values.append(int.from_bytes(raw, "big", signed=True))
        elif serial == 7:
            values.append(struct.unpack(">d", raw)[0])
        elif serial % 2:
            try:
                values.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise _Unreadable("text that is not UTF-8") from None
        else:
            values.append(bytes(raw))
    return values


def _as_message(rowid: int, values: list[object]) -> SalvagedMessage | None:
    """The row as an outbox message (columns id, topic, payload, qos, created[, stream[, seq]]), or
    None. Older rows have fewer columns (SQLite keeps a row as it was written when a column is added)."""
    if len(values) not in (5, 6, 7) or values[0] not in (None, rowid) or rowid < 1:
        return None
    topic, payload, qos, created = values[1:5]
    stream = values[5] if len(values) >= 6 else ""
    seq = values[6] if len(values) == 7 else 0
    if isinstance(payload, str):
        payload = payload.encode()
    if (
        not isinstance(topic, str)
        or not topic
        or not isinstance(payload, bytes)
        or qos not in (0, 1, 2)
        or not isinstance(created, int | float)
        or not isinstance(stream, str)
        or not isinstance(seq, int)
    ):
        return None
    return SalvagedMessage(rowid, topic, payload, int(qos), float(created), stream, seq)


def _as_pair(values: list[object]) -> tuple[str, int] | None:
    """A (name, value) row: tables sequences, counters and sqlite_sequence."""
    if len(values) == 2 and isinstance(values[0], str) and isinstance(values[1], int):
        return values[0], values[1]
    return None


@dataclass
class _Walk:
    rows: list[tuple[int, int, int, list[object]]] = field(default_factory=list)  # rowid, page, cell, values
    bad_pages: int = 0
    bad_cells: int = 0


def _walk(pages: _Pages, root: int, messages: bool = False) -> _Walk:
    """Every row of the table rooted at `root`, in rowid order; unreadable parts are counted.
    `messages`: only rows that are outbox messages are kept, and without their values (they are
    read again when delivered: the whole outbox need not fit in memory)."""
    out = _Walk()
    seen: set[int] = set()
    stack = [root]
    while stack:
        pgno = stack.pop()
        if pgno in seen:
            out.bad_pages += 1  # a cycle: a damaged pointer
            continue
        seen.add(pgno)
        try:
            kind, cells, right, data = _page_cells(pages, pgno)
            children: list[int] = []
            if kind == _TABLE_INTERIOR:
                for at in cells:
                    children.append(struct.unpack(">I", data[at : at + 4])[0])
                children.append(right)
        except (_Unreadable, struct.error, IndexError):
            out.bad_pages += 1
            continue
        if kind == _TABLE_INTERIOR:
            stack.extend(reversed(children))  # the leftmost (lowest rowids) is visited first
            continue
        for index, at in enumerate(cells):
            try:
                rowid, values = _read_leaf_cell(pages, data, at)
            except (_Unreadable, struct.error, IndexError, OverflowError):
                out.bad_cells += 1
                continue
            if not messages:
                out.rows.append((rowid, pgno, index, values))
            elif _as_message(rowid, values) is not None:
                out.rows.append((rowid, pgno, index, []))
            else:
                out.bad_cells += 1
    return out


def _salvage_pages(pages: _Pages) -> Salvage:
    found = Salvage(_reader=pages)
    roots: dict[str, int] = {}
    with contextlib.suppress(_Unreadable):
        for _rowid, _pg, _cell, values in _walk(pages, 1).rows:
            if len(values) == 5 and values[0] == "table" and isinstance(values[3], int):
                roots[str(values[1])] = values[3]
    how = "its tables, found through its schema"
    if "messages" not in roots:
        roots = dict(_USUAL_ROOTS)
        how = "its tables at the pages every outbox has them (its schema page is unreadable)"
    walk = _walk(pages, roots["messages"], messages=True)
    messages = sorted({rowid: (rowid, pg, cell) for rowid, pg, cell, _v in walk.rows}.values())
    found.unreadable_pages, found.unreadable_rows = walk.bad_pages, walk.bad_cells
    found.complete = not walk.bad_pages and not walk.bad_cells
    pairs_from: dict[str, list[list[object]]] = {}
    for table in ("sequences", "counters", "sqlite_sequence"):
        if table in roots:
            pairs_from[table] = [v for _r, _p, _c, v in _walk(pages, roots[table]).rows]
    if not messages and not found.complete:
        # The tree is gone: scan every page for leaves holding rows shaped like the outbox's. (Not
        # when it was read whole and is empty: freed pages would bring delivered messages back.)
        scanned: dict[int, tuple[int, int]] = {}
        pairs: list[list[object]] = []
        for pgno in range(1, pages.count + 1):
            try:
                kind, cells, _right, data = _page_cells(pages, pgno)
            except (_Unreadable, struct.error, IndexError):
                continue
            if kind != _TABLE_LEAF:
                continue
            for index, at in enumerate(cells):
                try:
                    rowid, values = _read_leaf_cell(pages, data, at)
                except (_Unreadable, struct.error, IndexError, OverflowError):
                    continue
                if _as_message(rowid, values) is not None:
                    scanned.setdefault(rowid, (pgno, index))
                elif _as_pair(values) is not None:
                    pairs.append(values)
        if scanned:
            messages = sorted((rowid, pg, cell) for rowid, (pg, cell) in scanned.items())
            how = "a scan of every page (its tables' b-trees are unreadable)"
            found.may_repeat_delivered = True
            found.unreadable_pages = found.unreadable_rows = 0
        # The three (name, value) tables look alike: tell them apart by name. Their values only
        # grow, so taking the largest of every copy found (freed pages hold older ones) is safe.
        for values in pairs:
            name = str(values[0])
            table = "counters" if name.startswith("dropped") else "sequences"
            pairs_from.setdefault("sqlite_sequence" if name == "messages" else table, []).append(values)
    found._locations = messages
    if messages or found.complete:
        found.how = how
    for table, rows in pairs_from.items():
        target = {"sequences": found.sequences, "counters": found.counters}.get(table)
        for values in rows:
            pair = _as_pair(values)
            if pair is None:
                continue
            name, value = pair
            if target is None:
                if name == "messages":
                    found.max_id = max(found.max_id, value)
            else:
                target[name] = max(target.get(name, value), value)
    if messages:
        found.max_id = max(found.max_id, messages[-1][0])
    return found
