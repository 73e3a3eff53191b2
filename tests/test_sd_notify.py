"""agent/sd_notify.py against a real datagram socket standing in for systemd's."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent.sd_notify import notify


def test_a_reader_that_stopped_reading_never_blocks_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify.sock"
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    queue = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    # Nothing reads: once the queue is full each further message is dropped, not waited on.
    sent = [notify("STATUS=busy", f"X_COUNT={i}") for i in range(queue + 20)]
    assert sent[0] is True and sent[-1] is False
    reader.settimeout(1)
    assert reader.recv(4096).decode() == "STATUS=busy\nX_COUNT=0"
    reader.close()


def test_no_socket_no_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
