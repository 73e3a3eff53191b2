"""`config validate` and `doctor`: each pipeline's labels against its model's own
(agent/model_labels.py), a ctc postprocess's characters against its model's output width, and
each attribute's model against what it is fed (agent/attribute_check.py), where the model is at
hand on this box (a model file, or a version installed in the local store).
Reads metadata and the graph's outputs only: nothing is loaded, run, pulled or written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.attribute_check import attribute_model_problems
from agent.config.analytics import Problems
from agent.config.processing import CtcPostprocess
from agent.errors import EdgeAgentError
from agent.model_hints import embedded_hints
from agent.model_labels import fix_hint, label_problems, located, own_labels, uses_model_labels

if TYPE_CHECKING:
    from agent.config import AgentConfig, ModelRef, PipelineConfig
    from agent.registry.manifest import Manifest
    from providers import ModelArtifact

ModelAtHand = tuple["Manifest | None", "list[ModelArtifact]"]


@dataclass
class LabelCheck:
    """`check_config`'s answer: problems (located, as the config's errors are) and, per pipeline
    whose labels could not be checked, why."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


def check_config(config: AgentConfig, pipelines: Sequence[PipelineConfig] | None = None) -> LabelCheck:
    """Every pipeline (or those given) that names labels, against its model where the model is at
    hand: a model file (`model.path`), or a version installed in the local store; and every ctc
    postprocess's characters (a pipeline's, an attribute's) against its model's output. Reads the
    model's metadata and graph only (nothing is loaded, run, pulled or written)."""
    check = LabelCheck()
    for pipeline in config.pipelines if pipelines is None else pipelines:
        # Text recognizers' characters against their models' outputs: the pipeline's, its attributes'.
        readers = [((), pipeline.model, pipeline.postprocess)] + [
            (("attributes", i), attribute.model, attribute.postprocess)
            for i, attribute in enumerate(pipeline.attributes)
        ]
        for at, model, post in readers:
            if not isinstance(post, CtcPostprocess):
                continue
            found = model_at_hand(config, model)
            if not isinstance(found, str):  # a model not at hand is checked when the agent has it
                check.problems += located(pipeline, character_problems(post, found, at))
        # Each second model's graph: it is fed crops (an image input), a classifier's labels fit it.
        for i, attribute in enumerate(pipeline.attributes):
            found = model_at_hand(config, attribute.model)
            if not isinstance(found, str):
                check.problems += located(
                    pipeline, attribute_model_problems(attribute, found[1], ("attributes", i))
                )
        if isinstance(pipeline.postprocess, CtcPostprocess):  # characters, no labels
            continue
        # A pipeline's own postprocess.labels are checked by its validator; against the model
        # only their count, which no note is worth when the model is not at hand.
        relies = uses_model_labels(pipeline)
        if not (relies or getattr(pipeline.postprocess, "labels", None) is not None):
            continue
        found = model_at_hand(config, pipeline.model)
        labels = None if isinstance(found, str) else own_labels(found[0], embedded_hints(found[1]))
        if relies and isinstance(found, str):
            check.unchecked.append(
                f"pipelines[{pipeline.name}]: labels not checked against the model: {found}"
            )
        elif relies and labels is None:
            check.unchecked.append(
                f"pipelines[{pipeline.name}]: labels not checked: the model names no labels of its "
                "own, so its detections have none to match; write postprocess.labels"
            )
        if labels is None:
            continue
        problems = label_problems(pipeline, labels[0])
        if problems:
            check.problems += located(pipeline, problems)
            check.hints.append(fix_hint(pipeline, labels[1]))
    return check


def character_problems(post: CtcPostprocess, model: ModelAtHand, at: tuple[str | int, ...] = ()) -> Problems:
    """(key path, message) when a ctc postprocess's characters (its own, else the model's, as the
    hints fill them) and its blank are not the classes of the model's output; the path is `at` +
    postprocess.characters (or .blank) where the config writes them, else `at` + postprocess. []
    when they fit, or when the file does not fix the output's width."""
    from agent.model_formats import format_details
    from agent.processing.postprocess import ctc_class_problem

    manifest, artifacts = model
    characters, source = post.characters, ""
    listed = manifest.metadata.get("characters") if manifest is not None else None
    if characters is None and manifest is not None and isinstance(listed, list):
        characters, source = listed, f"{manifest.ref}'s manifest"  # as with_model_hints fills them
    elif characters is None:
        characters, source = embedded_hints(artifacts).get("characters"), "the model file's own metadata"
    readable = [a for a in artifacts if a.format in ("onnx", "tflite")]
    if characters is None or not readable:  # no list: the build says so; no graph to read here
        return []
    try:
        outputs = format_details(readable[0], None)["outputs"]
    except EdgeAgentError:  # not a valid model file: the build says so
        return []
    output = next((o for o in outputs if o["name"] == (post.output or o["name"])), None)
    classes = output["shape"][-1] if output is not None and output["shape"] else None
    if not isinstance(classes, int):
        return []
    assert output is not None  # (it has a shape)
    found = ctc_class_problem(len(characters), post.blank, classes, output["name"])
    if found is None:
        return []
    key, message = found
    if source and key == "characters":
        return [((*at, "postprocess"), f"the characters in {source}: {message}")]
    return [((*at, "postprocess", key), message)]


def model_at_hand(config: AgentConfig, model: ModelRef) -> ModelAtHand | str:
    """A model as far as this box has it (its manifest, its files), else why not (also when the
    store or its trusted keys cannot be read)."""
    try:
        return _model_at_hand(config, model)
    except EdgeAgentError as exc:
        return exc.message
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"


def _model_at_hand(config: AgentConfig, model: ModelRef) -> ModelAtHand | str:
    from agent.registry.file_registry import SUFFIX_FORMATS
    from agent.store import store_for
    from providers import ModelArtifact

    if model.path is not None:
        if not model.path.is_file():
            return f"model file {model.path} does not exist"
        fmt = SUFFIX_FORMATS.get(model.path.suffix.lower())
        if fmt is None:
            return f"{model.path}: unknown model format {model.path.suffix!r}"
        # Metadata only: no digest needed (the store's import hashes it when the agent starts).
        return None, [ModelArtifact(model.path, fmt, "", name=model.path.name)]
    store = store_for(config)
    if not store.is_installed(model.name, model.version):
        return (
            f"{model.name}@{model.version} is not in the local store yet "
            "(edge-agent models pull -c CONFIG fetches it; the agent checks when it has it)"
        )
    installed = store.get(model.name, model.version)
    return installed.manifest, installed.model_artifacts()
