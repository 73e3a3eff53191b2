"""A pipeline's labels checked against the model's own, wherever the model is at hand.

A detector often names its classes itself: in its manifest's metadata (`labels`), or in the model
file's own metadata (Ultralytics' `names`, a TFLite labels file: agent/model_hints.py). A pipeline
that writes no `postprocess.labels` uses those, so the labels its zones and lines filter on
(and home_automation.watch) must be among them; one that writes a shorter list leaves classes
without a name. The pipeline validator cannot see the model: this check runs where it can,
with the same `file:line: key.path: message` as the config's own errors (agent/config_origin.py):
`config validate` and `doctor` (a model file, or a version installed in the local store), and the
daemon and `infer` once they have the model (`with_model_hints`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.config.analytics import Problems, model_label_problems
from agent.config_origin import where
from agent.errors import ConfigError, EdgeAgentError

if TYPE_CHECKING:
    from agent.config import AgentConfig, PipelineConfig
    from agent.registry.manifest import Manifest
    from providers import ModelArtifact

log = logging.getLogger(__name__)


def own_labels(manifest: Manifest | None, embedded: Mapping[str, Any]) -> tuple[list[str], str] | None:
    """(the model's labels, where they come from), as `with_model_hints` fills them in: the
    manifest's first, else the model file's own; None when the model names none."""
    if manifest is not None and (names := _names(manifest.metadata.get("labels"))):
        return names, f"{manifest.ref}'s manifest"
    if names := _names(embedded.get("labels")):
        return names, "the model file's own metadata"
    return None


def _names(value: Any) -> list[str] | None:
    """`value` as labels: a list of strings, else None (not what the hints take: theirs to say)."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return None


def uses_model_labels(pipeline: PipelineConfig) -> bool:
    """The pipeline filters on label names (its zones' and lines', its home_automation.watch) that
    only the model's own labels can give: it writes no postprocess.labels."""
    post = pipeline.postprocess
    if "labels" not in type(post).model_fields or getattr(post, "labels", None) is not None:
        return False
    drawn = any(item.labels for item in [*pipeline.zones, *pipeline.lines])
    return drawn or bool(pipeline.home_automation.watch)


def label_problems(pipeline: PipelineConfig, labels: list[str]) -> Problems:
    """(key path below the pipeline, message) for what `pipeline` gets wrong against the model's
    `labels`; [] for a postprocess without labels (raw, regions)."""
    post = pipeline.postprocess
    if "labels" not in type(post).model_fields:
        return []
    written = getattr(post, "labels", None)
    watch = list(pipeline.home_automation.watch)
    return model_label_problems(pipeline.zones, pipeline.lines, written, watch, labels)


def located(pipeline: PipelineConfig, problems: Problems) -> list[str]:
    """Each problem as `file:line: pipelines[i].key: message` (or `pipelines[name].key: ...` for a
    pipeline no file in this process gave)."""
    return [f"{where(pipeline, path)}: {message}" for path, message in problems]


def check_against(pipeline: PipelineConfig, labels: list[str], source: str) -> None:
    """ConfigError, located, when `pipeline`'s labels do not fit the model's `labels`."""
    problems = label_problems(pipeline, labels)
    if problems:
        raise ConfigError(located(pipeline, problems), hint=_hint(pipeline, source))


def _hint(pipeline: PipelineConfig, source: str) -> str:
    model = pipeline.model
    spec = str(model.path) if model.path is not None else f"{model.name}@{model.version}"
    return f"the model's labels are in {source}; edge-agent models inspect {spec} lists them"


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
    from agent.model_hints import embedded_hints

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
            check.hints.append(_hint(pipeline, labels[1]))
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
