"""A pipeline's labels checked against the model's own, wherever the model is at hand.

A detector often names its classes itself: in its manifest's metadata (`labels`), or in the model
file's own metadata (Ultralytics' `names`, a TFLite labels file: agent/model_hints.py). A pipeline
that writes no `postprocess.labels` uses those, so the labels its zones, lines, object filters and
attributes name (and home_automation.watch) must be among them; one that writes a shorter list leaves classes
without a name. The pipeline validator cannot see the model: this check runs where it can,
with the same `file:line: key.path: message` as the config's own errors (agent/config_origin.py):
`config validate` and `doctor` (a model file, or a version installed in the local store:
agent/label_check.py), and the daemon and `infer` once they have the model (`with_model_hints`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.config.analytics import Problems, model_label_problems, unknown_labels
from agent.config.filters import filter_model_label_problems
from agent.config_origin import where
from agent.errors import ConfigError

if TYPE_CHECKING:
    from agent.config import PipelineConfig
    from agent.registry.manifest import Manifest

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
    """The pipeline filters on label names (its zones' and lines', its attributes', its
    home_automation.watch) that only the model's own labels can give: it writes no postprocess.labels."""
    post = pipeline.postprocess
    if "labels" not in type(post).model_fields or getattr(post, "labels", None) is not None:
        return False
    drawn = any(item.labels for item in [*pipeline.zones, *pipeline.lines])
    filtered = pipeline.filters is not None and any(pipeline.filters.label_keys())
    read = any(attribute.labels for attribute in pipeline.attributes)
    return drawn or filtered or read or bool(pipeline.home_automation.watch)


def label_problems(pipeline: PipelineConfig, labels: list[str]) -> Problems:
    """(key path below the pipeline, message) for what `pipeline` gets wrong against the model's
    `labels`; [] for a postprocess without labels (raw, regions)."""
    post = pipeline.postprocess
    if "labels" not in type(post).model_fields:
        return []
    written = getattr(post, "labels", None)
    watch = list(pipeline.home_automation.watch)
    problems = model_label_problems(pipeline.zones, pipeline.lines, written, watch, labels)
    if written is not None:  # the pipeline's validator checks the filters' labels against these
        return problems
    read = [
        problem
        for i, attribute in enumerate(pipeline.attributes)
        for problem in unknown_labels(("attributes", i, "labels"), attribute.labels or [], labels)
    ]
    return problems + filter_model_label_problems(pipeline.filters, labels) + read


def located(pipeline: PipelineConfig, problems: Problems) -> list[str]:
    """Each problem as `file:line: pipelines[i].key: message` (or `pipelines[name].key: ...` for a
    pipeline no file in this process gave)."""
    return [f"{where(pipeline, path)}: {message}" for path, message in problems]


def check_against(pipeline: PipelineConfig, labels: list[str], source: str) -> None:
    """ConfigError, located, when `pipeline`'s labels do not fit the model's `labels`."""
    problems = label_problems(pipeline, labels)
    if problems:
        raise ConfigError(located(pipeline, problems), hint=fix_hint(pipeline, source))


def fix_hint(pipeline: PipelineConfig, source: str) -> str:
    model = pipeline.model
    spec = str(model.path) if model.path is not None else f"{model.name}@{model.version}"
    return f"the model's labels are in {source}; edge-agent models inspect {spec} lists them"
