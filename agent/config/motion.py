"""A pipeline's motion gate (`motion:`): cheap motion detection on a small grey frame decides whether a
camera frame is worth the detector (agent/steps/motion.py, agent/processing/motion.py;
docs/analytics.md "Motion gate"). On by default for live cameras, off for files and non-video sources."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from agent.config.analytics import (
    MAX_PIXELS,
    MaskConfig,
    Units,
    area_fractions_only,
    area_problem,
)
from agent.config.base import StrictModel, problems_at


def motion_switch(value: object) -> object:
    """`motion: true` / `motion: false` as the mapping they are short for."""
    return {"enabled": value} if isinstance(value, bool) else value


def switch_schema(schema: dict[str, Any]) -> None:
    """JSON Schema: `motion:` takes true or false too (`motion_switch`)."""
    schema["anyOf"].insert(0, {"type": "boolean"})


class MotionMaskConfig(MaskConfig):
    """A polygon whose pixels never count as motion (a clock overlay, a tree in the wind, a road)."""


class MotionConfig(StrictModel):
    """The motion gate: a frame goes on to the model when something moved, while any track is alive,
    or once every keepalive_s on a static scene; the other frames are skipped (counted: frames_gated)."""

    model_config = ConfigDict(json_schema_extra=area_fractions_only("min_area"))

    enabled: bool = Field(True, description="Gate the frames (`motion: false` is short for false here).")
    method: Literal["average", "mog2"] = Field(
        "average",
        description="average: difference from a running average of the frame (cheapest; Frigate's); "
        "mog2: OpenCV's MOG2 background subtractor (copes better with waving leaves, costs more).",
    )
    frame_height: int = Field(
        120,
        ge=32,
        le=720,
        description="Rows of the downscaled grey frame motion is found on (its width follows the frame's "
        "aspect); more finds smaller motion and costs more.",
    )
    threshold: int = Field(
        25,
        ge=1,
        le=255,
        description="A pixel moved when it differs from the background by more than this (0..255 grey "
        "levels; average only: mog2 uses it as its variance threshold).",
    )
    units: Units = Field(
        "fraction",
        description="What min_area counts: fraction (the default): 0..1 of the frame's area, so it fits any "
        "resolution; pixels: square pixels of the source frame. (Each mask has its own units.)",
    )
    min_area: float = Field(
        0.0005,
        gt=0,
        le=MAX_PIXELS * MAX_PIXELS,
        description="The smallest blob of moving pixels that counts (after the dilation), in units.",
    )
    dilation: int = Field(
        2, ge=0, le=20, description="Dilations (3x3) of the moving pixels: joins the parts of one object."
    )
    learning_rate: float = Field(
        0.02,
        gt=0,
        le=1,
        description="How fast the background takes in a change (a parked car becomes background in about "
        "1/learning_rate frames).",
    )
    relearn_above: float = Field(
        0.7,
        gt=0,
        le=1,
        description="When more than this fraction of the (unmasked) frame changes at once, it is a global "
        "brightness jump (lights, the IR switch, lightning), not motion: the background is learnt again "
        "and the frame shows no motion.",
    )
    keepalive_s: float = Field(
        10.0,
        gt=0,
        le=86_400,
        description="On a static scene, still one frame to the model every this many seconds.",
    )
    masks: list[MotionMaskConfig] = Field(
        default_factory=list,
        max_length=100,
        description="Polygons whose pixels never count as motion (units: fraction or pixels, like zones).",
    )
    regions: bool = Field(
        False,
        description="Run the detector on crops around the motion at the model's input size instead of the "
        "whole frame letterboxed (small far objects are seen at full resolution).",
    )
    max_regions: int = Field(4, ge=1, le=32, description="At most this many regions a frame.")
    full_frame_above: float = Field(
        0.5,
        gt=0,
        le=1,
        description="When motion covers more than this fraction of the frame, the whole frame is used.",
    )

    @model_validator(mode="after")
    def _area_in_units(self) -> MotionConfig:
        need = area_problem("min_area", self.min_area, self.units)
        if need:
            raise problems_at("MotionConfig", [(("min_area",), need)])
        return self
