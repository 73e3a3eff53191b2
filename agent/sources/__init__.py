"""Sources yield timestamped frames: cameras keep only the newest one, audio and sensor windows
queue within a bound. `open_source` picks the source and its hand-over for a pipeline's config."""

from agent.config import (
    AudioSourceConfig,
    MqttSourceConfig,
    ReplaySourceConfig,
    SerialSourceConfig,
    SourceConfig,
    VideoSourceConfig,
)
from agent.sources.audio import ALSA_PREFIX, AudioSource, read_wav
from agent.sources.frames import Frame, FrameQueue, LatestFrameSlot
from agent.sources.replay import ReplaySource
from agent.sources.sensors import BrokerLink, MqttSource, parse_values
from agent.sources.serial import SerialSource
from agent.sources.uri import redact_uri
from agent.sources.video import VideoSource, source_kind

Source = VideoSource | AudioSource | MqttSource | ReplaySource | SerialSource
Slot = LatestFrameSlot | FrameQueue


def is_live(config: SourceConfig) -> bool:
    """Whether the source's data goes by whether or not it is read (sensors, capture, cameras and
    streams), so it is opened before the model is ready; files wait for the pipeline instead."""
    if isinstance(config, (MqttSourceConfig, SerialSourceConfig)):
        return True
    if isinstance(config, AudioSourceConfig):
        return config.uri.startswith(ALSA_PREFIX)
    if isinstance(config, VideoSourceConfig):
        return source_kind(config.uri) in ("url", "device", "gstreamer")
    return False


def open_source(config: SourceConfig, name: str, broker: BrokerLink | None = None) -> tuple[Source, Slot]:
    """The (not yet started) source for `config` and the slot it hands frames to; `broker` is the
    agent's own, for MQTT sources that name none."""
    if isinstance(config, AudioSourceConfig):
        queue = FrameQueue(config.max_queue)
        return AudioSource(config, name, queue), queue
    if isinstance(config, MqttSourceConfig):
        queue = FrameQueue(config.max_queue)
        return MqttSource(config, name, queue, broker), queue
    if isinstance(config, ReplaySourceConfig):
        queue = FrameQueue(config.max_queue)
        return ReplaySource(config, name, queue), queue
    if isinstance(config, SerialSourceConfig):
        queue = FrameQueue(config.max_queue)
        return SerialSource(config, name, queue), queue
    slot = LatestFrameSlot()
    return VideoSource(config, name, slot), slot


__all__ = [
    "AudioSource",
    "BrokerLink",
    "Frame",
    "FrameQueue",
    "LatestFrameSlot",
    "MqttSource",
    "ReplaySource",
    "SerialSource",
    "Slot",
    "Source",
    "VideoSource",
    "is_live",
    "open_source",
    "parse_values",
    "read_wav",
    "redact_uri",
]
