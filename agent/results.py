"""A result's one path: the pipeline builds a `Result` once, `ResultWriter` turns it into the message
the fleet reads and writes it to the outbox, and the publisher stamps its send time.

    Pipeline._report ─ Result ─> ResultWriter.submit ─ message (id, device, seq, times) ─> Outbox
    Outbox ─> mqtt publisher ─ stamp_published_at (wired by the daemon) ─> broker

The message is complete in the outbox except for `published_at`, which only the send can know: it
is stored as a placeholder whose bytes the publisher swaps for the send time. Nothing under
agent/mqtt/ knows this module; the daemon hands `stamp_published_at` to the connection.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.clock import iso_utc
from agent.errors import ModelError
from agent.mqtt import Outbox, OutboxMessage, results_topic
from agent.mqtt.outbox import OutboxFull

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What one frame of a pipeline became, as the pipeline knows it (no ids, no send times)."""

    pipeline: str
    captured_at: float  # the frame's capture time (epoch seconds)
    model: Mapping[str, Any]  # name, version, sha256
    backend: str  # as it was at the run (a switch may follow before the result is made)
    precision: str
    latency_ms: Mapping[str, float]  # preprocess, inference, postprocess, capture_to_result
    source: Mapping[str, Any]  # uri, frame, position_s, frames_dropped, outages, last_outage_s
    output: Mapping[str, Any]  # the postprocessed output
    held_back: int  # results the report rules held back since the last one published

    def fields(self) -> dict[str, Any]:
        """The message's own fields, in the order published (the sink adds id, device, seq, times)."""
        return {
            "model": self.model,
            "backend": self.backend,
            "precision": self.precision,
            "latency_ms": self.latency_ms,
            "source": self.source,
            "output": self.output,
            "held_back": self.held_back,
        }


# Results are serialised with this placeholder; the publisher swaps in the real send time.
# JSON escapes quotes inside strings, so these exact bytes can only be our key.
_PUBLISHED_AT_PLACEHOLDER = b'"published_at":null'


def stamp_published_at(message: OutboxMessage) -> bytes:
    """The payload as sent: `published_at` set to now (results only; other messages unchanged)."""
    stamp = b'"published_at":"' + iso_utc(time.time()).encode() + b'"'
    return message.payload.replace(_PUBLISHED_AT_PLACEHOLDER, stamp, 1)


# A published result's pipeline, its `output` and the capture time of its frame.
ResultObserver = Callable[[str, Mapping[str, Any], float], None]


class ResultWriter:
    """The pipelines' sink: completes each result as a message and writes it to the outbox.

    `device_id`, `topic_prefix` and `max_payload_bytes` may change on a reload (`configure`)."""

    def __init__(
        self,
        device_id: str,
        topic_prefix: str,
        max_payload_bytes: int,
        outbox: Outbox,
        on_written: Callable[[], None],
        observer: ResultObserver | None = None,
    ) -> None:
        self.configure(device_id, topic_prefix, max_payload_bytes)
        self.outbox = outbox
        self.on_written = on_written
        self.observer = observer  # sees every result handed to the outbox (the state topics)

    def configure(self, device_id: str, topic_prefix: str, max_payload_bytes: int) -> None:
        self.device_id = device_id
        self.topic_prefix = topic_prefix
        self.max_payload_bytes = max_payload_bytes

    def submit(self, result: Result) -> None:
        pipeline, limit = result.pipeline, self.max_payload_bytes
        base = {"id": str(uuid.uuid4()), "device": self.device_id, "pipeline": pipeline}
        rest = {
            "captured_at": iso_utc(result.captured_at),
            "produced_at": iso_utc(time.time()),
            "published_at": None,  # set when sent: see stamp_published_at
            **result.fields(),
        }

        def payload(seq: int) -> bytes:
            # allow_nan=False: NaN is not JSON; a model emitting it fails the frame (counted), not the reader.
            data = json.dumps({**base, "seq": seq, **rest}, separators=(",", ":"), allow_nan=False).encode()
            if len(data) > limit:
                raise ModelError(
                    f"result of {len(data)} bytes is over mqtt.max_payload_bytes ({limit}); "
                    "lower postprocess.max_values or raise the limit"
                )
            return data

        topic = results_topic(self.topic_prefix, self.device_id, pipeline)
        try:
            # The sequence number is taken in the transaction that stores the result: a gap is a loss.
            self.outbox.put_numbered(topic, payload, qos=1, stream=f"results/{pipeline}")
        except OutboxFull:
            # when_full: drop-newest; counted per pipeline by the outbox (status, telemetry, log)
            written = False
        else:
            written = True
        if self.observer is not None:
            try:
                self.observer(pipeline, result.output or {}, result.captured_at)
            except Exception:  # the state topics must never cost a result
                log.exception("pipeline %s: the result observer failed", pipeline)
        if written:
            self.on_written()
