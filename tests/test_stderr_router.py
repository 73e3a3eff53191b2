"""providers/native_stderr.py's router of fd 2: captures in several threads run at once, other output
is never held, what is in the pipe at exit still reaches the real stderr, noise goes to its sink. Each
case runs in a child Python whose real stderr is a pipe read here, so the real fd 2 is observed."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

from agent.sources.video import _log_ffmpeg_line


def child(code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def finish(process: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out.decode(), err.decode()


def read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    """What `fd` gives until `wanted` is among it, or AssertionError after `timeout` s."""
    got = b""
    deadline = time.monotonic() + timeout
    while wanted not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} within {timeout} s; got {got!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"end of stream before {wanted!r}; got {got!r}"
            got += chunk
    return got


def test_two_threads_capturing_at_once_do_not_wait_for_each_other() -> None:
    process = child(
        """
        import json, os, threading, time
        from providers.native_stderr import filtered_stderr
        inside, release, result = threading.Event(), threading.Event(), {}
        def first():
            with filtered_stderr((b"ONE",)):
                inside.set()
                result["released_while_inside"] = release.wait(20)  # until the second block is done
        def second():
            inside.wait(20)
            started = time.monotonic()
            with filtered_stderr((b"TWO",)):
                os.write(2, b"TWO noise\\n")
            result["second_s"] = time.monotonic() - started
            release.set()
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        print(json.dumps(result))
        """
    )
    rc, out, err = finish(process)
    assert rc == 0, err
    result = json.loads(out)
    # With one capture at a time, the second waited for the first, which waited its 20 s in vain.
    assert result["released_while_inside"] is True, result
    assert result["second_s"] < 5, result
    assert err == "", err


def test_another_threads_line_reaches_the_real_stderr_while_a_capture_is_on() -> None:
    process = child(
        """
        import os, sys, threading
        from providers.native_stderr import filtered_stderr
        with filtered_stderr((b"NOISE",)):
            threading.Thread(target=lambda: os.write(2, b"LIVE line from another thread\\n")).start()
            sys.stdin.readline()  # inside until the parent has seen the line
        print("done", flush=True)
        """,
        stdin=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stderr is not None
    try:
        seen = read_until(process.stderr.fileno(), b"LIVE line from another thread\n", timeout=20)
        assert process.poll() is None  # still inside the block
    finally:
        out, err = process.communicate(b"\n", timeout=60)  # (the child leaves the block and ends)
    assert process.returncode == 0, seen + err
    assert out == b"done\n"
    assert seen + err == b"LIVE line from another thread\n"


def test_at_exit_what_is_in_the_pipe_reaches_the_real_stderr() -> None:
    rc, _, err = finish(
        child(
            """
            import os
            from providers.native_stderr import filtered_stderr
            with filtered_stderr((b"NOISE",)):
                pass
            for i in range(3000):  # more than a default pipe holds, written just before the end
                os.write(2, b"line %04d " % i + b"x" * 80 + b"\\n")
            os.write(2, b"NOISE after the block: not routed away any more\\n")
            raise RuntimeError("the end")
            """
        )
    )
    assert rc == 1
    lines = err.splitlines()
    assert lines[:3000] == [f"line {i:04d} " + "x" * 80 for i in range(3000)]
    assert lines[3000] == "NOISE after the block: not routed away any more"
    assert lines[3001] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: the end"


def test_a_line_without_its_newline_goes_on_after_a_short_wait_and_at_exit() -> None:
    process = child(
        """
        import os, sys
        from providers.native_stderr import filtered_stderr
        with filtered_stderr((b"NOISE",)):
            os.write(2, b"prompt> ")
            sys.stdin.readline()
        os.write(2, b"last words")
        """,
        stdin=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stderr is not None
    try:
        seen = read_until(process.stderr.fileno(), b"prompt> ", timeout=20)
    finally:
        _, err = process.communicate(b"\n", timeout=60)
    assert process.returncode == 0
    assert seen + err == b"prompt> last words"


def test_noise_goes_to_the_sink_and_not_to_stderr_even_from_a_logging_sink() -> None:
    rc, out, err = finish(
        child(
            """
            import json, logging, os, re, sys, threading
            from providers.native_stderr import filtered_stderr, keep_routed
            logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="LOG %(message)s")
            lib = re.compile(rb"\\[lib @ 0x[0-9a-f]+\\] ")
            keep_routed(lib, lambda line: logging.debug("lib said %r", line))
            said = []
            with filtered_stderr((b"NOISE",), said):
                writers = [
                    threading.Thread(target=os.write, args=(2, b"NOISE %d\\n" % i)) for i in range(20)
                ]
                for writer in writers:
                    writer.start()
                for writer in writers:
                    writer.join(10)
                os.write(2, b"[lib @ 0xabc] hello\\nkept line\\n")
            print(json.dumps(sorted(line.decode() for line in said)))
            """
        )
    )
    assert rc == 0, err
    assert json.loads(out) == sorted(f"NOISE {i}\n" for i in range(20))
    assert sorted(err.splitlines()) == ["LOG lib said b'[lib @ 0xabc] hello\\n'", "kept line"]


def test_a_reader_that_fails_gives_fd_2_back_and_nothing_is_lost() -> None:
    # The reader's failure is provoked (its line splitter replaced by one that raises): what it read
    # goes out unrouted, fd 2 is the real stderr again and later lines go straight there.
    rc, out, err = finish(
        child(
            """
            import os
            from providers import native_stderr
            router = native_stderr.install()
            real = os.readlink(f"/proc/self/fd/{router.real}")
            def broken(data):
                raise MemoryError("provoked")
            router._split = broken
            os.write(2, b"first line\\n")
            native_stderr.settle(5)  # returns at once: the reader is gone
            with native_stderr.filtered_stderr((b"NOISE",)):
                os.write(2, b"NOISE: nobody routes it now\\n")
            print(os.readlink("/proc/self/fd/2") == real)
            """
        )
    )
    assert rc == 0, err
    assert out == "True\n"
    assert err.splitlines() == [
        "native stderr router: its reader failed (MemoryError: provoked): stderr goes straight out now",
        "first line",
        "NOISE: nobody routes it now",
    ]


def test_a_stalled_camera_open_holds_neither_a_model_load_nor_other_output() -> None:
    # A camera that accepts and never answers keeps its FFmpeg open 2 s; meanwhile another thread's
    # capture (a model load's) and its other line go through at once. (Opens of two cameras still
    # take turns inside OpenCV, which locks its FFmpeg open: not fd 2's doing.)
    rc, out, err = finish(
        child(
            """
            import json, os, socket, threading, time
            import cv2
            from agent.config import VideoSourceConfig
            from agent.sources.frames import LatestFrameSlot
            from agent.sources.video import VideoSource
            from providers.native_stderr import filtered_stderr
            server = socket.create_server(("127.0.0.1", 0))
            connected, held = threading.Event(), []
            def accept():
                held.append(server.accept())  # never answered
                connected.set()
            threading.Thread(target=accept, daemon=True).start()
            uri = f"http://127.0.0.1:{server.getsockname()[1]}/mjpeg"
            source = VideoSource(VideoSourceConfig(type="video", uri=uri), "silent", LatestFrameSlot())
            params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 2000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 2000]
            opener = threading.Thread(target=source._open_ffmpeg, args=(params,))
            opener.start()
            result = {"connected": connected.wait(20)}
            started = time.monotonic()
            with filtered_stderr((b"INFO: Created",)):
                os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\\n")
            os.write(2, b"LIVE line\\n")
            result["block_s"] = time.monotonic() - started
            result["still_opening"] = opener.is_alive()
            opener.join(30)
            print(json.dumps(result))
            """
        )
    )
    assert rc == 0, err
    result = json.loads(out)
    assert result["connected"] is True, result
    assert result["still_opening"] is True and result["block_s"] < 1.0, result
    assert err == "LIVE line\n", err


@pytest.mark.parametrize(
    ("line", "logged"),
    [
        (
            b"[rtsp @ 0x55d0c0a1b2c0] method DESCRIBE failed for rtsp://admin:hunter2@10.0.0.7/x\n",
            "FFmpeg: [rtsp @ 0x55d0c0a1b2c0] method DESCRIBE failed for rtsp://admin:***@10.0.0.7/x",
        ),
        (b"[http @ 0x1] bad http://u:secret@[::1 here\n", "FFmpeg: [http @ 0x1] bad http://*** here"),
    ],
)
def test_ffmpegs_lines_are_logged_with_passwords_hidden(
    line: bytes, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="agent.sources.video"):
        _log_ffmpeg_line(line)
    assert [r.getMessage() for r in caplog.records] == [logged]
