"""providers/native_stderr.py: a real LiteRT interpreter's stderr noise is dropped, the rest kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_the_xnnpack_line_is_dropped_and_other_native_output_kept() -> None:
    done = run(
        """
        import os
        from providers.tflite_backend import _RUNTIME_NOISE, _check_interpreter, _runtime
        from providers.native_stderr import filtered_stderr
        _check_interpreter(_runtime().module)  # allocates tensors: the runtime prints its INFO line
        with filtered_stderr(_RUNTIME_NOISE):
            os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\\n")
            os.write(2, b"ERROR: a real problem from native code\\n")
        print("done")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert "XNNPACK" not in done.stderr
    assert done.stderr.splitlines() == ["ERROR: a real problem from native code"]


def test_without_the_filter_the_runtime_does_print_it() -> None:
    # The premise: LiteRT prints the line on its own, once per process (else the filter above
    # proves nothing).
    done = run(
        """
        from ai_edge_litert.interpreter import Interpreter  # not through _runtime(): it filters
        from providers.tflite_backend import tiny_model
        interpreter = Interpreter(model_content=tiny_model(), num_threads=1)
        interpreter.allocate_tensors()
        """
    )
    assert "Created TensorFlow Lite XNNPACK delegate for CPU." in done.stderr
