"""Report rules: which results are worth publishing. The rules on their own (hand-made outputs with
known times), in a pipeline on a real video through the real classifier, and in the config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import (
    ClassificationPostprocess,
    ModelRef,
    PipelineConfig,
    ReportConfig,
    VideoSourceConfig,
)
from agent.config_loader import parse_config
from agent.errors import ConfigError
from agent.pipeline import Pipeline
from agent.rules import RULES, ReportRules, best_score, outcome
from agent.stage import LoadedModel
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import CLS_LABELS, CLS_PREPROCESS, ListSink, cls_artifact, demo_video_module
from tests.waits import wait_until


def _cls(label: str, score: float) -> dict[str, Any]:
    return {"top": [{"index": CLS_LABELS.index(label), "label": label, "score": score}]}


def _boxes(*found: tuple[str | None, float]) -> dict[str, Any]:
    return {
        "detections": [
            {"index": i, "label": label, "score": score, "box": [0, 0, 1, 1]}
            for i, (label, score) in enumerate(found)
        ]
    }


def _run(rules: ReportRules, outputs: list[dict[str, Any]], times: list[float]) -> list[int | None]:
    """For each output: the held-back count its publication carries, or None when held back."""
    published: list[int | None] = []
    for output, at in zip(outputs, times, strict=True):
        published.append(rules.take_held_count() if rules.check(output, at) is None else None)
    return published


def test_without_rules_every_result_is_published() -> None:
    rules = ReportRules(ReportConfig())
    outputs = [_cls("upright", 0.1)] * 5
    assert _run(rules, outputs, [0.0] * 5) == [0, 0, 0, 0, 0]
    assert rules.held_back == dict.fromkeys(RULES, 0)


def test_min_score_holds_back_unsure_results_and_the_next_one_says_how_many() -> None:
    rules = ReportRules(ReportConfig(min_score=0.8))
    scores = [0.9, 0.5, 0.79, 0.8, 0.2]
    published = _run(rules, [_cls("upright", s) for s in scores], [float(i) for i in range(5)])
    assert published == [0, None, None, 2, None]
    assert rules.held_back["min_score"] == 3 and rules.held_since_last == 1


def test_on_change_publishes_only_a_new_top_label() -> None:
    rules = ReportRules(ReportConfig(on_change=True))
    labels = ["upright", "upright", "upside-down", "upside-down", "upside-down", "upright"]
    published = _run(rules, [_cls(label, 0.9) for label in labels], [float(i) for i in range(6)])
    assert published == [0, None, 1, None, None, 2]
    assert rules.held_back["on_change"] == 3


def test_on_change_with_min_score_ignores_unsure_flips() -> None:
    rules = ReportRules(ReportConfig(on_change=True, min_score=0.7))
    outputs = [
        _cls("upright", 0.9),
        _cls("upside-down", 0.55),
        _cls("upright", 0.95),
        _cls("upside-down", 0.8),
    ]
    assert _run(rules, outputs, [0.0, 1.0, 2.0, 3.0]) == [0, None, None, 2]
    assert rules.held_back["min_score"] == 1 and rules.held_back["on_change"] == 1


def test_min_interval_holds_back_by_capture_time_and_a_held_change_comes_later() -> None:
    rules = ReportRules(ReportConfig(on_change=True, min_interval_s=5.0))
    labels = ["upright", "upside-down", "upside-down", "upside-down", "upright"]
    times = [0.0, 1.0, 4.9, 5.0, 6.0]
    # The change at 1 s is too soon; it is still new at 5 s (compared with what was published).
    assert _run(rules, [_cls(label, 0.9) for label in labels], times) == [0, None, None, 2, None]
    assert rules.held_back["min_interval_s"] == 3


def test_every_n_counts_only_what_the_other_rules_let_through() -> None:
    rules = ReportRules(ReportConfig(every_n=3, min_score=0.5))
    scores = [0.9, 0.1, 0.9, 0.9, 0.9, 0.1, 0.9, 0.9]
    published = _run(rules, [_cls("upright", s) for s in scores], [float(i) for i in range(8)])
    # Let through: results 0, 2, 3, 4, 6, 7; every 3rd of those (the 1st and the 4th) is published.
    assert published == [0, None, None, None, 3, None, None, None]
    assert rules.held_back["every_n"] == 4 and rules.held_back["min_score"] == 2


def test_detection_outcome_is_the_set_of_labels_and_nothing_any_more_is_a_change() -> None:
    rules = ReportRules(ReportConfig(on_change=True))
    outputs = [
        _boxes(("person", 0.9)),
        _boxes(("person", 0.7), ("person", 0.6)),  # still just people
        _boxes(("person", 0.8), ("car", 0.6)),  # a car came
        _boxes(("car", 0.6), ("person", 0.8)),  # same set, other order
        _boxes(),  # all clear
        _boxes(),
    ]
    assert _run(rules, outputs, [float(i) for i in range(6)]) == [0, None, 1, None, 1, None]
    assert outcome(_boxes((None, 0.9))) == ("0",)  # unlabelled: the class index
    assert best_score(_boxes()) == 0.0 and best_score(_boxes(("a", 0.3), ("b", 0.7))) == 0.7


def test_min_score_on_detections_needs_one_box_that_reaches_it() -> None:
    rules = ReportRules(ReportConfig(min_score=0.6, on_change=True))
    outputs = [
        _boxes(("car", 0.5)),
        _boxes(("car", 0.65), ("bike", 0.3)),
        _boxes(("car", 0.9), ("bike", 0.4)),
    ]
    # The bike stays under min_score: it does not make the outcome new.
    assert _run(rules, outputs, [0.0, 1.0, 2.0]) == [None, 1, None]


def _yaml(report: str, postprocess: str = "{type: raw}") -> str:
    return (
        "device: {id: a}\nregistry: {url: 'file:///r'}\npipelines:\n"
        "  - name: p\n    model: {name: m, version: '1'}\n    source: {type: video, uri: '0'}\n"
        f"    postprocess: {postprocess}\n    report: {report}\n"
    )


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ("{on_change: true}", "report.on_change needs scores and labels"),
        ("{min_score: 0.5}", "report.min_score needs scores and labels"),
        ("{every_n: 0}", "pipelines[0].report.every_n: Input should be greater than or equal to 1"),
        (
            "{min_interval_s: -1}",
            "pipelines[0].report.min_interval_s: Input should be greater than or equal to 0",
        ),
        ("{min_score: 2}", "pipelines[0].report.min_score: Input should be less than or equal to 1"),
        ("{on_chnage: true}", "pipelines[0].report.on_chnage: unknown key"),
    ],
)
def test_bad_report_settings_are_config_errors(report: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_yaml(report), environ={})
    assert message in str(caught.value), caught.value


def test_raw_output_with_interval_rules_is_fine() -> None:
    config = parse_config(_yaml("{min_interval_s: 2, every_n: 5}"), environ={})
    assert config.pipelines[0].report == ReportConfig(min_interval_s=2, every_n=5)


# --- in a pipeline: the real classifier on a real video ---------------------------------------------


@pytest.fixture(scope="module")
def loaded(cls_model_path: Path) -> Iterator[LoadedModel]:
    session = OnnxRuntimeBackend().load(cls_artifact(cls_model_path))
    yield LoadedModel(name="pp-ocr-cls", version="2.0", sha256="ab" * 32, session=session)
    session.close()


def _pipeline(video: Path, loaded: LoadedModel, report: ReportConfig, sink: ListSink) -> Pipeline:
    config = PipelineConfig(
        name="signs",
        model=ModelRef(name="pp-ocr-cls", version="2.0"),
        source=VideoSourceConfig(type="video", uri=str(video)),
        preprocess=CLS_PREPROCESS,
        postprocess=ClassificationPostprocess(
            type="classification", softmax=False, top_k=1, labels=CLS_LABELS
        ),
        report=report,
    )
    return Pipeline(config, loaded, sink)


def _play(pipeline: Pipeline) -> dict[str, Any]:
    """Run the pipeline over the whole video; its final status."""
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.finished, timeout=60, interval=0.05)
    finally:
        pipeline.stop(timeout=30)
    return pipeline.status()


def test_on_change_turns_a_video_of_signs_into_one_event_per_sign(
    short_video: tuple[Path, list[dict[str, object]]], loaded: LoadedModel
) -> None:
    path, truth = short_video
    sink = ListSink()
    pipeline = _pipeline(path, loaded, ReportConfig(on_change=True, min_score=0.9), sink)
    status = _play(pipeline)

    results = [r for _, r in sink.results]
    labels = [r["output"]["top"][0]["label"] for r in results]
    # Upright and upside-down signs alternate in runs: one event where the orientation changes.
    runs = [str(truth[0]["orientation"])]
    for entry in truth[1:]:
        if entry["orientation"] != runs[-1]:
            runs.append(str(entry["orientation"]))
    assert labels == runs, (labels, runs)
    for result in results:  # each event is right about the frame it came from
        shown = demo_video_module().truth_at(truth, result["source"]["position_s"])
        assert shown is not None and result["output"]["top"][0]["label"] == shown["orientation"]
    # Nothing lost silently: published + held back = every frame the model ran on.
    held = status.stage.held_back
    assert status.counts.results == len(results) and status.counts.inferences >= 20
    assert status.counts.results + sum(held.values()) == status.counts.inferences
    assert held["on_change"] > 0
    # Each published result carries the count held back before it; the rest came after the last.
    carried = sum(int(r["held_back"]) for r in results)
    assert carried + pipeline.stage.rules.held_since_last == sum(held.values())


def test_every_n_thins_the_stream_evenly(
    short_video: tuple[Path, list[dict[str, object]]], loaded: LoadedModel
) -> None:
    path, _ = short_video
    sink = ListSink()
    status = _play(_pipeline(path, loaded, ReportConfig(every_n=4), sink))
    results = [r for _, r in sink.results]
    inferences = int(status.counts.inferences)
    assert len(results) == (inferences + 3) // 4
    assert status.stage.held_back["every_n"] == inferences - len(results)
    assert results[0]["held_back"] == 0
    assert [r["held_back"] for r in results[1:]] == [3] * (len(results) - 1)
