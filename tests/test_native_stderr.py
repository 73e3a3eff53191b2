"""providers/native_stderr.py: a block-scoped capture of fd 2, for LiteRT's line it has no switch for.
The real runtime, and the real fd 2 of a child Python (a pipe read here, or a terminal)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

XNNPACK = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_the_runtime_prints_its_line_once_per_process_on_its_first_interpreter() -> None:
    # The premise: capturing the probe's allocation (the first in a process) is enough.
    done = run(
        """
        import os
        from ai_edge_litert.interpreter import Interpreter  # not through the backend: it captures
        from providers.tflite_backend import tiny_model
        for threads in (1, 2, 3):
            interpreter = Interpreter(model_content=tiny_model(), num_threads=threads)
            interpreter.allocate_tensors()
            os.write(2, b"allocated %d\\n" % threads)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [XNNPACK, "allocated 1", "allocated 2", "allocated 3"]


def test_loading_models_through_the_backend_prints_no_xnnpack_line(tmp_path: Path) -> None:
    model = tmp_path / "double.tflite"
    done = run(
        f"""
        from pathlib import Path
        import numpy as np
        from providers.base import ModelArtifact
        from providers.tflite_backend import TfliteBackend, tiny_model
        path = Path({str(model)!r})
        path.write_bytes(tiny_model())
        backend = TfliteBackend("cpu")
        assert backend.probe().available
        for _ in range(2):
            session = backend.load(ModelArtifact(path, "tflite", "0" * 64))
            [name] = [spec.name for spec in session.inputs]
            print(session.run({{name: np.array([1.0, 2.0], dtype=np.float32)}}))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("[2., 4.]") == 2, done.stdout  # (y = x + x: loaded, and ran)
    assert done.stderr == "", done.stderr


def test_a_capture_hands_claimed_lines_to_its_sink_and_passes_the_rest_on_in_order() -> None:
    done = run(
        """
        import json, os, threading
        from providers.native_stderr import captured_stderr
        before = os.fstat(2)
        said = []
        def sink(line):
            if b"fails" in line:
                raise RuntimeError("a sink that fails")
            said.append(line.decode())
        with captured_stderr(lambda line: line.startswith(b"NOISE"), sink):
            os.write(2, b"first\\n")
            os.write(2, b"NOISE one\\n")
            writer = threading.Thread(target=os.write, args=(2, b"from another thread\\n"))
            writer.start()
            writer.join()
            os.write(2, b"NOISE the sink fails\\n")
            os.write(2, b"last, without its newline")
        after = os.fstat(2)
        os.write(2, b"\\nafter the block\\n")
        same = (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
        print(json.dumps({"said": said, "same_fd_2": same}))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"said": ["NOISE one\\n"], "same_fd_2": true}'
    assert done.stderr.splitlines() == [
        "first",
        "from another thread",
        "NOISE the sink fails",
        "last, without its newline",
        "after the block",
    ]


def test_a_block_that_raises_still_gives_fd_2_back_and_its_lines_come_before_the_traceback() -> None:
    done = run(
        """
        import os
        from providers.native_stderr import captured_stderr
        with captured_stderr(lambda line: line.startswith(b"NOISE")):
            os.write(2, b"NOISE dropped\\n")
            os.write(2, b"kept\\n")
            raise RuntimeError("the end")
        """
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[:2] == ["kept", "Traceback (most recent call last):"], lines
    assert lines[-1] == "RuntimeError: the end"
    assert "NOISE" not in done.stderr


def test_stderr_stays_a_terminal_through_the_probe_and_a_camera_open_at_debug() -> None:
    # The daemon in a terminal: its stderr is the terminal before, between and after the captures.
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    """
                    import logging, os, sys
                    import cv2
                    from agent.config import VideoSourceConfig
                    from agent.sources.frames import LatestFrameSlot
                    from agent.sources.video import VideoSource
                    from providers.tflite_backend import TfliteBackend
                    from tests.waits import free_port
                    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="LOG %(message)s")
                    said = [sys.stderr.isatty()]
                    said.append(TfliteBackend("cpu").probe().available)
                    said.append(sys.stderr.isatty())
                    uri = f"rtsp://127.0.0.1:{free_port()}/x"
                    source = VideoSource(VideoSourceConfig(type="video", uri=uri), "door", LatestFrameSlot())
                    capture = source._open_ffmpeg([cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 5000])
                    said += [capture.isOpened(), sys.stderr.isatty(), os.isatty(2)]
                    print(said)
                    """
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
    finally:
        os.close(follower)
    out, _ = process.communicate(timeout=120)
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # (EIO: the child closed its end)
            break
        if not chunk:
            break
        terminal += chunk
    os.close(leader)
    assert process.returncode == 0, terminal.decode(errors="replace")
    assert out.strip() == "[True, True, True, False, True, True]", terminal
    assert XNNPACK.encode() not in terminal
    assert b"LOG source door: FFmpeg: [tcp @ 0x" in terminal, terminal
