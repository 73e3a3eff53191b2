"""`config validate` and `doctor`: a pipeline's second models (`attributes:`) checked where the model
is at hand (agent/label_check.py finds it). An attribute's model is fed the crops of objects, one
picture at a time, through one 4-D input: a model whose input is no picture (a voice detector, a
scikit-learn table model) cannot read them; a classifier's labels must be as many as its output's
classes. Reads the graph's inputs and outputs only: nothing is loaded or run. The daemon's build
finds the same when it loads the model (agent/attribute_models.py `AttributeModel.of`) and serves the
pipeline on without that attribute; this says it before, at the config's file:line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent.config.analytics import Problems
from agent.config.processing import ClassificationPostprocess
from agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from agent.config import AttributeConfig
    from providers import ModelArtifact, TensorSpec


def attribute_model_problems(
    attribute: AttributeConfig, artifacts: Sequence[ModelArtifact], at: tuple[str | int, ...]
) -> Problems:
    """(key path, message) for what `attribute` (at `at` below the pipeline) gets wrong about its
    model's files: an input that is no picture (at .model), classification labels of another count
    than the output's classes (at .postprocess.labels). [] when they fit, or when no file's graph
    can be read here (the build says why)."""
    graph = _graph(artifacts)
    if graph is None:
        return []
    inputs, outputs = graph
    problems: Problems = []
    problem = not_an_image(attribute, inputs)
    if problem is not None:
        problems.append(((*at, "model"), problem))
    post = attribute.postprocess
    if isinstance(post, ClassificationPostprocess) and post.labels is not None:
        from agent.processing.postprocess import build_postprocessor

        try:
            build_postprocessor(post, outputs)
        except EdgeAgentError as exc:
            message = exc.message.removeprefix("postprocess.labels ")
            problems.append(((*at, "postprocess", "labels"), message))
    return problems


def not_an_image(attribute: AttributeConfig, inputs: list[TensorSpec]) -> str | None:
    """Why the input the crops would be fed to is no picture (N,C,H,W or N,H,W,C); None when it is
    one, or when the preprocess must first say which input (the build asks for preprocess.input)."""
    wanted = attribute.preprocess.input
    named = [spec for spec in inputs if spec.name == wanted] if wanted is not None else inputs
    if len(named) == 1 and len(named[0].shape) != 4:
        spec = named[0]
        return (
            f"the model's input {spec.name!r} {_shape(spec)} {spec.dtype} is not an image: an attribute's "
            "model reads the crops of objects, fed as one 4-D picture (N,C,H,W or N,H,W,C)"
        )
    if len(named) > 1 and not any(len(spec.shape) == 4 for spec in named):
        listed = ", ".join(f"{spec.name!r} {_shape(spec)}" for spec in named)
        return (
            f"none of the model's inputs ({listed}) is an image: an attribute's model reads the crops "
            "of objects, fed as one 4-D picture (N,C,H,W or N,H,W,C)"
        )
    return None


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in spec.shape) + "]"


def _graph(artifacts: Sequence[ModelArtifact]) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """The first readable model file's inputs and outputs, as a session would give them; None when
    no file is one this box can read without loading it."""
    from agent.model_formats import format_details
    from providers import TensorSpec

    readable = [a for a in artifacts if a.format in ("onnx", "tflite")]
    if not readable:
        return None
    try:
        details = format_details(readable[0], None)
    except EdgeAgentError:  # not a valid model file: the build says so
        return None

    def specs(rows: list[dict[str, Any]]) -> list[TensorSpec]:
        # (A shape None: no tensor, a scikit-learn model's map of probabilities, say.)
        return [TensorSpec(row["name"], tuple(row["shape"] or ()), row["dtype"]) for row in rows]

    return specs(details["inputs"]), specs(details["outputs"])
