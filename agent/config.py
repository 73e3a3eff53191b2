"""agent.yaml -> typed, validated config objects.

Every model forbids unknown keys so a typo is an error, not a silently ignored setting.
Validators do no I/O: whether a file exists or a broker answers is checked when it is used,
so a config can be validated on a laptop for a box it will run on (password files too: they are
read when the connection is made, `read_password`).
Passwords are held as `SecretStr`: repr, logs and JSON dumps show `**********`, never the secret.
Loading (YAML with line numbers, ${ENV} interpolation, error formatting) lives in
`agent/config_loader.py`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    SecretStr,
    SerializationInfo,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from agent.errors import ConfigError

# Names end up in MQTT topics and file names: keep them to a safe alphabet.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):  # match() would let a trailing newline through ($)
        raise ValueError(
            f"{value!r} is not a valid name: use 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit (names become MQTT topic levels and file names)"
        )
    return value


Name = Annotated[str, AfterValidator(check_name), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]

# A JSON dump with this context key true writes secrets out (state the daemon keeps for itself,
# e.g. <state_dir>/pipelines.json); every other dump shows '**********'.
REVEAL_SECRETS = "reveal_secrets"


def _dump_secret(value: SecretStr, info: SerializationInfo) -> str:
    context = info.context
    if isinstance(context, dict) and context.get(REVEAL_SECRETS):
        return value.get_secret_value()
    return str(value)  # '**********'


Secret = Annotated[SecretStr, PlainSerializer(_dump_secret, when_used="json")]


def read_password(password: SecretStr | None, password_file: Path | None, key: str) -> str | None:
    """The password of a login: `password`, or the first line of `password_file` (read now, when the
    connection is made; a trailing newline is dropped). ConfigError naming `key` (the config key of
    the file, e.g. mqtt.password_file) when the file is missing, unreadable or empty."""
    if password_file is None:
        return None if password is None else password.get_secret_value()
    try:
        text = password_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [f"{key}: cannot read {password_file}: {exc.strerror or exc}"],
            hint=f"{key} must name a file the agent's user can read, holding the password",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{key}: {password_file} is not UTF-8 text"]) from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError([f"{key}: {password_file} is empty"], hint="write the password into it (one line)")
    return secret


# MQTT client identifiers: printable, none of MQTT's topic characters (some brokers and bridges
# build topics from them), and of a length brokers accept.
CLIENT_ID_MAX = 128
_CLIENT_ID_FORBIDDEN = "+#/"


def check_client_id(value: str) -> str:
    if not value:
        raise ValueError("must not be empty (leave it out for edge-agent-<device id>)")
    if len(value) > CLIENT_ID_MAX:
        raise ValueError(f"is {len(value)} characters long; at most {CLIENT_ID_MAX} are allowed")
    bad = sorted({c for c in value if c in _CLIENT_ID_FORBIDDEN or not c.isprintable()})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(f"{value!r} holds {shown}: a client id must be printable, without '+', '#' or '/'")
    return value


class StrictModel(BaseModel):
    # hide_input_in_errors: a ValidationError's text never quotes a value (a password, or a whole
    # section holding one); config_loader's messages quote only what is safe to.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class DeviceConfig(StrictModel):
    id: Name = Field(description="Unique id of this box; used in every MQTT topic.")
    groups: list[Name] = Field(default_factory=list, description="Fleet groups this box belongs to.")

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == "groups":
            raise ValueError("'groups' is reserved: <prefix>/groups/... carries fleet group topics")
        return value


class TlsConfig(StrictModel):
    ca_file: Path | None = Field(None, description="CA bundle that signed the broker's certificate.")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client private key (mutual TLS).")
    insecure: bool = Field(
        False,
        description="Skip checking that the broker's certificate names the host connected to (testing "
        "only: anyone holding a certificate from the CA could pose as the broker); the certificate is "
        "still checked against ca_file. A WARNING says so at each start.",
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")
        return self


class OutboxConfig(StrictModel):
    max_messages: int = Field(
        100_000,
        ge=100,
        description="Outbox capacity in messages; beyond it (or max_bytes) when_full applies.",
    )
    max_bytes: int = Field(
        268_435_456, ge=65_536, description="Outbox capacity in payload bytes (256 MiB by default)."
    )
    when_full: Literal["drop-oldest", "drop-newest", "wait"] = Field(
        "drop-oldest",
        description="When full: drop the oldest results, drop the new one, or wait (the pipelines stop "
        "taking frames, so cameras drop frames, counted, and nothing stored is lost). Drops are counted "
        "per pipeline.",
    )
    durability: Literal["crash-safe", "power-loss-safe"] = Field(
        "crash-safe",
        description="crash-safe: a stored result survives the process dying (SQLite WAL, synchronous "
        "NORMAL); power-loss-safe: also the box losing power (fsync), committing results together "
        "every commit_interval_ms, so at most that much is lost.",
    )
    commit_interval_ms: float = Field(
        50.0, ge=1, le=5000, description="power-loss-safe: how long results are grouped into one commit."
    )
    max_inflight: int = Field(20, ge=1, le=1000, description="Unacknowledged QoS 1 publishes at once.")
    backlog_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="While a backlog is queued (after an outage), the share of the in-flight window "
        "given to the oldest results; the rest carries the newest, so fresh results are not held behind "
        "the backlog. 1: strictly oldest first. Per pipeline, results then arrive out of order: order "
        "them by seq.",
    )
    flush_timeout_s: float = Field(
        10.0, ge=0, description="On shutdown, how long to keep delivering queued results."
    )
    resend_window_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="Results the broker acknowledged this recently are kept in memory and sent again "
        "when the broker comes back without this agent's session: it restarted without saving its "
        "state (e.g. killed), so it may have lost them before its subscribers had them. Duplicates "
        "are possible then (consumers de-duplicate by pipeline and seq); 0: off.",
    )
    resend_max_bytes: int = Field(
        8_388_608, ge=0, description="Memory for resend_window_s at most (8 MiB); the oldest go first."
    )


class MqttConfig(StrictModel):
    host: str = Field("127.0.0.1", min_length=1, description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1"] = Field("5", description="MQTT protocol version.")
    client_id: str | None = Field(
        None,
        description=f"Defaults to edge-agent-<device id>. Printable, 1-{CLIENT_ID_MAX} characters, "
        "without '+', '#' or '/'.",
    )
    topic_prefix: Name = Field("edge", description="First level of every topic.")
    keepalive_s: int = Field(30, ge=5, le=3600)
    username: str | None = Field(None, description="Broker login (with password or password_file).")
    password: Secret | None = Field(
        None, description="Broker password; never shown in logs, status or dumps. Prefer password_file."
    )
    password_file: Path | None = Field(
        None,
        description="File holding the broker password (its first line; read at connect), instead of "
        "password: keep it owner-readable only (0600 or 0640 root:edge-agent).",
    )
    tls: TlsConfig | None = Field(
        None,
        description="Enable TLS by giving this section: ca_file to verify the broker, cert_file and "
        "key_file for mutual TLS (docs/operations.md).",
    )
    max_payload_bytes: int = Field(
        262_144,
        ge=1024,
        le=268_435_455,
        description="Largest message sent; bigger results are refused and counted (brokers limit it too).",
    )
    session_expiry_s: int = Field(
        86_400,
        ge=0,
        le=4_294_967_295,
        description="Keep the MQTT session (subscriptions, QoS 1 messages queued for the agent) this long "
        "after the link drops (MQTT 5; 3.1.1 keeps it until the broker drops it); 0: a clean session.",
    )
    reconnect_min_s: float = Field(
        1.0,
        gt=0,
        description="First reconnect delay; doubles up to the max (a random half of it: jitter). While "
        "waiting the broker's port is probed each second: a broker that is back is reconnected to within "
        "a few seconds (a random spread of up to 3 s, so a fleet does not return at once).",
    )
    reconnect_max_s: float = Field(60.0, gt=0)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, value: object) -> object:
        # YAML reads `protocol: 5` as an int; `3.1.1` is already a string.
        return str(value) if isinstance(value, int) else value

    @field_validator("client_id")
    @classmethod
    def _valid_client_id(cls, value: str | None) -> str | None:
        return None if value is None else check_client_id(value)

    @model_validator(mode="after")
    def _check(self) -> MqttConfig:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        _check_login(self.username, self.password, self.password_file)
        return self

    def login_password(self) -> str | None:
        """The password to log in with (password_file read now); ConfigError if it cannot be read."""
        return read_password(self.password, self.password_file, "mqtt.password_file")


def _check_login(username: str | None, password: SecretStr | None, password_file: Path | None) -> None:
    if password is not None and password_file is not None:
        raise ValueError("give password or password_file, not both")
    if password is not None and username is None:
        raise ValueError("password given without username")
    if password_file is not None and username is None:
        raise ValueError("password_file given without username")


class RegistryConnection(StrictModel):
    """How to talk to an HTTP(S) registry (agent/registry/http_registry.py): auth, TLS, patience."""

    username: str | None = Field(None, description="Basic auth user (with password_file).")
    password_file: Path | None = Field(None, description="File holding the basic auth password.")
    token_file: Path | None = Field(None, description="File holding a bearer token.")
    ca_file: Path | None = Field(None, description="CA bundle that signed the registry's certificate.")
    connect_timeout_s: float = Field(10.0, gt=0, description="Connecting to the registry.")
    read_timeout_s: float = Field(30.0, gt=0, description="Longest silence while reading an answer.")
    retries: int = Field(4, ge=0, le=20, description="Tries after the first, for failures that may pass.")
    backoff_s: float = Field(
        0.5, gt=0, description="First wait before a retry; doubles up to backoff_max_s, with full jitter."
    )
    backoff_max_s: float = Field(30.0, gt=0, description="Longest wait between two tries.")
    redirect_hosts: list[str] = Field(
        default_factory=list,
        description="Other hosts redirects may lead to (e.g. a CDN); others are refused.",
    )

    @model_validator(mode="after")
    def _auth_is_one_kind(self) -> RegistryConnection:
        if self.password_file is not None and not self.username:
            raise ValueError("password_file needs username (basic auth)")
        if self.token_file is not None and (self.username or self.password_file):
            raise ValueError("token_file (bearer) and username/password_file (basic) exclude each other")
        return self


class TrustedKey(StrictModel):
    key: Path = Field(description="Ed25519 public key (PEM), as `edge-agent registry keygen` writes it.")
    models: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Model names this key may sign, as shell patterns (fnmatch): ['pp-ocr-*'].",
    )


class RegistryConfig(RegistryConnection):
    url: str = Field(
        description="Model registry: file:///srv/registry or https://models.example.com/registry."
    )
    trusted_keys: list[TrustedKey] = Field(
        default_factory=list,
        description="Keys that sign manifests. When any is listed, only manifests signed by a key "
        "trusted for that model are pulled and served.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not re.match(r"^(file|https?|oci)://", value):
            raise ValueError(
                "expected a file://, http://, https:// or oci:// registry URL, e.g. file:///srv/registry, "
                "https://models.example.com/registry or oci://registry.example.com/edge-models"
            )
        return value


LOCAL_VERSION = "local"  # the version of a model imported from a file on the box (model.path)


class ModelRef(StrictModel):
    name: Name = Field(description="Model name in the registry (with `path`: defaults to the file's name).")
    version: Name = Field(description=f"Model version (with `path`: {LOCAL_VERSION!r}).")
    digest: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="Pins the registry's manifest document (OCI: the image manifest's digest; "
        "file/HTTP: sha256 of manifest.json): a version whose manifest changed is refused.",
    )
    path: Path | None = Field(
        None,
        description="A model file on this box (.onnx, .tflite, OpenVINO .xml beside its .bin), used "
        "without a registry: imported into the store, hashed and verified on every start.",
    )

    @model_validator(mode="before")
    @classmethod
    def _local_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("path") in (None, ""):
            return data
        if data.get("version", LOCAL_VERSION) != LOCAL_VERSION or data.get("digest") is not None:
            key = "digest" if data.get("digest") is not None else "version"
            raise ValueError(f"{key} is for registry models; a model given by path has none")
        data = dict(data)
        if "name" not in data:  # the file's name, made a valid model name
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(data["path"])).stem).strip("-_.")[:64]
            data["name"] = stem or "model"
        data["version"] = LOCAL_VERSION
        return data

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(
                f"must be an absolute path (the daemon's working directory is /), got {str(value)!r}"
            )
        return value


GST_PREFIX = "gst:"


def is_gst_pipeline(uri: str) -> bool:
    """A video uri that is a GStreamer pipeline (agent/sources/gstreamer.py): `gst:...`, or any text
    with GStreamer's `!` link between elements. Here, without GStreamer's imports, for desired state."""
    return uri.startswith(GST_PREFIX) or " ! " in uri


def _non_blank_uri(value: str) -> str:
    if not value.strip():
        raise ValueError("uri must not be empty")
    return value


SourceUri = Annotated[str, AfterValidator(_non_blank_uri)]


MAX_FPS = 1000.0  # the highest frame rate a video source takes: its fps cap, and a file's own rate


class VideoSourceConfig(StrictModel):
    type: Literal["video"]
    uri: SourceUri = Field(
        description="A video file, a folder of images (played in name order), a V4L2 device index (0) "
        "or /dev/videoN, an rtsp://, http(s):// URL (HTTP: MJPEG or any stream FFmpeg reads), or a "
        "GStreamer pipeline (gst:ELEMENT ! ... ; a trailing appsink is replaced), e.g. a Jetson CSI camera."
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
        live = uri.startswith(GST_PREFIX) or "://" in uri or uri.isdigit() or uri.startswith("/dev/video")
        if not self.realtime and live:
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
        _check_login(self.username, self.password, self.password_file)
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


class ResizeConfig(StrictModel):
    width: int = Field(ge=1, le=8192)
    height: int = Field(ge=1, le=8192)
    mode: Literal["stretch", "letterbox", "crop"] = Field(
        "stretch",
        description="stretch: to width x height, aspect ratio lost; letterbox: fit inside, aspect kept, "
        "the rest padded (detectors); crop: fill, aspect kept, the overhang cut off (classifiers).",
    )
    anchor: Literal["center", "top-left"] = Field(
        "center", description="Where the image sits in a letterbox (or which part a crop keeps)."
    )
    pad: int = Field(114, ge=0, le=255, description="Letterbox fill value (Ultralytics pads with 114).")


class QuantizationConfig(StrictModel):
    """How a quantised integer input encodes real values: real = scale * (q - zero_point)."""

    scale: float = Field(gt=0)
    zero_point: int = Field(ge=-128, le=255)


class PreprocessConfig(StrictModel):
    input: str | None = Field(None, description="Model input to feed; defaults to the model's only input.")
    resize: ResizeConfig | None = Field(None, description="Defaults to the model's fixed input size.")
    color: Literal["rgb", "bgr", "gray"] = "rgb"
    scale: float = Field(1 / 255, description="Pixel values are multiplied by this first.")
    # One value applies to every channel, so the defaults fit gray as well as rgb/bgr.
    mean: list[float] = Field(default_factory=lambda: [0.0])
    std: list[float] = Field(default_factory=lambda: [1.0])
    layout: Literal["nchw", "nhwc"] = "nchw"
    dtype: Literal["float32", "float16", "uint8", "int8"] = "float32"
    quantization: QuantizationConfig | None = Field(
        None,
        description="Integer inputs: the values after scale/mean/std are quantised, q = round(x / scale + "
        "zero_point). Default: the model's own parameters (TFLite stores them); uint8 without any are raw "
        "pixels; int8 needs them.",
    )

    @model_validator(mode="after")
    def _check(self) -> PreprocessConfig:
        channels = 1 if self.color == "gray" else 3
        for key in ("mean", "std"):
            values = getattr(self, key)
            if len(values) not in (1, channels):
                raise ValueError(
                    f"{key} needs {'1 value' if channels == 1 else f'1 or {channels} values'} "
                    f"for color {self.color}, got {len(values)}"
                )
        if any(s == 0 for s in self.std):
            raise ValueError("std values must not be 0")
        return self


class AudioPreprocessConfig(StrictModel):
    """Windows of a 1-D signal (audio samples, sensor values) into the model's inputs: the values
    (with context from the previous window) and constant inputs (e.g. a sample-rate input)."""

    type: Literal["audio", "series"]
    input: str | None = Field(None, description="Input for the samples; default: the model's first input.")
    context: int = Field(
        0, ge=0, le=1_000_000, description="Samples of the previous window put before each window."
    )
    constants: dict[str, float] = Field(
        default_factory=dict, description="Inputs fed the same value every run, e.g. {sr: 16000}."
    )


def _preprocess_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "audio" if value.get("type") in ("audio", "series") else "image"
    return "audio" if isinstance(value, AudioPreprocessConfig) else "image"


AnyPreprocessConfig = Annotated[
    Annotated[PreprocessConfig, Tag("image")] | Annotated[AudioPreprocessConfig, Tag("audio")],
    Discriminator(_preprocess_kind),
]


class StateLink(StrictModel):
    """A recurrent model's state: `output` of one run is fed back as `input` on the next."""

    input: str
    output: str


class ClassificationPostprocess(StrictModel):
    type: Literal["classification"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    softmax: bool = Field(True, description="Apply softmax (turn off when the model outputs probabilities).")
    top_k: int = Field(1, ge=1, le=100)
    labels: list[str] | None = Field(None, description="Class names by index.")


class DetectionPostprocess(StrictModel):
    """Boxes from a YOLO-style detector, mapped back to source-image pixels."""

    type: Literal["detection"]
    format: Literal["yolov8", "yolov5", "ssd", "tensors"] = Field(
        "yolov8",
        description="yolov8: [1, 4+classes, boxes] (cx, cy, w, h, class scores); "
        "yolov5: [1, boxes, 5+classes] (cx, cy, w, h, objectness, class scores); "
        "ssd: [1, 1, boxes, 7] (image id, class, score, x1, y1, x2, y2 in 0..1; "
        "Caffe/OpenVINO DetectionOutput); tensors: separate outputs for boxes [1, N, 4], scores [1, N], "
        "classes [1, N] and a count [1] (TensorFlow Object Detection API, TFLite SSD post-processing).",
    )
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    boxes: str | None = Field(
        None, description="tensors: the boxes output; default: the output whose name has 'box' in it."
    )
    scores: str | None = Field(None, description="tensors: the scores output; default: named '*score*'.")
    classes: str | None = Field(
        None,
        description="tensors: the class ids output; default: named '*class*' or '*label*' (else class 0).",
    )
    count: str | None = Field(
        None, description="tensors: how many rows are valid; default: named 'num*' or '*count*' (else all)."
    )
    box_order: Literal["yxyx", "xyxy"] = Field(
        "yxyx", description="tensors: corner order in each box row (TensorFlow: ymin, xmin, ymax, xmax)."
    )
    normalized: bool = Field(True, description="tensors: box coordinates are in 0..1 of the model input.")
    score_threshold: float = Field(0.25, ge=0, le=1)
    iou_threshold: float = Field(0.45, ge=0, le=1, description="Non-maximum suppression, per class.")
    max_detections: int = Field(100, ge=1, le=10_000)
    labels: list[str] | None = Field(None, description="Class names by index.")


class RegionsPostprocess(StrictModel):
    """A probability map (segmentation, a text detector's map) -> regions with boxes in source pixels."""

    type: Literal["regions"]
    output: str | None = Field(None, description="Model output to read; defaults to the first.")
    threshold: float = Field(0.3, ge=0, le=1, description="Map values above this belong to a region.")
    min_area: int = Field(16, ge=1, description="Smaller regions (in map pixels) are noise.")
    min_score: float = Field(0.0, ge=0, le=1, description="Regions whose mean value is lower are dropped.")
    unclip_ratio: float = Field(
        0.0,
        ge=0,
        le=10,
        description="Grow each box by area x ratio / perimeter on every side: DB text detectors shrink "
        "their regions and want 1.5; 0 keeps the boxes as found.",
    )
    max_regions: int = Field(100, ge=1, le=10_000)


class ThresholdPostprocess(StrictModel):
    """One score per run (speech probability, anomaly score) -> active or not, with hysteresis, and
    the start/end events where that changes."""

    type: Literal["threshold"]
    output: str | None = Field(None, description="Model output to read (its first value); default: first.")
    on_score: float = Field(0.5, description="Becomes active when the score reaches this.")
    off_score: float | None = Field(
        None, description="Becomes inactive when the score falls below this; default on_score - 0.15."
    )

    @model_validator(mode="after")
    def _off_below_on(self) -> ThresholdPostprocess:
        if self.off_score is not None and self.off_score > self.on_score:
            raise ValueError(f"off_score ({self.off_score}) must not be above on_score ({self.on_score})")
        return self


class PluginPostprocess(StrictModel):
    """A postprocessor from an installed package, found by name in the `edge_agent.postprocessors`
    entry-point group (docs/plugins.md)."""

    type: Literal["plugin"]
    name: str = Field(min_length=1, description="The entry point's name.")
    options: dict[str, Any] = Field(default_factory=dict, description="Handed to the plugin's factory.")


class RawPostprocess(StrictModel):
    type: Literal["raw"]
    max_values: int = Field(1000, ge=1, le=1_000_000, description="Larger outputs are cut (and flagged).")


PostprocessConfig = Annotated[
    ClassificationPostprocess
    | DetectionPostprocess
    | RegionsPostprocess
    | ThresholdPostprocess
    | PluginPostprocess
    | RawPostprocess,
    Field(discriminator="type"),
]


class BackendChoiceConfig(StrictModel):
    """Which backends a pipeline may use; patterns are globs over backend names."""

    prefer: list[str] = Field(
        default_factory=list, description="Try these first, in this order, e.g. ['openvino/*']."
    )
    deny: list[str] = Field(default_factory=list, description="Never use these, e.g. ['tflite/*'].")
    fixed: str | None = Field(
        None, description="Use only this backend, e.g. onnxruntime/CPUExecutionProvider."
    )


class SelectionConfig(BackendChoiceConfig):
    """Agent-wide backend selection: policy, proof (benchmark + output check) and backend options."""

    benchmark: bool = Field(True, description="Prove the top candidates on a real sample before choosing.")
    max_trials: int = Field(3, ge=1, le=20, description="How many ranked candidates to benchmark.")
    warmup: int = Field(3, ge=1, le=1000)
    runs: int = Field(20, ge=1, le=100_000, description="At least this many timed runs per candidate ...")
    min_time_s: float = Field(1.0, ge=0, description="... and at least this long (stable medians).")
    budget_s: float = Field(5.0, gt=0, description="Timed runs stop after this long per candidate.")
    timeout_s: float = Field(
        180.0, gt=0, description="A candidate that takes longer (load+runs) is rejected."
    )
    sample_timeout_s: float = Field(15.0, gt=0, description="How long to wait for a sample from the source.")
    prove_in_background: bool = Field(
        True,
        description="A pipeline starting with no proven decision for its model serves on the CPU reference "
        "at once, and the candidates are proven beside it on its first frame (the winner takes over "
        "between two frames); off: it waits for the trials before its first result.",
    )
    spare_core: bool = Field(
        True,
        description="Time the CPU backends (onnxruntime CPU, OpenVINO CPU) with one core fewer too, and "
        "run a model that is at most 10% slower that way: the core left decodes, prepares and reports "
        "frames beside inference. Off, or a thread count in options: the runtime's own threads.",
    )
    match_iou: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Output check of detectors: a candidate's detections must match the reference's by class "
        "at this IoU (pipelines with a detection or classification postprocess are judged on their reports).",
    )
    rtol: float = Field(1e-2, ge=0, description="Output check: relative tolerance against the CPU reference.")
    atol: float = Field(1e-3, ge=0, description="Output check: absolute tolerance.")
    max_mismatch: float = Field(
        0.001, ge=0, le=1, description="Share of an output's values allowed outside the tolerance."
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Options per backend name, e.g. {'openvino/CPU': {'hint': 'throughput'}}; "
        "each backend checks its own keys when it loads.",
    )
    batching: Literal["auto", "off"] = Field(
        "auto",
        description="Pipelines that share a session (same model and backend): frames that arrive while "
        "it is busy run as one batch, when the model has a dynamic batch axis and the first batches "
        "prove it faster with the same outputs (auto); or always one by one (off).",
    )
    max_batch: int = Field(8, ge=2, le=256, description="Most frames in one batched run.")


class ReportConfig(StrictModel):
    """Which results are worth publishing: every one by default. A box on a thin uplink sends
    events, not a firehose. The rules apply in this order; a result one of them holds back is
    counted, not sent."""

    min_score: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Only results whose best score reaches this (classification: the top class; "
        "detection: at least one box).",
    )
    on_change: bool = Field(
        False,
        description="Only when the outcome differs from the last one published (classification: the top "
        "label; detection: the set of labels found, so 'nothing any more' is a change too).",
    )
    min_interval_s: float = Field(0.0, ge=0, description="At most one result per this many seconds.")
    every_n: int = Field(1, ge=1, description="Of the results the rules above let through, every Nth.")


# Characters a watched label cannot hold: it becomes an MQTT topic level of the state topics.
_TOPIC_SPECIALS = ("/", "+", "#", "\x00")
# Home Assistant's discovery topic allows only these in its object id (homeassistant/device/<id>/config).
HA_OBJECT_ID_PATTERN = r"^[A-Za-z0-9_-]+$"


def check_watch_label(value: str) -> str:
    if not value.strip():
        raise ValueError("a watched label must not be empty")
    bad = [c for c in _TOPIC_SPECIALS if c in value]
    if bad:
        raise ValueError(
            f"watched label {value!r} holds {', '.join(repr(c) for c in bad)}: labels become MQTT topic "
            "levels (state/<pipeline>/seen/<label>)"
        )
    return value


class HomeAutomationConfig(StrictModel):
    """What a pipeline shows on its state topics and in Home Assistant (docs/integrations.md): used when
    `state_topics` or `home_assistant` is enabled."""

    watch: list[Annotated[str, AfterValidator(check_watch_label)]] = Field(
        default_factory=list,
        description="Labels (classes) to watch: each gets an ON/OFF state (on while the last published "
        "result has it: classification's top label, any detection of it) and, for detection, a count; "
        "in Home Assistant a binary sensor and a count sensor.",
    )
    off_delay_s: float = Field(
        0.0,
        ge=0,
        le=86_400,
        description="A watched label's state turns OFF only once it has been missing this long (a person "
        "who turns away for a frame does not switch a light off).",
    )
    image: bool = Field(
        False,
        description="Detection pipelines on a video source: publish the last frame with its boxes drawn "
        "(JPEG, retained) on state/<pipeline>/image, at most every image_interval_s; in Home Assistant "
        "an image entity. Off by default: images are large.",
    )
    image_interval_s: float = Field(
        10.0, ge=1, le=86_400, description="At most one image per this many seconds."
    )

    @field_validator("watch")
    @classmethod
    def _unique(cls, labels: list[str]) -> list[str]:
        seen = [label for i, label in enumerate(labels) if label in labels[:i]]
        if seen:
            raise ValueError(f"label {seen[0]!r} is watched twice")
        return labels


class PipelineConfig(StrictModel):
    name: Name
    model: ModelRef
    backend: BackendChoiceConfig = Field(
        default_factory=BackendChoiceConfig, description="Adds to (and fixed overrides) the agent's backends."
    )
    source: SourceConfig
    preprocess: AnyPreprocessConfig = Field(default_factory=PreprocessConfig)
    postprocess: PostprocessConfig
    state: list[StateLink] = Field(
        default_factory=list,
        description="Recurrent state fed back run to run; reset when the stream restarts.",
    )
    report: ReportConfig = Field(default_factory=ReportConfig, description="Which results are published.")
    enabled: bool = True
    stall_s: float = Field(
        120.0,
        ge=1,
        le=86_400,
        description="A frame in the works longer than this is a hang (a stuck driver, a blocked call): "
        "the daemon stops its systemd watchdog pings, and systemd restarts it.",
    )
    home_automation: HomeAutomationConfig = Field(
        default_factory=HomeAutomationConfig,
        description="Watched labels, their off delay and the annotated image, for the state topics and "
        "Home Assistant (docs/integrations.md).",
    )

    @model_validator(mode="after")
    def _preprocess_fits_source(self) -> PipelineConfig:
        signal_source = not isinstance(self.source, VideoSourceConfig)
        kind = self.preprocess.type if isinstance(self.preprocess, AudioPreprocessConfig) else "image"
        if signal_source != isinstance(self.preprocess, AudioPreprocessConfig):
            raise ValueError(
                f"an {self.source.type} source needs preprocess.type: audio or series"
                if signal_source
                else f"preprocess.type: {kind} needs an audio, mqtt, replay or serial source"
            )
        return self

    @model_validator(mode="after")
    def _home_automation_fits(self) -> PipelineConfig:
        home = self.home_automation
        post = self.postprocess
        if home.watch and not isinstance(post, ClassificationPostprocess | DetectionPostprocess):
            raise ValueError(
                "home_automation.watch needs labels: use a classification or detection postprocess"
            )
        labels: list[str] = getattr(post, "labels", None) or []
        unknown = [label for label in home.watch if labels and label not in labels]
        if unknown:
            raise ValueError(
                f"home_automation.watch: {unknown[0]!r} is not one of postprocess.labels "
                f"({', '.join(labels)})"
            )
        if home.image and not (
            isinstance(post, DetectionPostprocess) and isinstance(self.source, VideoSourceConfig)
        ):
            raise ValueError("home_automation.image needs a detection postprocess on a video source")
        return self

    @model_validator(mode="after")
    def _report_needs_scores(self) -> PipelineConfig:
        if isinstance(self.postprocess, RawPostprocess):
            for key in ("min_score", "on_change"):
                if getattr(self.report, key) not in (None, False):
                    raise ValueError(
                        f"report.{key} needs scores and labels: use a classification or detection "
                        "postprocess (raw outputs have neither)"
                    )
        return self


class TelemetryConfig(StrictModel):
    """Periodic health on <prefix>/<device>/telemetry (QoS 0, not retained)."""

    interval_s: float = Field(
        60.0,
        ge=0,
        le=86_400,
        description="Seconds between reports; 0 turns telemetry off. While the broker is away reports are "
        "skipped (and counted), never queued: the next one says how things are; results keep the outbox.",
    )

    @field_validator("interval_s")
    @classmethod
    def _not_too_often(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError("must be 0 (off) or at least 1 second")
        return value


class StoreConfig(StrictModel):
    """What the local model store keeps (`edge-agent models gc` and the daemon after each pull).
    A version a configured pipeline names is never removed."""

    keep_versions: int = Field(
        3, ge=1, description="Versions kept per model, newest installed first (for instant rollback)."
    )
    max_bytes: int | None = Field(
        None, ge=0, description="Remove the oldest unused versions while the store holds more than this."
    )
    max_age_days: float | None = Field(
        None, gt=0, description="Remove unused versions installed longer ago than this."
    )


class HealthWindowConfig(StrictModel):
    """How a pipeline version that came over desired state proves itself before it is kept: over
    its first `window_s` of running, judged against these limits; failing them rolls it back."""

    window_s: float = Field(30.0, ge=1, le=3600, description="How long a new version is watched.")
    max_error_rate: float = Field(
        0.2, ge=0, le=1, description="Most failed frames / frames in the window before it is unhealthy."
    )
    min_frames: int = Field(
        3,
        ge=1,
        description="Frames the new version must process in the window, else it is unhealthy "
        "(a stage that never runs is not healthy).",
    )
    max_latency_ms: float | None = Field(
        None,
        gt=0,
        description="Most median inference time in the window (judged on 5 frames or more); None: no limit.",
    )
    max_latency_ratio: float = Field(
        3.0, gt=1, description="Most new median inference time over the previous version's."
    )
    nan_is_failure: bool = Field(True, description="A frame whose outputs hold NaN or inf counts as failed.")


class CommandsConfig(StrictModel):
    """Which commands on <prefix>/<device>/cmd/<name> this box answers (docs/fleet.md, Commands)."""

    enabled: bool = Field(True, description="Answer commands at all.")
    allow: list[str] | None = Field(None, description="Command names answered; None: every one.")
    deny: list[str] = Field(default_factory=list, description="Command names refused ('disallowed').")
    max_per_minute: int = Field(60, ge=1, description="More requests in a minute are refused ('busy').")


class FleetConfig(StrictModel):
    """Fleet updates over MQTT: desired state, health windows, commands (docs/fleet.md)."""

    enabled: bool = Field(True, description="Subscribe to desired state (this device's and its groups').")
    max_document_bytes: int = Field(
        65_536, ge=1024, le=1_048_576, description="Larger desired-state documents are refused unread."
    )
    health: HealthWindowConfig = Field(
        default_factory=HealthWindowConfig,
        description="The health window of pipelines whose document gives none.",
    )
    commands: CommandsConfig = Field(default_factory=CommandsConfig, description="Remote commands.")
    phase_timeout_s: float = Field(
        1800.0, ge=10, description="Deadline of each reconcile phase (pull, validate, build, health check)."
    )


def _check_topic_prefix(value: str) -> str:
    levels = value.split("/")
    if not value or any(not level for level in levels):
        raise ValueError(f"{value!r} is not a topic prefix: no empty levels (nor a leading or trailing '/')")
    bad = [c for c in _TOPIC_SPECIALS if c in value.replace("/", "")]
    if bad:
        raise ValueError(f"{value!r} holds {', '.join(repr(c) for c in bad)}: not allowed in a topic")
    return value


class StateTopicsConfig(StrictModel):
    """Retained per pipeline state on simple topics under <prefix>/<device>/state/<pipeline>/ (last
    label, counts, ON/OFF per watched label), published on change: Home Assistant sensors and Node-RED
    flows read them without templates (docs/integrations.md)."""

    enabled: bool = Field(False, description="Publish them (home_assistant.enabled turns them on too).")


class HomeAssistantConfig(StrictModel):
    """Home Assistant MQTT discovery: one device per box, entities per pipeline (docs/integrations.md)."""

    enabled: bool = Field(
        False,
        description="Publish the device discovery config (retained) and the state topics it names; "
        "turning it off removes the device from Home Assistant.",
    )
    discovery_prefix: Annotated[str, AfterValidator(_check_topic_prefix)] = Field(
        "homeassistant", description="Home Assistant's discovery prefix (its MQTT integration's setting)."
    )
    object_id: str | None = Field(
        None,
        pattern=HA_OBJECT_ID_PATTERN,
        description="The device's id in the discovery topic <discovery_prefix>/device/<object_id>/config: "
        "letters, digits, '_' and '-'. Default: device.id (which the broker ACL expects).",
    )
    device_name: str | None = Field(
        None, min_length=1, description="The device's name in Home Assistant; default: device.id."
    )
    support_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="Shown by Home Assistant as where to get help with this agent (origin support URL).",
    )


class AgentConfig(StrictModel):
    device: DeviceConfig
    state_dir: Path = Field(Path("/var/lib/edge-agent"), description="Model store, outbox and decisions.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text", description="text: plain lines (no time under journald); json: one JSON object per line."
    )
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    registry: RegistryConfig | None = Field(None, description="Where models are pulled from.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="What the model store keeps.")
    backends: SelectionConfig = Field(default_factory=SelectionConfig, description="Backend selection.")
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, description="Periodic health reports."
    )
    fleet: FleetConfig = Field(
        default_factory=FleetConfig, description="Fleet updates over MQTT (docs/fleet.md)."
    )
    state_topics: StateTopicsConfig = Field(
        default_factory=StateTopicsConfig,
        description="Retained per pipeline state on simple topics (docs/integrations.md).",
    )
    home_assistant: HomeAssistantConfig = Field(
        default_factory=HomeAssistantConfig,
        description="Home Assistant MQTT discovery (docs/integrations.md).",
    )
    pipelines: list[PipelineConfig] = Field(default_factory=list)

    @field_validator("pipelines")
    @classmethod
    def _unique_names(cls, pipelines: list[PipelineConfig]) -> list[PipelineConfig]:
        seen: set[str] = set()
        for pipeline in pipelines:
            if pipeline.name in seen:
                raise ValueError(f"pipeline name {pipeline.name!r} is used twice")
            seen.add(pipeline.name)
        return pipelines

    @model_validator(mode="after")
    def _check(self) -> AgentConfig:
        if self.registry is None and any(p.model.path is None for p in self.pipelines):
            raise ValueError("pipelines name registry models, so a registry is required (or give model.path)")
        ha = self.home_assistant
        if ha.enabled and ha.object_id is None and not re.fullmatch(HA_OBJECT_ID_PATTERN, self.device.id):
            raise ValueError(
                f"home_assistant: device.id {self.device.id!r} cannot be Home Assistant's object id "
                "(letters, digits, '_' and '-' only): set home_assistant.object_id"
            )
        return self

    @property
    def state_topics_on(self) -> bool:
        """The state topics are published: asked for, or needed by Home Assistant discovery."""
        return self.state_topics.enabled or self.home_assistant.enabled
