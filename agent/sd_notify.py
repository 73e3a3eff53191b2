"""systemd's sd_notify protocol (READY, STOPPING, WATCHDOG, STATUS) without a library.

Every call is a no-op when NOTIFY_SOCKET is unset, so the daemon runs the same outside systemd.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*states: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=running"). Returns whether a message was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            # Never blocks: a reader that stopped reading (its queue holds 10 datagrams by default)
            # must not stall the daemon's main loop; the message is dropped instead.
            sock.send("\n".join(states).encode(), socket.MSG_DONTWAIT)
        return True
    except BlockingIOError:
        log.debug("sd_notify to %s: its queue is full, dropped %s", address, states)
        return False
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False


def watchdog_interval_s() -> float | None:
    """How often to ping the watchdog (half of WatchdogSec), or None when it is off."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
