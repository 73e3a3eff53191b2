"""Several pipelines on one model share one loaded session: loaded once (session count, memory),
run in turn, closed when the last user lets go. Real models (PP-OCR) on real onnxruntime; the
daemon end to end with two cameras on one model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from agent.session_pool import SessionPool
from providers import ModelArtifact
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.agent_process import EDGE_AGENT, StartAgent, read_status
from tests.store_fixtures import rapidocr_models_dir

REPO = Path(__file__).resolve().parent.parent

# Measures, in a fresh process, how much resident memory two loads of the PP-OCR recogniser (10.8 MB
# of weights) take: through the pool ("shared") or as two sessions ("separate").
MEMORY_PROBE = """
import gc, sys, psutil
from providers import ModelArtifact
from providers.onnxruntime_backend import OnnxRuntimeBackend
from agent.session_pool import SessionPool
from tests.store_fixtures import rapidocr_models_dir
models = rapidocr_models_dir()
backend = OnnxRuntimeBackend()
# the runtime's own start-up memory first, outside the measurement
backend.load(ModelArtifact(models / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "onnx", "cd" * 32))
art = ModelArtifact(models / "ch_PP-OCRv4_rec_infer.onnx", "onnx", "ab" * 32)
gc.collect(); before = psutil.Process().memory_info().rss
if sys.argv[1] == "shared":
    pool = SessionPool(); kept = [pool.load(backend, art), pool.load(backend, art)]
else:
    kept = [backend.load(art), backend.load(art)]
gc.collect(); print((psutil.Process().memory_info().rss - before) / 2**20)
"""


def _grown_mb(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, mode], cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def _cls() -> ModelArtifact:
    return ModelArtifact(rapidocr_models_dir() / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "onnx", "ab" * 32)


def test_same_backend_and_artifact_share_one_session_until_the_last_user_goes() -> None:
    pool, backend = SessionPool(), OnnxRuntimeBackend()
    first, second = pool.load(backend, _cls()), pool.load(backend, _cls())
    threads = pool.load(backend, _cls(), {"intra_op_threads": 1})  # other options: another session
    assert sorted(s["users"] for s in pool.stats()) == [1, 2]
    assert first.backend == second.backend == "onnxruntime/CPUExecutionProvider"
    assert first.inputs == second.inputs and first.precision == "fp32"

    first.close()
    first.close()  # twice is once
    assert sorted(s["users"] for s in pool.stats()) == [1, 1]
    x = np.zeros((1, 3, 48, 192), np.float32)
    assert second.run({"x": x}).keys() == threads.run({"x": x}).keys()  # still loaded and running
    second.close()
    threads.close()
    assert pool.stats() == []


def test_a_shared_session_runs_its_users_in_turn_with_right_answers() -> None:
    pool, backend = SessionPool(), OnnxRuntimeBackend()
    users = [pool.load(backend, _cls()) for _ in range(3)]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 3, 48, 192)).astype(np.float32) for _ in users]
    alone = OnnxRuntimeBackend().load(_cls())
    expected = [next(iter(alone.run({"x": x}).values())) for x in inputs]
    wrong: list[int] = []

    def work(i: int) -> None:
        for _ in range(30):
            got = next(iter(users[i].run({"x": inputs[i]}).values()))
            if not np.allclose(got, expected[i], atol=1e-6):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(users))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads) and wrong == []
    for user in users:
        user.close()


def test_sharing_saves_the_memory_of_a_second_copy() -> None:
    shared = min(_grown_mb("shared") for _ in range(2))
    separate = min(_grown_mb("separate") for _ in range(2))
    # Measured here: about 27 MB for the shared pair, 42 MB for two separate sessions.
    assert separate - shared > 8, (shared, separate)


@pytest.mark.slow
def test_two_cameras_on_one_model_load_it_once_in_the_daemon(
    tmp_path: Path, cls_model_path: Path, start_agent: StartAgent
) -> None:
    from tests.media_fixtures import demo_video_module

    video = tmp_path / "signs.mp4"
    demo_video_module().make_orientation_video(video, fps=10, seconds_per_sign=0.5)
    registry = tmp_path / "registry"
    subprocess.run(
        [EDGE_AGENT, "registry", "publish", str(cls_model_path), "--name", "cls", "--version", "1",
         "--registry", f"file://{registry}"], check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    camera = {
        "model": {"name": "cls", "version": "1"},
        "preprocess": {"resize": {"width": 192, "height": 48}, "color": "bgr", "mean": [0.5], "std": [0.5]},
        "postprocess": {"type": "classification", "softmax": False},
    }
    config = {
        "device": {"id": "two-cams"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": "127.0.0.1", "port": 1, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "registry": {"url": f"file://{registry}"},
        "backends": {"benchmark": False},
        "pipelines": [
            {"name": f"door-{i}", "source": {"type": "video", "uri": str(video), "loop": True}, **camera}
            for i in (1, 2)
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    state_dir = tmp_path / "state"

    def both_delivered() -> bool:
        pipelines = read_status(state_dir).get("pipelines", {})
        return all(pipelines.get(f"door-{i}", {}).get("results", 0) > 0 for i in (1, 2))

    start_agent(path).run_until(both_delivered, "results from both cameras")
    status = read_status(state_dir)
    assert [s["users"] for s in status["sessions"]] == [2], status["sessions"]  # one session, two users
    batching = status["sessions"][0]["batching"]  # the cls model has a dynamic batch axis: it may batch
    assert batching["state"] in ("trial", "on", "off") and batching["reason"], batching
    assert "dynamic batch axis" not in batching["reason"] and "config" not in batching["reason"]
    for name in ("door-1", "door-2"):
        assert status["pipelines"][name]["results"] > 0, status["pipelines"][name]
