"""Where a pipeline read from a config file was written, so that a problem found after the file was
read (its labels against the model's own, once the model is at hand: agent/model_labels.py) is
reported as the config's own errors are: `file:line: key.path: message`.

agent/config_loader.py remembers every config it validates (`remember`); `where` finds a pipeline
again by its name and only when it is equal to the one read (a fleet document's pipeline, or one
a later read changed, is named by its key path alone: `pipelines[door-cam].zones[0].labels[0]`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.config import AgentConfig, PipelineConfig

PathKey = tuple[str | int, ...]

# pipeline name -> (the pipeline as read, its source, its index there, the source's key lines);
# bounded by the pipeline names this process has read.
_read: dict[str, tuple[PipelineConfig, str, int, dict[PathKey, int]]] = {}
_lock = threading.Lock()


def remember(config: AgentConfig, source: str, lines: dict[PathKey, int]) -> None:
    """`config` was read from `source` (a file, or an MQTT topic) whose keys are on `lines`."""
    with _lock:
        for index, pipeline in enumerate(config.pipelines):
            _read[pipeline.name] = (pipeline, source, index, lines)


def where(pipeline: PipelineConfig, path: PathKey) -> str:
    """`source:line: pipelines[i].<path>` for a key below `pipeline` as it was read, else
    `pipelines[<name>].<path>`."""
    with _lock:
        found = _read.get(pipeline.name)
    if found is not None and found[0] == pipeline:
        _, source, index, lines = found
        full = ("pipelines", index, *path)
        return f"{source}:{line_for(full, lines)}: {dotted(full)}"
    below = dotted(path)
    return f"pipelines[{pipeline.name}]" + (below if below.startswith("[") else f".{below}")


def dotted(path: PathKey) -> str:
    """("pipelines", 0, "zones") -> "pipelines[0].zones"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def line_for(path: PathKey, lines: dict[PathKey, int]) -> int:
    """The line of `path`'s key, else of the nearest key above it that has one (1: none)."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1
