"""A pipeline: its model, backend choice, source, processing, what it reports and what it shows
Home Assistant."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from agent.config.analytics import LineConfig, TrackConfig, ZoneConfig, analytics_problems
from agent.config.attributes import AttributeConfig, attribute_problems
from agent.config.backends import BackendChoiceConfig
from agent.config.base import TOPIC_SPECIALS, Name, StrictModel, problems_at
from agent.config.clips import ClipsConfig
from agent.config.filters import FiltersConfig, filter_label_problems
from agent.config.motion import MotionConfig, motion_switch, switch_schema
from agent.config.processing import (
    AnyPreprocessConfig,
    AudioPreprocessConfig,
    ClassificationPostprocess,
    DetectionPostprocess,
    PostprocessConfig,
    PreprocessConfig,
    RawPostprocess,
    RegionsPostprocess,
    StateLink,
    gives_boxes,
)
from agent.config.registry import ModelRef
from agent.config.sources import SourceConfig, VideoSourceConfig, is_live_video

# A result's tags (report.tags): names a consumer can use as a key anywhere, short values.
TagName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
TagValue = Annotated[str, StringConstraints(max_length=200)]


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
    results: bool = Field(
        True,
        description="Publish per-frame results at all; false for a pipeline that only needs its events "
        "(tracking) and state topics.",
    )
    tags: dict[TagName, TagValue] = Field(
        default_factory=dict,
        max_length=20,
        description="Tags every published result carries as `tags` (e.g. {site: shop-3, door: front}): "
        "names of letters, digits, '_', '.', '-' (at most 64), values of at most 200 characters.",
    )


def check_watch_label(value: str) -> str:
    if not value.strip():
        raise ValueError("a watched label must not be empty")
    bad = [c for c in TOPIC_SPECIALS if c in value]
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
    filters: FiltersConfig | None = Field(
        None,
        description="Object filters and masks: which detections are dropped after postprocess, before "
        "tracking and the result (per label: area, score, width/height; masks). docs/analytics.md.",
    )
    zones: list[ZoneConfig] = Field(
        default_factory=list,
        description="Polygons objects are counted in (detection, regions and plugin postprocessors: "
        "docs/analytics.md).",
    )
    lines: list[LineConfig] = Field(
        default_factory=list,
        description="Lines objects are counted across, per direction (docs/analytics.md).",
    )
    track: TrackConfig | None = Field(
        None,
        description="Track objects across frames and publish events (docs/analytics.md); on with its "
        "defaults when zones or lines are given.",
    )
    attributes: list[AttributeConfig] = Field(
        default_factory=list,
        max_length=8,
        description="Second models on the tracked objects (read a plate, classify, embed), run on their own "
        "thread after tracking; their answers go on the objects as attributes.<name> (docs/analytics.md). "
        "Turns tracking on with its defaults.",
    )

    clips: ClipsConfig = Field(
        default_factory=ClipsConfig,
        description="MP4 clips of the tracked objects' events, with a pre-roll (docs/analytics.md "
        '"Clips"); needs tracking on a video source.',
    )
    motion: Annotated[MotionConfig | None, BeforeValidator(motion_switch)] = Field(
        None,
        json_schema_extra=switch_schema,
        description="The motion gate (docs/analytics.md): true, false or its settings. Default: on for live "
        "cameras (V4L2, RTSP/HTTP streams, GStreamer), off for video files; video sources only.",
    )

    @property
    def motion_gate(self) -> MotionConfig | None:
        """The motion gate this pipeline runs (None: none): `motion`, or its defaults on a live camera."""
        if self.motion is None:
            live = isinstance(self.source, VideoSourceConfig) and is_live_video(self.source.uri)
            return MotionConfig() if live else None
        return self.motion if self.motion.enabled else None

    @property
    def models(self) -> list[ModelRef]:
        """Every model the pipeline runs: its own, then its attributes' (second models)."""
        return [self.model, *(attribute.model for attribute in self.attributes)]

    @property
    def tracking(self) -> TrackConfig | None:
        """The tracking this pipeline runs: `track`, or its defaults when zones, lines or attributes
        need it."""
        if self.track is not None or self.zones or self.lines or self.attributes:
            return self.track or TrackConfig()
        return None

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
    def _motion_needs_video(self) -> PipelineConfig:
        if self.motion is not None and self.motion.enabled and not isinstance(self.source, VideoSourceConfig):
            need = f"the motion gate needs pictures: a video source, not {self.source.type}"
            raise problems_at("PipelineConfig", [(("motion",), need)])
        gate = self.motion_gate
        if gate is not None and gate.regions and not isinstance(self.postprocess, DetectionPostprocess):
            # (the stage checks the model itself: agent/stage.py `_check_regions`)
            need = (
                "motion regions need postprocess type detection (the boxes of its crops are merged), "
                f"not {self.postprocess.type}"
            )
            raise problems_at("PipelineConfig", [(("motion", "regions"), need)])
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
        if (home.watch or home.image) and not self.report.results:
            key = "watch" if home.watch else "image"
            raise ValueError(
                f"home_automation.{key} follows the published results, and report.results is false: "
                "turn results on, or use the tracking pipeline's zone counts (docs/integrations.md)"
            )
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

    @model_validator(mode="after")
    def _zones_and_lines_fit(self) -> PipelineConfig:
        if not (self.zones or self.lines or self.track):
            return self
        post = self.postprocess
        if not gives_boxes(post):
            key = "zones" if self.zones else "lines" if self.lines else "track"
            what = "tracking needs" if key == "track" else "zones and lines need"
            need = f"{what} boxes: use a detection or regions postprocess, not {post.type}"
            raise problems_at("PipelineConfig", [((key,), need)])
        snapshots = self.track is not None and self.track.snapshots.enabled
        if snapshots and not isinstance(self.source, VideoSourceConfig):
            need = f"snapshots need pictures: a video source, not {self.source.type}"
            raise problems_at("PipelineConfig", [(("track", "snapshots", "enabled"), need)])
        labels = post.labels if isinstance(post, DetectionPostprocess) else None
        problems = analytics_problems(
            self.zones,
            self.lines,
            labels,
            boxes=not isinstance(post, RegionsPostprocess),
            attributes=[attribute.name for attribute in self.attributes],
        )
        if problems:
            raise problems_at("PipelineConfig", problems)
        return self

    @model_validator(mode="after")
    def _clips_fit(self) -> PipelineConfig:
        if not self.clips.enabled:
            return self
        if not isinstance(self.source, VideoSourceConfig):
            need = f"clips need pictures: a video source, not {self.source.type}"
            raise problems_at("PipelineConfig", [(("clips", "enabled"), need)])
        if self.tracking is None:
            need = "clips follow tracked objects: turn tracking on (track: {}, or zones or lines)"
            raise problems_at("PipelineConfig", [(("clips", "enabled"), need)])
        return self

    @model_validator(mode="after")
    def _attributes_fit(self) -> PipelineConfig:
        if not self.attributes:
            return self
        post = self.postprocess
        if not gives_boxes(post) or not isinstance(self.source, VideoSourceConfig):
            need = "attributes read objects' crops: they need " + (
                f"boxes (a detection or regions postprocess, not {post.type})"
                if not gives_boxes(post)
                else f"pictures (a video source, not {self.source.type})"
            )
            raise problems_at("PipelineConfig", [(("attributes",), need)])
        labels = post.labels if isinstance(post, DetectionPostprocess) else None
        problems = attribute_problems(self.attributes, labels, boxes=not isinstance(post, RegionsPostprocess))
        if problems:
            raise problems_at("PipelineConfig", problems)
        return self

    @model_validator(mode="after")
    def _filters_fit(self) -> PipelineConfig:
        if self.filters is None:
            return self
        post = self.postprocess
        if not gives_boxes(post):
            need = f"object filters need boxes: use a detection or regions postprocess, not {post.type}"
            raise problems_at("PipelineConfig", [(("filters",), need)])
        labels = post.labels if isinstance(post, DetectionPostprocess) else None
        problems = filter_label_problems(self.filters, labels, boxes=not isinstance(post, RegionsPostprocess))
        if problems:
            raise problems_at("PipelineConfig", problems)
        return self
