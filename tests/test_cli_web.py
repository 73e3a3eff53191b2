"""`edge-agent web hash-password` as a user runs it (the installed console script in a subprocess): the
password from stdin or from a no-echo prompt on a terminal (a real pseudo-terminal), never argv; the
printed line is one agent.web.passwords accepts for that password and no other."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

from agent.web.passwords import verify_password
from tests.agent_process import EDGE_AGENT

PASSWORD = "tr0ub4dor & 3"


def hash_of(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EDGE_AGENT, "web", "hash-password", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_hash_of_a_piped_password_round_trips_and_json_says_the_same() -> None:
    done = hash_of(stdin=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("scrypt$n=16384,r=8,p=1$") and PASSWORD not in done.stdout
    assert verify_password(PASSWORD, line) and not verify_password(PASSWORD + "x", line)
    as_json = hash_of("--json", stdin=PASSWORD + "\n")
    assert as_json.returncode == 0, as_json.stderr
    stored = json.loads(as_json.stdout)["password_hash"]
    assert verify_password(PASSWORD, stored) and stored != line  # salted: a new salt each time


def test_no_password_is_a_clear_error_and_argv_is_no_way_in() -> None:
    done = hash_of(stdin="")
    assert done.returncode == 1 and "error: no password given" in done.stderr
    assert "Traceback" not in done.stderr
    refused = hash_of(PASSWORD, stdin="")  # an argument is not taken
    assert refused.returncode == 2 and "Got unexpected extra argument" in refused.stderr


def test_at_a_terminal_it_asks_twice_without_echoing() -> None:
    main, child_side = pty.openpty()
    # A session of its own: no controlling terminal, so getpass reads the pseudo-terminal it is given.
    process = subprocess.Popen(
        [EDGE_AGENT, "web", "hash-password"],
        stdin=child_side, stdout=child_side, stderr=child_side, start_new_session=True,
    )  # fmt: skip
    os.close(child_side)
    seen = b""

    def read_until(text: bytes, timeout: float = 60.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while text not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(main, 4096)
                except OSError:  # the child closed the terminal
                    break
        assert text in seen, seen

    try:
        read_until(b"Password: ")
        os.write(main, PASSWORD.encode() + b"\n")
        read_until(b"Again: ")
        os.write(main, PASSWORD.encode() + b"\n")
        read_until(b"scrypt$")
        assert process.wait(60) == 0
        read_until(b"\n", 5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(main)
    assert PASSWORD.encode() not in seen  # never echoed
    line = seen.decode().split("Again: ", 1)[1].strip().splitlines()[-1].strip()
    assert verify_password(PASSWORD, line), seen
