"""`config validate` and `doctor`: each pipeline's labels against its model's own
(agent/model_labels.py), where the model is at hand on this box (a model file, or a version
installed in the local store). Reads metadata only: nothing is loaded, run, pulled or written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.errors import EdgeAgentError
from agent.model_hints import embedded_hints
from agent.model_labels import fix_hint, label_problems, located, own_labels, uses_model_labels

if TYPE_CHECKING:
    from agent.config import AgentConfig, PipelineConfig
    from agent.registry.manifest import Manifest
    from providers import ModelArtifact


@dataclass
class LabelCheck:
    """`check_config`'s answer: problems (located, as the config's errors are) and, per pipeline
    whose labels could not be checked, why."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


def check_config(config: AgentConfig, pipelines: Sequence[PipelineConfig] | None = None) -> LabelCheck:
    """Every pipeline (or those given) that names labels, against its model where the model is at
    hand: a model file (`model.path`), or a version installed in the local store. Reads the
    model's metadata only (nothing is loaded, run, pulled or written)."""
    check = LabelCheck()
    for pipeline in config.pipelines if pipelines is None else pipelines:
        # A pipeline's own postprocess.labels are checked by its validator; against the model
        # only their count, which no note is worth when the model is not at hand.
        relies = uses_model_labels(pipeline)
        if not (relies or getattr(pipeline.postprocess, "labels", None) is not None):
            continue
        try:
            found = _model_at_hand(config, pipeline)
        except EdgeAgentError as exc:  # the store or its trusted keys cannot be read
            found = exc.message
        except OSError as exc:
            found = f"cannot read it: {exc.strerror or exc}"
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


def _model_at_hand(
    config: AgentConfig, pipeline: PipelineConfig
) -> tuple[Manifest | None, list[ModelArtifact]] | str:
    """The pipeline's model as far as this box has it (its manifest, its files), else why not."""
    from agent.registry.file_registry import SUFFIX_FORMATS
    from agent.store import store_for
    from providers import ModelArtifact

    model = pipeline.model
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
