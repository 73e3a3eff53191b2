"""Small file-system helpers: lock files, an instance lock, atomic writes, hashing copies.

Shared by the registry, the store and the daemon's state files; all writes go through a temp
file beside the target and a rename, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import hashlib
import logging
import os
import pwd
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from agent.errors import EdgeAgentError

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20


@dataclass(frozen=True)
class _Holder:
    what: str
    thread: str
    since: float  # monotonic


# The locks this process holds, by the lock file's (device, inode): what each holder is doing, for
# the hint a waiter gets (flock conflicts between threads of one process too).
_held: dict[tuple[int, int], list[_Holder]] = {}
_held_lock = threading.Lock()


@contextlib.contextmanager
def file_lock(
    path: Path,
    timeout_s: float,
    what: str,
    error: type[EdgeAgentError] = EdgeAgentError,
    shared: bool = False,
) -> Iterator[None]:
    """Hold an exclusive (or, with `shared`, a shared) `flock` on `path` (created if needed),
    waiting at most `timeout_s` (0: not at all).

    flock conflicts between separate open() calls even inside one process, so this serializes
    threads and processes alike. Lock files are never deleted (that would race with waiters).
    `what` says what the caller does under the lock: an exclusive holder writes its pid and `what`
    into the file, so that a waiter that gives up can say who holds it and why (`lock_holders`).
    On timeout (or when the lock file cannot be created) raises `error` naming `what`, the file
    and its holder.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise error(f"cannot create lock file {path} for {what}: {exc}") from None
    try:
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        logged = False
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                waited = f"timed out after {timeout_s:g}s waiting for" if timeout_s > 0 else "cannot take"
                raise error(
                    f"{waited} the lock on {what} ({path}): held by {lock_holders(path, fd)}",
                    hint="it is let go when that work ends (or its process does); a lock no process "
                    "holds is stale only on a broken network file system",
                )
            if not logged:
                log.info("waiting for %s (held by %s)", what, lock_holders(path, fd))
                logged = True
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        holder = _Holder(what, threading.current_thread().name, time.monotonic())
        with _held_lock:
            _held.setdefault(key, []).append(holder)
        if not shared:
            with contextlib.suppress(OSError):  # the record is for people: the lock works without it
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        try:
            yield
        finally:
            if not shared:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)  # a record left behind would name the wrong holder
            with _held_lock:
                holders = _held.get(key, [])
                holders.remove(holder)
                if not holders:
                    _held.pop(key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_holders(path: Path, fd: int | None = None) -> str:
    """Who holds the lock file at `path`, in words: this process's holders (pid, thread, what they
    do and for how long), else the pid and purpose an exclusive holder wrote into the file."""
    now = time.monotonic()
    try:
        st = os.fstat(fd) if fd is not None else path.stat()
        key = (st.st_dev, st.st_ino)
    except OSError:
        key = (-1, -1)
    with _held_lock:
        mine = list(_held.get(key, []))
    if mine:
        return "; ".join(
            f"this process (pid {os.getpid()}, thread {h.thread}): {h.what}, for {now - h.since:.0f} s"
            for h in mine
        )
    try:
        record = path.read_text(errors="replace").strip()
    except OSError:
        record = ""
    pid, _, doing = record.partition(" ")
    if pid.isdigit() and doing:
        return f"process {pid}: {doing}"
    return "another process (it left no record of what it does: a shared holder)"


class InstanceInUse(EdgeAgentError):
    """Another process holds the instance lock (see InstanceLock)."""


class InstanceLock:
    """An exclusive `flock` on `path`, held until `release()` (or the process's end): one process
    of a kind per resource, e.g. one daemon per state dir.

    The file holds the holder's pid, for the error a second process gives (`InstanceInUse`, at
    once: no waiting): `message` and `hint`, with `{pid}` and `{lock}` filled in. The kernel drops
    the lock when its holder dies, however it dies, so it is never stale; the file itself stays
    (deleting it would race with a starting process).
    """

    def __init__(self, path: Path, message: str, hint: str | None = None) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = {"pid": self._holder() or "unknown", "lock": path}
            raise InstanceInUse(
                message.format(**holder), hint=hint.format(**holder) if hint else None
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def _holder(self) -> int | None:
        """The holder's pid; it writes it right after taking the lock, so wait a moment for it."""
        deadline = time.monotonic() + 1.0
        while True:
            with contextlib.suppress(OSError, ValueError):
                return int(self.path.read_text().strip())
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a pid left behind would name the wrong process to the next one
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def temp_name(final: Path) -> Path:
    """A temp file name next to `final`, unique per process, thread and call."""
    return final.with_name(f"{final.name}.tmp-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write `data` to a temp file beside `path`, then rename it over `path`.

    `durable` fsyncs the file and its directory so the new content survives a power cut; files
    rewritten every few seconds skip it to spare flash storage (a reader still never sees half).
    """
    tmp = temp_name(path)
    try:
        # Created with `mode` less the umask from the start (a private key is never readable by others),
        # and left so: the daemon's umask 077 keeps its state files owner-only.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status; elsewhere a swap)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def masked_mode(mode: int) -> int:
    """`mode` less the umask, for a chmod that should grant no more than creating the file would."""
    return mode & ~current_umask()


def copy_hashing(
    src: BinaryIO,
    dst: BinaryIO,
    max_bytes: int | None = None,
    digest: Any = None,
    copied: Callable[[int], None] | None = None,
) -> tuple[str, int]:
    """Stream `src` into `dst`; return (sha256 hex, bytes copied).

    Stops as soon as more than `max_bytes` arrived (the caller reports the size mismatch), so a
    wrong or runaway source cannot fill the disk. `digest`: a sha256 that has hashed what came
    before (a resumed download); the hex returned covers it all. `copied(n)` after each chunk of n.
    """
    digest = digest if digest is not None else hashlib.sha256()
    size = 0
    while True:
        chunk = src.read(CHUNK_SIZE)
        if not chunk:
            break
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            break
        digest.update(chunk)
        dst.write(chunk)
        if copied is not None:
            copied(len(chunk))
    return digest.hexdigest(), size


def sha256_file(path: Path) -> str:
    return hash_file(path).hexdigest()


def hash_file(path: Path) -> Any:
    """A sha256 that has hashed the file's bytes (more may be added: a resumed download)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest


def user_name(uid: int) -> str:
    """The user's name, or the number where the box has no such user (a file from elsewhere)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The group's name, or the number where the box has no such group."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
