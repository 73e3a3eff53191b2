"""scripts/install.sh --with web (run for real into a temporary root, as tests/test_install.py does):
the page's stack, the `web` extra (Starlette, uvicorn), is among the dependencies it installs, read
from the installed agent's metadata even when run from a directory holding another's (a checkout's
stale edge_agent.egg-info)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_install import PYTHON, SCRIPT, TIMEOUT_S, install, make_root, wheel, workdir  # noqa: F401

pytestmark = [pytest.mark.slow]


def test_with_web_installs_the_web_extra(workdir: Path, wheel: Path) -> None:  # noqa: F811
    root = make_root(workdir / "root-web")
    # Run from a directory with another agent's metadata (an old checkout's): it must not be read.
    elsewhere = workdir / "old-checkout"
    (elsewhere / "edge_agent.egg-info").mkdir(parents=True)
    (elsewhere / "edge_agent.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: edge-agent\nVersion: 0.0.1\n"
    )
    (elsewhere / "edge_agent.egg-info" / "requires.txt").write_text("numpy\n")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--no-deps", "--python", PYTHON,
         "--from", str(wheel), "--with", "web", "--no-enable"],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=elsewhere,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "extras: web" in done.stdout
    deps = re.search(r"they would be: (.*)", done.stdout)  # (--no-deps: what pip would have installed)
    assert deps is not None, done.stdout
    names = [re.split(r"[<>=!~\[]", req)[0] for req in deps.group(1).split()]
    assert "starlette" in names and "uvicorn" in names and "onnxruntime" in names, done.stdout
    refused = install(root, "--with", "webb", check=False)
    assert refused.returncode != 0 and "one of openvino, tflite, tflite-legacy, gpu, web" in refused.stderr
