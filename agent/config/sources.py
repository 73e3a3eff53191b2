"""A pipeline's source: video, audio, MQTT sensor values, replayed recordings, a serial line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from agent.config.base import Secret, StrictModel, check_login, login_schema, read_password

GST_PREFIX = "gst:"


def is_gst_pipeline(uri: str) -> bool:
    """A video uri that is a GStreamer pipeline (agent/sources/gstreamer.py): `gst:...`, or any text
    with GStreamer's `!` link between elements. Here, without GStreamer's imports, for desired state."""
    return uri.startswith(GST_PREFIX) or " ! " in uri


def is_live_video(uri: str) -> bool:
    """A video uri that is a camera (V4L2 index or device, RTSP/HTTP stream, GStreamer pipeline), not a
    file or a folder of images: it delivers at its own pace, and the motion gate is on by default."""
    return is_gst_pipeline(uri) or "://" in uri or uri.isdigit() or uri.startswith("/dev/video")


def _non_blank_uri(value: str) -> str:
    if not value.strip():
        raise ValueError("uri must not be empty")
    return value


NON_BLANK = r"\S"  # JSON Schema: some text that is not only spaces (`_non_blank_uri`)
SourceUri = Annotated[
    str, AfterValidator(_non_blank_uri), WithJsonSchema({"type": "string", "pattern": NON_BLANK})
]


MAX_FPS = 1000.0  # the highest frame rate a video source takes: its fps cap, and a file's own rate


class VideoSourceConfig(StrictModel):
    type: Literal["video"]
    uri: SourceUri = Field(
        # `_uri_as_text` takes a V4L2 index written as a number (uri: 0) too.
        json_schema_extra=lambda schema: schema.update(type=["string", "integer"], pattern=NON_BLANK),
        description="A video file, a folder of images (played in name order), a V4L2 device index (0) "
        "or /dev/videoN, an rtsp://, http(s):// URL (HTTP: MJPEG or any stream FFmpeg reads), or a "
        "GStreamer pipeline (gst:ELEMENT ! ... ; a trailing appsink is replaced), e.g. a Jetson CSI camera.",
    )
    fps: float | None = Field(
        None,
        gt=0,
        le=MAX_FPS,
        description=f"Cap on frames handed to the model (up to {MAX_FPS:g} a second). A video file plays at "
        f"its own frame rate (up to {MAX_FPS:g}; 25 when it gives none or a higher one), a folder of images "
        "at this rate (default 1), or as fast as the box decodes them where that is slower.",
    )
    loop: bool = Field(False, description="Start again at the end (video files and image folders).")
    realtime: bool = Field(
        True,
        description="Video files and image folders: play at their own rate, as a camera would (a slower "
        "model misses frames); false: every frame (the fps cap keeps) goes to the model, as fast as it "
        "takes them, decoded just ahead of it (a recording analysed: nothing dropped, nothing decoded "
        "in vain).",
    )
    reopen_min_s: float = Field(1.0, gt=0, description="First retry delay when the source fails.")
    reopen_max_s: float = Field(30.0, gt=0, description="Cap of the retry delay (doubles each failure).")

    @field_validator("uri", mode="before")
    @classmethod
    def _uri_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _realtime_off_only_for_files(self) -> VideoSourceConfig:
        uri = self.uri
        if not self.realtime and is_live_video(uri):
            raise ValueError(
                f"realtime: false is for video files and image folders; {uri!r} is a live source, "
                "which delivers at its own pace"
            )
        return self


class AudioSourceConfig(StrictModel):
    """Audio cut into windows for the model: a WAV file, or live capture from an ALSA device."""

    type: Literal["audio"]
    uri: SourceUri = Field(
        description="A WAV file (PCM 8/16/24/32-bit, any rate, mono or the first channel), resampled to "
        "sample_rate; or alsa:DEVICE for live capture (alsa:default, alsa:plughw:1,0; `arecord -L` lists "
        "them), recorded at sample_rate, mono."
    )
    sample_rate: int = Field(16000, ge=1000, le=192_000, description="The rate the model wants.")
    window: int = Field(512, ge=1, le=1_000_000, description="Samples per window (at sample_rate).")
    hop: int | None = Field(None, ge=1, description="Samples between window starts; default: window.")
    realtime: bool = Field(True, description="Play a file at its recorded pace, as a microphone would.")
    loop: bool = Field(False, description="Start again at the end of a file.")
    max_queue: int = Field(
        1000, ge=1, le=1_000_000, description="Windows held for a busy model; beyond, the oldest are dropped."
    )
    reopen_min_s: float = Field(1.0, gt=0, description="First retry delay when the source fails.")
    reopen_max_s: float = Field(30.0, gt=0, description="Cap of the retry delay.")


class MqttSourceConfig(StrictModel):
    """Sensor values from MQTT messages, cut into windows for the model."""

    model_config = ConfigDict(json_schema_extra=login_schema)

    type: Literal["mqtt"]
    topic: str = Field(min_length=1, description="Subscription filter, e.g. plant/line-3/vibration/#.")
    host: str | None = Field(
        None,
        min_length=1,
        description="The sensors' broker; default: the agent's own (mqtt: host, port, login and TLS).",
    )
    port: int = Field(1883, ge=1, le=65535, description="With host.")
    username: str | None = Field(None, description="With host: the login on the sensors' broker.")
    password: Secret | None = Field(
        None, description="With username: its password; never shown in logs, status or dumps."
    )
    password_file: Path | None = Field(
        None, description="With username: a file holding its password (first line; read at connect)."
    )
    field: str | None = Field(
        None,
        description="Dotted path to the value(s) in a JSON payload, e.g. accel.x; default: the payload is a "
        "number, a JSON array of numbers, or numbers separated by commas or spaces.",
    )
    window: int = Field(1, ge=1, le=1_000_000, description="Values per model run.")
    hop: int | None = Field(None, ge=1, description="Values between window starts; default: window.")
    max_queue: int = Field(
        1000, ge=1, le=1_000_000, description="Windows held for a busy model; beyond, the oldest are dropped."
    )
    reopen_min_s: float = Field(1.0, gt=0, description="First reconnect delay.")
    reopen_max_s: float = Field(30.0, gt=0, description="Cap of the reconnect delay.")

    @model_validator(mode="after")
    def _check(self) -> MqttSourceConfig:
        check_login(self.username, self.password, self.password_file)
        return self

    def login_password(self) -> str | None:
        """The password to log in with (password_file read now); ConfigError if it cannot be read."""
        return read_password(self.password, self.password_file, "source.password_file")


class ReplaySourceConfig(StrictModel):
    """Recorded sensor values replayed from a .csv or .jsonl file, cut into windows."""

    type: Literal["replay"]
    uri: str = Field(min_length=1, description="A .csv file (with a header row) or a .jsonl file.")
    field: str | None = Field(
        None,
        description="CSV: the column; JSON Lines: a dotted path. Default: the first numeric column; each "
        "line's number(s).",
    )
    time_field: str | None = Field(
        None, description="Column or path with each row's time in seconds: replay at the recorded pace."
    )
    rate: float | None = Field(
        None, gt=0, le=1_000_000, description="Rows per second without time_field; default: as fast as taken."
    )
    window: int = Field(1, ge=1, le=1_000_000, description="Values per model run.")
    hop: int | None = Field(None, ge=1, description="Values between window starts; default: window.")
    max_queue: int = Field(1000, ge=1, le=1_000_000, description="Windows read ahead of the model.")
    loop: bool = Field(False, description="Start again at the end.")
    reopen_min_s: float = Field(1.0, gt=0, description="First retry delay when the file cannot be read.")
    reopen_max_s: float = Field(30.0, gt=0, description="Cap of the retry delay.")


class SerialSourceConfig(StrictModel):
    """Sensor readings from a serial line, one per text line, cut into windows."""

    type: Literal["serial"]
    uri: str = Field(min_length=1, description="The port, e.g. /dev/ttyUSB0 or /dev/serial/by-id/...")
    baud: int = Field(9600, ge=50, le=4_000_000, description="Line speed (8N1, raw).")
    field: str | None = Field(
        None, description="Dotted path in a JSON line; default: each line is number(s)."
    )
    window: int = Field(1, ge=1, le=1_000_000, description="Values per model run.")
    hop: int | None = Field(None, ge=1, description="Values between window starts; default: window.")
    max_queue: int = Field(
        1000, ge=1, le=1_000_000, description="Windows held for a busy model; beyond, the oldest are dropped."
    )
    reopen_min_s: float = Field(1.0, gt=0, description="First retry delay when the port fails.")
    reopen_max_s: float = Field(30.0, gt=0, description="Cap of the retry delay.")


SourceConfig = Annotated[
    VideoSourceConfig | AudioSourceConfig | MqttSourceConfig | ReplaySourceConfig | SerialSourceConfig,
    Field(discriminator="type"),
]
