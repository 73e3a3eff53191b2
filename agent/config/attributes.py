"""A pipeline's second models (`attributes:`, docs/analytics.md "Attributes"): each entry runs a model
on the crops of the objects the pipeline tracks (read a plate, classify a sign's direction, embed a
face) and puts its answer on the object as `attributes.<name>`. The checks here need no model; the
pipeline checks the labels against its postprocess (agent/config/pipeline.py) and the model's own
(agent/model_labels.py), and the build checks the model (agent/attribute_models.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from agent.config.analytics import Label, Problems, label_problems, labels_field
from agent.config.base import Name, StrictModel
from agent.config.processing import PostprocessConfig, PreprocessConfig
from agent.config.registry import ModelRef

# What an attribute's model may answer: one value per crop. (Detections and regions would be objects
# inside objects; thresholds are for streams.)
ATTRIBUTE_POSTPROCESS = ("classification", "ctc", "embedding", "plugin")
ANGLES = (0, 90, 180, 270)  # what `rotate_by` turns a crop back by: a classifier's label in degrees


class AttributeCrop(StrictModel):
    """How an object's crop is cut from the frame for the attribute's model."""

    padding: float = Field(
        0.0,
        ge=0,
        le=2,
        description="Grow the box by this fraction of its height on every side before cutting (a text "
        "recognizer wants some margin around the letters; a detector's box is often tight).",
    )
    min_width: int = Field(8, ge=1, le=8192, description="Objects narrower than this (pixels) are not read.")
    min_height: int = Field(8, ge=1, le=8192, description="Objects lower than this (pixels) are not read.")
    whole_only: bool = Field(
        True,
        description="Read an object only once its box is clear of the frame's edge: a sign coming into the "
        "picture is read whole, not its first letters.",
    )
    align: bool = Field(
        True,
        description="Where the object comes with a polygon (a regions postprocess with polygons: true), cut "
        "the polygon turned level (text at an angle, as PP-OCR crops it) instead of the box.",
    )
    rotate_by: str | None = Field(
        None,
        description="An earlier attribute (a classifier) whose answer is an angle in degrees (0, 90, 180, "
        "270): the crop is turned back by it first (PP-OCR's direction classifier, then its recognizer).",
    )


class AttributeWhen(StrictModel):
    """When an object's crop is read: once it is tracked, then again only when worth it."""

    again_when_better: float | None = Field(
        1.5,
        gt=1,
        le=100,
        description="Read again when the object's picture is this much better than at the last reading "
        "(score x sqrt(area), as snapshots judge them); null: never again for that reason.",
    )
    size_factor: float | None = Field(
        None,
        gt=1,
        le=100,
        description="Read again when the box's area changed by this factor since the last reading (a car "
        "driving up to the camera); null: not for that reason.",
    )
    interval_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="Read again every this many seconds while the object is tracked (a worker who may put a "
        "helmet on); null: not on a clock.",
    )


class AttributeConfig(StrictModel):
    """One second model: what it runs on, how its crop is cut and fed, what its answer is, and when."""

    name: Name = Field(description="The attribute's name: objects carry its answer as attributes.<name>.")
    model: ModelRef
    labels: list[Label] | None = labels_field()
    crop: AttributeCrop = Field(default_factory=AttributeCrop)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    postprocess: PostprocessConfig = Field(
        description="classification (top-k with labels), ctc (text), embedding (a vector) or plugin."
    )
    when: AttributeWhen = Field(default_factory=AttributeWhen)
    min_score: float = Field(
        0.0,
        ge=0,
        le=1,
        description="An answer scored below this is not put on the object (a recognizer unsure of its text); "
        "the object is read again at its next chance.",
    )
    max_per_frame: int = Field(
        4,
        ge=1,
        le=64,
        description="Crops read per frame at most (batched where the model takes batches); the rest wait "
        "for later frames. The model runs on its own thread: the detector never waits for it.",
    )

    @model_validator(mode="after")
    def _answers_one_value(self) -> AttributeConfig:
        if self.postprocess.type not in ATTRIBUTE_POSTPROCESS:
            raise ValueError(
                "an attribute's postprocess gives one answer per object: "
                f"{', '.join(ATTRIBUTE_POSTPROCESS)}, not {self.postprocess.type}"
            )
        return self


def attribute_problems(attributes: list[AttributeConfig], labels: list[str] | None, boxes: bool) -> Problems:
    """(key path below the pipeline, message) for what a pipeline's attributes get wrong together or
    with its postprocess: `labels` its postprocess declares (None: not known), `boxes` whether its
    boxes carry labels (detection, plugin) or not (regions)."""
    problems: Problems = []
    seen: dict[str, int] = {}
    for i, attribute in enumerate(attributes):
        if attribute.name in seen:
            taken = f"{attribute.name!r} is attributes[{seen[attribute.name]}]'s name"
            problems.append((("attributes", i, "name"), taken))
        problems += label_problems(("attributes", i), attribute.labels or [], labels, boxes)
        source = attribute.crop.rotate_by
        if source is not None:
            earlier = seen.get(source)
            if earlier is None:
                problems.append(
                    (
                        ("attributes", i, "crop", "rotate_by"),
                        f"{source!r} is not an attribute before this one: a crop is turned by an earlier "
                        "classifier's answer",
                    )
                )
            elif attributes[earlier].postprocess.type != "classification":
                problems.append(
                    (
                        ("attributes", i, "crop", "rotate_by"),
                        f"attributes[{earlier}] ({source!r}) is a {attributes[earlier].postprocess.type}; "
                        "turning a crop needs a classifier whose labels are angles",
                    )
                )
            else:
                angles = [str(a) for a in ANGLES]
                named = getattr(attributes[earlier].postprocess, "labels", None) or []
                odd = [label for label in named if label not in angles]
                if odd:
                    problems.append(
                        (
                            ("attributes", earlier, "postprocess", "labels"),
                            f"{odd[0]!r} is no angle: attributes[{i}] turns its crops by this classifier's "
                            f"answer, so its labels must be degrees ({', '.join(angles)})",
                        )
                    )
        seen.setdefault(attribute.name, i)
    return problems
