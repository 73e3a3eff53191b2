"""Sensor values over MQTT, for real: a real mosquitto on loopback, a publisher sending a fast stream
of numbers, the pipeline's MQTT source cutting them into windows for a real ONNX model. Nothing is
lost within the queue's bound, bad payloads are counted and named, and a broker restart is an
outage the source reports and recovers from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paho.mqtt.client as mqtt
import pytest
from onnx import TensorProto, helper

from agent.config import MqttSourceConfig, PipelineConfig
from agent.pipeline import Pipeline
from agent.sources import FrameQueue, MqttSource, parse_values
from agent.stage import LoadedModel
from providers import ModelArtifact
from providers.onnxruntime_backend import OnnxRuntimeBackend
from tests.media_fixtures import ListSink
from tests.mosquitto import Mosquitto, refusing_acl
from tests.waits import wait_until

WINDOW = 100


@pytest.mark.parametrize(
    ("payload", "field", "values"),
    [
        (b"3.5", None, [3.5]),
        (b" 1, 2;3 4 ", None, [1.0, 2.0, 3.0, 4.0]),
        (b"[1, 2.5, -3]", None, [1.0, 2.5, -3.0]),
        (b'{"accel": {"x": 0.25, "y": 1}}', "accel.x", [0.25]),
        (b'{"v": [7, 8, 9]}', "v.1", [8.0]),
        (b'{"v": [7, 8, 9]}', "v", [7.0, 8.0, 9.0]),
    ],
)
def test_payloads_that_are_numbers(payload: bytes, field: str | None, values: list[float]) -> None:
    assert parse_values(payload, field) == values


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        (b"\xff\xfe", None, "not UTF-8 text"),
        (b"   ", None, "empty payload"),
        (b"hello", None, "not a number, a JSON array of numbers or JSON: 'hello'"),
        (b"oops", "temp", "not JSON, so it has no field 'temp'"),
        (b'{"temp": 20}', "humidity", "no field 'humidity' (missing 'humidity')"),
        (b'{"a": {"b": 1}}', "a.c", "no field 'a.c' (missing 'c')"),
        (b'{"temp": "warm"}', "temp", "field 'temp' is not a number or a list of numbers"),
        (b"true", None, "payload is not a number or a list of numbers"),
        (b"[]", None, "payload is not a number or a list of numbers"),
        (b"NaN", None, "NaN or infinite value"),
    ],
)
def test_payloads_that_are_not(payload: bytes, field: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_values(payload, field)


@pytest.fixture
def publisher(mosquitto: Mosquitto) -> Iterator[mqtt.Client]:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sensor-publisher")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.reconnect_delay_set(1, 2)  # back soon after a broker restart, however long that took
    client.connect(mosquitto.host, mosquitto.port)
    client.loop_start()
    yield client
    client.disconnect()
    client.loop_stop()


def _config(mosquitto: Mosquitto, **settings: Any) -> MqttSourceConfig:
    values = {"type": "mqtt", "topic": "plant/+/vibration", "host": mosquitto.host, "port": mosquitto.port}
    return MqttSourceConfig.model_validate({**values, "window": WINDOW, "reopen_min_s": 0.2, **settings})


def _publish(client: mqtt.Client, values: list[float], topic: str = "plant/line-3/vibration") -> None:
    infos = [client.publish(topic, f"{v:.3f}", qos=1) for v in values]
    for info in infos:
        info.wait_for_publish(timeout=60)


def test_a_fast_stream_loses_nothing_within_the_bound(mosquitto: Mosquitto, publisher: mqtt.Client) -> None:
    queue = FrameQueue(1000)
    source = MqttSource(_config(mosquitto), "vibration", queue)
    source.start()
    try:
        # "streaming" once the broker has granted the subscription: nothing published from here is missed.
        assert wait_until(lambda: source.state == "streaming", timeout=30), source.stats()
        sent = list(np.round(np.sin(np.arange(5000) / 50.0), 3))
        _publish(publisher, sent)
        assert wait_until(lambda: source.stats().counters.windows == 50, timeout=120), source.stats()
    finally:
        source.stop()
    frames = []
    while (frame := queue.get(timeout=0.1)) is not None:
        frames.append(frame)
    assert [f.index for f in frames] == list(range(1, 51)) and queue.dropped == 0
    assert [f.gap for f in frames[:2]] == [True, False]
    received = np.concatenate([f.data for f in frames])
    assert np.allclose(received, sent, atol=1e-6)  # every value, in order
    assert source.stats().counters.messages == 5000 and source.stats().counters.bad_messages == 0


def _mean_model(path: Path) -> Path:
    """A real ONNX graph: the mean of a window of values ([1, N] -> [1, 1])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WINDOW])
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 1])
    node = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1)
    model = helper.make_model(
        helper.make_graph([node], "window-mean", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_pipeline_on_sensor_windows_counts_bad_messages_and_rides_out_a_broker_restart(
    tmp_path: Path, mosquitto: Mosquitto, publisher: mqtt.Client
) -> None:
    model = _mean_model(tmp_path / "mean.onnx")
    session = OnnxRuntimeBackend().load(ModelArtifact(model, "onnx", "0" * 64))
    config = PipelineConfig.model_validate(
        {
            "name": "vibration",
            "model": {"name": "window-mean", "version": "1"},
            "source": _config(mosquitto, field="rms").model_dump(),
            "preprocess": {"type": "series"},
            "postprocess": {"type": "raw"},
        }
    )
    sink = ListSink()
    pipeline = Pipeline(config, LoadedModel("window-mean", "1", "ab" * 32, session), sink)
    pipeline.warm_up()
    pipeline.start()
    try:
        assert wait_until(lambda: pipeline.source.state == "streaming", timeout=30)
        for info in [
            publisher.publish("plant/line-3/vibration", b'{"rms": 1.5}', qos=1),
            publisher.publish("plant/line-3/vibration", b"not json", qos=1),
            publisher.publish("plant/line-3/vibration", b'{"peak": 9}', qos=1),
        ]:
            info.wait_for_publish(timeout=60)
        _publish_json(publisher, [2.0] * (WINDOW - 1))  # with the 1.5: one full window
        assert wait_until(lambda: sink.count() == 1, timeout=60), pipeline.status()

        mosquitto.restart()  # the broker goes away and comes back on the same port
        assert wait_until(lambda: pipeline.source.stats().outages == 1, timeout=60), pipeline.status()
        assert wait_until(lambda: pipeline.source.state == "streaming", timeout=60)
        assert wait_until(publisher.is_connected, timeout=60)  # paho reconnects by itself
        _publish_json(publisher, [4.0] * WINDOW)
        assert wait_until(lambda: sink.count() == 2, timeout=60), pipeline.status()
    finally:
        pipeline.stop(timeout=30)
        session.close()

    first, second = (r for _, r in sink.results)
    assert first["output"]["outputs"]["mean"]["values"] == pytest.approx([(1.5 + 2.0 * 99) / 100])
    assert second["output"]["outputs"]["mean"]["values"] == pytest.approx([4.0])
    assert second["source"]["outages"] == 1 and second["source"]["last_outage_s"] > 0
    stats = pipeline.status().source
    assert stats.counters.bad_messages == 2 and stats.counters.messages == 3 + 99 + 100
    assert stats.counters.last_bad_message == "topic plant/line-3/vibration: no field 'rms' (missing 'rms')"


def _publish_json(client: mqtt.Client, values: list[float]) -> None:
    infos = [client.publish("plant/line-3/vibration", f'{{"rms": {v}}}', qos=1) for v in values]
    for info in infos:
        info.wait_for_publish(timeout=60)


def test_a_topic_the_broker_refuses_is_named_and_asked_for_again(tmp_path: Path) -> None:
    extra = refusing_acl(tmp_path / "acl", subscribe=["plant/line-3/#"], publish=["plant/#"])
    with Mosquitto(tmp_path / "broker", extra_config=extra) as broker:
        queue = FrameQueue(10)
        source = MqttSource(
            _config(broker, topic="plant/line-4/vibration", reopen_min_s=0.2, reopen_max_s=0.5),
            "line-4",
            queue,
        )
        source.start()
        try:
            assert wait_until(lambda: source.state == "retrying", "the refusal", timeout=30), source.stats()
            error = str(source.stats().error)
            assert "refused the subscription to plant/line-4/vibration" in error, error
            assert "check the broker's ACL" in error
            # It asks again (the ACL may be fixed): the broker sees more than one SUBSCRIBE.
            assert wait_until(
                lambda: broker.log_tail(400).count("plant/line-4/vibration (QoS 1)") >= 3,
                "asked again",
                timeout=30,
            )
            assert source.state == "retrying"
        finally:
            source.stop()
