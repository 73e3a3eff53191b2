"""What the daemon's end-to-end tests share (tests/test_daemon_e2e.py and ~20 others): the 6 s video of
text signs with its ground truth, a file registry with the text-direction model published through the
CLI, a classification pipeline over the video, and the agent config around them; reading results and
the outbox back. Registered in tests/conftest.py's pytest_plugins: `video` and `registry_dir` are
fixtures every test module can ask for (`video` is module-scoped, rendered once per test file)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agent_process import EDGE_AGENT
from tests.media_fixtures import demo_video_module

DEVICE = "e2e-box"
MODEL, VERSION = "text-direction", "2.0"
LABELS = ["upright", "upside-down"]
SECONDS_PER_SIGN = 1.0  # 6 signs: a 6 s video
FPS_CAP = 2.0  # one result per 0.5 s of video: exactly 12 for the whole file


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    path = tmp_path_factory.mktemp("media") / "signs.mp4"
    truth = demo_video_module().make_orientation_video(path, fps=10, seconds_per_sign=SECONDS_PER_SIGN)
    return path, truth


@pytest.fixture
def registry_dir(tmp_path: Path, cls_model_path: Path) -> Path:
    """A file registry with the model published through the CLI, as a user would."""
    root = tmp_path / "registry"
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(cls_model_path), "--name", MODEL, "--version", VERSION,
         "--registry", f"file://{root}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return root


def pipeline(
    name: str, uri: str, model: str = MODEL, version: str = VERSION, **source: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": model, "version": version},
        "source": {"type": "video", "uri": uri, "fps": FPS_CAP, **source},
        "preprocess": {
            "resize": {"width": 192, "height": 48},
            "color": "bgr",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
        },
        "postprocess": {"type": "classification", "softmax": False, "top_k": 2, "labels": LABELS},
    }


def write_config(
    tmp_path: Path,
    port: int,
    registry: Path,
    pipelines: list[dict[str, Any]],
    benchmark: bool = False,
    **mqtt: Any,
) -> Path:
    """Benchmarking is off unless a test is about backend selection: it adds seconds per start."""
    config = {
        "device": {"id": DEVICE, "groups": ["tests"]},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0, **mqtt},
        "registry": {"url": f"file://{registry}"},
        # Tests check the choice, not the speed: no minimum timing per candidate.
        "backends": {"benchmark": benchmark, "min_time_s": 0.0, "rounds": 3, "turn_s": 0.05},
        "pipelines": pipelines,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def results_of(messages: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in messages if "/results/" in m.topic]


def parse_time(text: str) -> datetime:
    assert text.endswith("Z") and "T" in text, text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def outbox_pending(state_dir: Path) -> int:
    path = state_dir / "outbox.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        # The file appears before the daemon has created its table: nothing is queued until then.
        table = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages'"
        if db.execute(table).fetchone() is None:
            return 0
        return int(db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
