"""agent/results.py ResultWriter: what a result message looks like on its way into the outbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.config_loader import parse_config
from agent.errors import ConfigError, ModelError
from agent.mqtt import Outbox
from agent.results import Result, ResultWriter, stamp_published_at


def _writer(tmp_path: Path, max_payload_bytes: int = 262_144) -> tuple[ResultWriter, Outbox, list[int]]:
    config = AgentConfig.model_validate(
        {
            "device": {"id": "box-7"},
            "mqtt": {"max_payload_bytes": max_payload_bytes},
            "state_dir": str(tmp_path),
        }
    )
    outbox = Outbox(tmp_path / "outbox.sqlite")
    written: list[int] = []
    mqtt = config.mqtt
    writer = ResultWriter(
        config.device.id, mqtt.topic_prefix, mqtt.max_payload_bytes, outbox, lambda: written.append(1)
    )
    return writer, outbox, written


def _result(pipeline: str, output: dict[str, Any] | None = None) -> Result:
    return Result(
        pipeline=pipeline,
        captured_at=1_763_800_000.25,
        model={"name": "m", "version": "1", "sha256": "0" * 64},
        backend="onnxruntime:CPUExecutionProvider",
        precision="fp32",
        latency_ms={"inference": 1.0},
        source={"uri": "file:clip.mp4", "frame": 1},
        output={"top": []} if output is None else output,
        held_back=0,
    )


def test_results_get_id_seq_and_times_and_published_at_is_stamped_at_send(tmp_path: Path) -> None:
    writer, outbox, written = _writer(tmp_path)
    writer.submit(_result("door"))
    writer.submit(_result("door"))
    writer.submit(_result("yard"))
    rows = outbox.peek(10)
    assert [r.topic for r in rows] == ["edge/box-7/results/door"] * 2 + ["edge/box-7/results/yard"]
    stored = [json.loads(r.payload) for r in rows]
    assert [(m["pipeline"], m["seq"]) for m in stored] == [("door", 1), ("door", 2), ("yard", 1)]
    assert len({m["id"] for m in stored}) == 3
    assert stored[0]["captured_at"] == "2025-11-22T08:26:40.250Z"
    assert all(m["published_at"] is None for m in stored)  # not sent yet
    sent = json.loads(stamp_published_at(rows[0]))
    assert sent["published_at"].endswith("Z") and sent["published_at"] >= sent["produced_at"]
    assert {k: v for k, v in sent.items() if k != "published_at"} == {
        k: v for k, v in stored[0].items() if k != "published_at"
    }
    assert written == [1, 1, 1]
    outbox.close()


def test_a_label_that_looks_like_the_placeholder_is_left_alone(tmp_path: Path) -> None:
    writer, outbox, _ = _writer(tmp_path)
    writer.submit(_result("door", output={"top": [{"label": '"published_at":null'}]}))
    sent = json.loads(stamp_published_at(outbox.peek(1)[0]))
    assert sent["output"]["top"][0]["label"] == '"published_at":null'
    assert sent["published_at"] is not None
    outbox.close()


def test_a_result_over_max_payload_bytes_is_refused_before_the_outbox(tmp_path: Path) -> None:
    writer, outbox, written = _writer(tmp_path, max_payload_bytes=1024)
    with pytest.raises(
        ModelError, match=r"over mqtt.max_payload_bytes \(1024\); lower postprocess.max_values"
    ):
        writer.submit(_result("raw", output={"values": list(range(1000))}))
    assert outbox.pending() == 0 and written == []
    outbox.close()


def test_nan_never_reaches_the_outbox(tmp_path: Path) -> None:
    writer, outbox, _ = _writer(tmp_path)
    with pytest.raises(ValueError, match="not JSON compliant"):
        writer.submit(_result("raw", output={"score": float("nan")}))
    assert outbox.pending() == 0
    outbox.close()


def test_device_id_groups_is_reserved() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("device:\n  id: groups\n", source="agent.yaml")
    assert caught.value.problems == [
        "agent.yaml:2: device.id: 'groups' is reserved: <prefix>/groups/... carries fleet group topics"
    ]


def test_line_counts_are_one_mapping_per_pipeline_kept_across_its_rebuilds(tmp_path: Path) -> None:
    """The writer outlives a rebuilt pipeline: the counts its scenes add to are the same mapping."""
    writer, _, _ = _writer(tmp_path)
    counts = writer.line_counts("door")
    counts.setdefault("gate", {})["in"] = 3
    assert writer.line_counts("door") is counts and writer.line_counts("door") == {"gate": {"in": 3}}
    assert writer.line_counts("shop") == {}
