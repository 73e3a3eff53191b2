"""The helper-process reader behind live audio and GStreamer sources, on real programs (sh, printf,
sleep): headers with comments, exact reads, an ending, a silence, a failure with its own words,
a program that is not installed, and nothing left behind on close."""

from __future__ import annotations

import pytest

from agent.errors import EdgeAgentError
from agent.sources.child import ChildStream


def test_tokens_with_comments_then_exact_bytes() -> None:
    child = ChildStream(["sh", "-c", r"printf 'P6\n# made by hand\n2 1\n255\nabcdef'"], "")
    try:
        assert [child.read_token(30) for _ in range(4)] == [b"P6", b"2", b"1", b"255"]
        assert child.read_exact(6, 30) == b"abcdef"  # the pixels, not one byte more or less
        assert child.read_exact(1, 30) is None and child.failure == "ended"
    finally:
        child.close()


def test_silence_failure_and_missing_program() -> None:
    quiet = ChildStream(["sleep", "30"], "")
    try:
        assert quiet.read_exact(1, 0.2) is None and quiet.failure == "sent nothing for 0.2 s"
    finally:
        quiet.close()  # terminates it: close() must not wait the 30 s
    failing = ChildStream(["sh", "-c", "echo 'Recording banner' >&2; echo 'no such device' >&2; exit 3"], "",
                          chatter=("Recording ",))  # fmt: skip
    try:
        assert failing.read_exact(1, 30) is None
        assert failing.failure == "exited with status 3: no such device"  # the banner left out
        assert failing.said("device") == "no such device"
    finally:
        failing.close()
    garbage = ChildStream(["sh", "-c", "head -c 200 /dev/zero | tr '\\0' 'x'"], "")
    try:
        assert garbage.read_token(30) is None and str(garbage.failure).startswith("unexpected output: b'xxx")
    finally:
        garbage.close()
    with pytest.raises(EdgeAgentError, match=r"no-such-helper is not installed \(apt-get install it\)"):
        ChildStream(["no-such-helper"], "apt-get install it")
