"""Frames from several streams batched on one shared session, for real: the PP-OCR direction
classifier (dynamic batch axis) on onnxruntime, fed real rendered text from several threads at
once; each caller must get exactly its own answer, batched or not. The decision rules (not
batchable, not faster, other outputs, a model whose outputs are not per-frame) run on small real
ONNX models built here. Whether batching pays is measured, never asserted from timings: the
threshold is set to always / never to drive each branch (scripts/bench_batching.py measures)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent import batching
from agent.batching import BatchRunner
from agent.processing import Preprocessor
from agent.session_pool import SessionPool
from providers import ModelArtifact, Session, get_backend
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import CLS_PREPROCESS, demo_video_module, silero
from tests.store_fixtures import rapidocr_models_dir

ORT = "onnxruntime/CPUExecutionProvider"


def _cls_session() -> Session:
    path = rapidocr_models_dir() / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    return get_backend(ORT).load(ModelArtifact(path, "onnx", "ab" * 32))


def _sign_tensors(count: int) -> list[np.ndarray]:
    """Real rendered words, upright and upside down, as the classifier's preprocessing makes them."""
    render = demo_video_module().render_sign
    session = _cls_session()
    prepare = Preprocessor(CLS_PREPROCESS, session.inputs).prepare
    session.close()
    rng = np.random.default_rng(7)
    tensors = []
    for i in range(count):
        image = render(["EXIT", "DOCK 7", "LOT B", "GATE 12"][i % 4], bool(i % 2), rng)
        tensors.append(prepare(image)[0])
    return tensors


def _hammer(runner: BatchRunner | Session, tensors: list[np.ndarray], rounds: int) -> list[list[np.ndarray]]:
    """Each tensor's caller in its own thread, all at once, `rounds` times; their answers, per caller."""
    answers: list[list[np.ndarray]] = [[] for _ in tensors]
    errors: list[BaseException] = []
    start = threading.Barrier(len(tensors))

    def caller(i: int) -> None:
        try:
            start.wait(timeout=60)
            for _ in range(rounds):
                answers[i].append(next(iter(runner.run({"x": tensors[i]}).values())))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(tensors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert all(len(a) == rounds for a in answers)
    return answers


@pytest.mark.parametrize("min_speedup", [0.0, float("inf")], ids=["batching-on", "batching-off"])
def test_every_caller_gets_its_own_answer_batched_or_not(
    min_speedup: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "MIN_SPEEDUP", min_speedup)
    session = _cls_session()
    tensors = _sign_tensors(6)
    expected = [session.run({"x": t})["save_infer_model/scale_0.tmp_1"] for t in tensors]  # one by one
    assert [int(e.argmax()) for e in expected] == [0, 1, 0, 1, 0, 1]  # the classifier reads the signs
    runner = BatchRunner(session, "auto", max_batch=4)
    answers = _hammer(runner, tensors, rounds=40)
    for mine, reference in zip(answers, expected, strict=True):
        for answer in mine:
            assert answer.shape == (1, 2)
            np.testing.assert_allclose(answer, reference, rtol=1e-4, atol=1e-5)
    stats = runner.snapshot()
    if min_speedup == 0.0:
        assert stats["state"] == "on", stats
        assert stats["reason"].startswith("batches of up to 4 frames were")
        assert stats["batched_runs"] > 0 and 2 <= stats["largest_batch"] <= 4
    else:
        assert stats["state"] == "off" and "batching was not faster" in stats["reason"], stats
        _hammer(runner, tensors, rounds=10)  # decided: no batch runs together any more
        assert runner.snapshot()["batched_runs"] == stats["batched_runs"]
    assert stats["speedup"] > 0 and runner.stats.verified
    assert [runner.stats.timed[way][0] for way in ("together", "one_by_one")] == [batching.TRIAL_PHASES] * 2
    session.close()


def test_a_lone_caller_runs_at_once_and_is_never_batched() -> None:
    session = _cls_session()
    runner = BatchRunner(session, "auto")
    (tensor,) = _sign_tensors(1)
    for _ in range(20):
        runner.run({"x": tensor})
    stats = runner.snapshot()
    assert stats["state"] == "trial" and stats["batched_runs"] == 0 and stats["speedup"] is None
    session.close()


def test_frames_of_different_shapes_are_never_stacked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "MIN_SPEEDUP", 0.0)
    session = _cls_session()  # its width is dynamic too: 192 and 320 wide inputs both run
    narrow = _sign_tensors(2)
    wide = [np.ascontiguousarray(np.pad(t, ((0, 0), (0, 0), (0, 0), (0, 128)))) for t in narrow]
    expected = [next(iter(session.run({"x": t}).values())) for t in narrow + wide]
    answers = _hammer(BatchRunner(session, "auto"), narrow + wide, rounds=20)
    for mine, reference in zip(answers, expected, strict=True):
        for answer in mine:
            np.testing.assert_allclose(answer, reference, rtol=1e-4, atol=1e-5)
    session.close()


# --- the decision, on small real models ---------------------------------------------------------------


def _model(tmp_path: Path, name: str, nodes: list[onnx.NodeProto], out_shape: list[object]) -> Session:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return OnnxRuntimeBackend().load(ModelArtifact(path, "onnx", "cd" * 32))


def _two_callers(runner: BatchRunner, rounds: int = 10) -> None:
    """Two callers at once until the runner has decided (or `rounds` each)."""
    tensors = [np.full((1, 3), float(i + 1), np.float32) for i in range(3)]
    deadline = time.monotonic() + 120  # generous: a busy machine only makes it take longer
    while runner.snapshot()["state"] == "trial" and time.monotonic() < deadline:
        _hammer(runner, tensors, rounds=rounds)


def test_a_model_that_mixes_frames_of_a_batch_is_not_batched(tmp_path: Path) -> None:
    # y = x - mean over the batch: one frame's answer depends on the others in its batch.
    mixing = _model(
        tmp_path,
        "mixing",
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        ["batch", 3],
    )
    runner = BatchRunner(mixing, "auto")
    _two_callers(runner)
    stats = runner.snapshot()
    assert stats["state"] == "off" and "gives other outputs than one by one" in stats["reason"], stats
    assert stats["batched_runs"] == 0


def test_outputs_that_are_not_per_frame_turn_batching_off(tmp_path: Path) -> None:
    flat = _model(tmp_path, "flat", [helper.make_node("Flatten", ["x"], ["y"], axis=0)], [1, "n"])
    assert BatchRunner(flat, "auto").snapshot()["state"] == "off"  # its output's first axis is fixed
    reshaped = _model(
        tmp_path,
        "reshaped",
        [
            helper.make_node(
                "Constant", [], ["s"], value=helper.make_tensor("s", TensorProto.INT64, [1], [-1])
            ),
            helper.make_node("Reshape", ["x", "s"], ["y"]),
        ],
        ["n"],
    )
    runner = BatchRunner(reshaped, "auto")
    _two_callers(runner)
    stats = runner.snapshot()
    assert stats["state"] == "off", stats
    assert re.fullmatch(
        r"a batch of (\d) frames did not run: output 'y' has shape \[\d+\] for a batch of \1", stats["reason"]
    )


def test_models_without_a_batch_axis_and_the_off_switch(tmp_path: Path) -> None:
    vad = get_backend(ORT).load(ModelArtifact(silero("silero_vad.onnx"), "onnx", "ef" * 32))
    stats = BatchRunner(vad, "auto").snapshot()  # its state input is [2, batch, 128]
    assert stats["state"] == "off" and stats["reason"].startswith("not every input and output")
    assert BatchRunner(_cls_session(), "off").snapshot()["reason"] == "batching is off in the config"


def test_the_pool_reports_batching_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "MIN_SPEEDUP", 0.0)
    pool = SessionPool(max_batch=3)
    path = rapidocr_models_dir() / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    users = [pool.load(get_backend(ORT), ModelArtifact(path, "onnx", "ab" * 32)) for _ in range(3)]
    tensors = _sign_tensors(3)
    answers: list[list[np.ndarray]] = [[] for _ in users]
    barrier = threading.Barrier(3)

    def camera(i: int) -> None:
        barrier.wait(timeout=60)
        for _ in range(100):  # enough for the trial's ~100 frames, whatever the threads' timing
            answers[i].append(next(iter(users[i].run({"x": tensors[i]}).values())))

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    (entry,) = pool.stats()
    assert entry["users"] == 3 and entry["batching"]["state"] == "on", entry
    assert entry["batching"]["largest_batch"] <= 3
    assert [int(a[-1].argmax()) for a in answers] == [0, 1, 0]
    for user in users:
        user.close()
    assert pool.stats() == []


def test_a_pipeline_joining_measures_the_speed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "MIN_SPEEDUP", float("inf"))  # whatever it measures: not fast enough
    pool = SessionPool()
    path = rapidocr_models_dir() / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    artifact = ModelArtifact(path, "onnx", "ab" * 32)
    first, second = pool.load(get_backend(ORT), artifact), pool.load(get_backend(ORT), artifact)
    _hammer(first, _sign_tensors(4), rounds=60)  # four cameras' frames through one user's handle
    (entry,) = pool.stats()
    decided = entry["batching"]
    assert decided["state"] == "off" and "not faster" in decided["reason"], decided
    third = pool.load(get_backend(ORT), artifact)
    (entry,) = pool.stats()
    again = entry["batching"]
    assert again["state"] == "trial" and again["reason"] == "measuring again: another pipeline joined"
    assert again["batched_runs"] == decided["batched_runs"] and entry["users"] == 3  # counters carry on
    for user in (first, second, third):
        user.close()
