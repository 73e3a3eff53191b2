"""A pipeline's object filters and masks (`filters:`, docs/analytics.md "Object filters and masks"):
detections too small, too large, too unsure or of the wrong shape for their label are dropped after
postprocess, before tracking, as Frigate's `objects.filters` do; a mask drops an object whose anchor
point lies inside it (a clock overlay, a tree that sways). Areas are fractions of the frame's area
(the default, `units: fraction`) or square pixels (`units: pixels`), masks' points as zones' are.
The checks here need no frame; the pipeline checks the labels against its postprocess
(agent/config/pipeline.py) and the model's own (agent/model_labels.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from agent.config.analytics import (
    MAX_PIXELS,
    Label,
    MaskConfig,
    Problems,
    Units,
    area_fractions_only,
    area_problem,
    labels_field,
)
from agent.config.base import StrictModel, problems_at

# What a rule may drop an object for, in the order they are tried (an object dropped by one is counted
# under that one alone), and "mask" last.
RULES = ("min_score", "min_area", "max_area", "min_ratio", "max_ratio", "mask")
MAX_RATIO = 1000.0  # width / height: far beyond any real object's box


class ObjectRule(StrictModel):
    """What an object must be to be kept: each key unset keeps every object."""

    model_config = ConfigDict(json_schema_extra=area_fractions_only("min_area", "max_area"))

    units: Units = Field(
        "fraction",
        description="What min_area and max_area count: fraction (the default): 0..1 of the frame's area "
        "(width x height), so the rule fits any resolution; pixels: square pixels of the source image.",
    )
    min_score: float | None = Field(None, ge=0, le=1, description="Drop objects scored below this.")
    min_area: float | None = Field(
        None, ge=0, le=MAX_PIXELS * MAX_PIXELS, description="Drop objects whose box is smaller than this."
    )
    max_area: float | None = Field(
        None, gt=0, le=MAX_PIXELS * MAX_PIXELS, description="Drop objects whose box is larger than this."
    )
    min_ratio: float | None = Field(
        None,
        gt=0,
        le=MAX_RATIO,
        description="Drop objects whose box's width / height (in pixels) is below this: 0.5 is twice as "
        "tall as wide.",
    )
    max_ratio: float | None = Field(
        None, gt=0, le=MAX_RATIO, description="Drop objects whose box's width / height is above this."
    )

    @model_validator(mode="after")
    def _fits(self) -> ObjectRule:
        for key in ("min_area", "max_area"):
            problem = area_problem(key, getattr(self, key), self.units)
            if problem:
                raise ValueError(problem)
        for low, high in (("min_area", "max_area"), ("min_ratio", "max_ratio")):
            problem = _order_problem(self, low, self, high)
            if problem:
                raise ValueError(problem)
        return self

    def given(self) -> set[str]:
        """The rule's keys that are set (units aside)."""
        return {key for key in RULES[:-1] if getattr(self, key) is not None}


def _order_problem(
    lows: ObjectRule, low: str, highs: ObjectRule, high: str, names: tuple[str, str] | None = None
) -> str | None:
    """Why `low` (of `lows`) above `high` (of `highs`) keeps nothing, when both are in one unit;
    `names`: how the two keys are called in the message (default: their own names)."""
    a, b = getattr(lows, low), getattr(highs, high)
    if a is None or b is None or (low.endswith("area") and lows.units != highs.units) or a <= b:
        return None
    first, second = names or (low, high)
    return f"{first} ({a:g}) is above {second} ({b:g}): no object could be kept"


class ObjectMask(MaskConfig):
    """A polygon where objects are ignored: an object whose anchor point lies inside (or on its edge)
    is dropped."""

    labels: list[Label] | None = labels_field()
    anchor: Literal["bottom_center", "center"] = Field(
        "bottom_center",
        description="The point of a box that must be inside: bottom_center (where an object stands) or "
        "center.",
    )


class FiltersConfig(StrictModel):
    """Which detections a pipeline keeps: per-label rules over a default for every label, and masks.
    A label's rule overrides the default key by key (a key it leaves unset is the default's)."""

    default: ObjectRule = Field(
        default_factory=ObjectRule, description="The rule for every label (and for boxes without one)."
    )
    labels: dict[Label, ObjectRule] = Field(
        default_factory=dict,
        description="Rules for these labels (names from postprocess.labels, else the model's own), over "
        "the default.",
    )
    masks: list[ObjectMask] = Field(
        default_factory=list, description="Polygons where objects (of their labels, or all) are dropped."
    )

    @model_validator(mode="after")
    def _label_over_default(self) -> FiltersConfig:
        """A label's min above the default's max (or the default's min above the label's max) keeps
        nothing of that label: the two keys are named."""
        base = self.default
        for label, rule in self.labels.items():
            for low, high in (("min_area", "max_area"), ("min_ratio", "max_ratio")):
                problem, key = None, low
                if getattr(rule, high) is None:  # the default's max holds for this label
                    problem = _order_problem(rule, low, base, high, (low, f"default.{high}"))
                if getattr(rule, low) is None:  # the default's min holds for this label
                    problem, key = _order_problem(base, low, rule, high, (f"default.{low}", high)), high
                if problem:
                    raise problems_at("FiltersConfig", [(("labels", label, key), problem)])
        return self

    def label_keys(self) -> Iterator[tuple[tuple[str | int, ...], str]]:
        """(key path below `filters`, label) of every label the filters name: the rules' and masks'."""
        for label in self.labels:
            yield ("labels", label), label
        for i, mask in enumerate(self.masks):
            for j, label in enumerate(mask.labels or []):
                yield ("masks", i, "labels", j), label


def filter_label_problems(filters: FiltersConfig | None, labels: list[str] | None, boxes: bool) -> Problems:
    """(key path below the pipeline, message) for each label the filters name that the postprocess
    cannot give: `labels` the ones it declares (None: not known here), `boxes` whether its boxes
    carry labels at all (regions: False)."""
    if filters is None:
        return []
    problems: Problems = []
    for path, label in filters.label_keys():
        if not boxes:
            problems.append((("filters", *path), "a regions postprocess gives no labels to filter on"))
        elif labels is not None and label not in labels:
            problems.append((("filters", *path), _unknown(label, labels, "postprocess.labels")))
    return problems


def _unknown(label: str, labels: list[str], whose: str) -> str:
    import difflib

    close = difflib.get_close_matches(label, labels, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{label!r} is not one of {whose} ({', '.join(labels)}){hint}"


def filter_model_label_problems(filters: FiltersConfig | None, model_labels: list[str]) -> Problems:
    """The same against the model's own labels (a pipeline without postprocess.labels)."""
    if filters is None:
        return []
    return [
        (("filters", *path), _unknown(label, model_labels, "the model's labels"))
        for path, label in filters.label_keys()
        if label not in model_labels
    ]
