"""Desired state on the device (docs/fleet.md): the accepted documents (agent/fleet/document.py
checks each one) layered over agent.yaml's pipelines, kept across restarts, and the replay rule.
Pure: no broker, no threads.

A refused document changes nothing, so the layers below it keep running.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from agent.config import HealthWindowConfig, PipelineConfig
from agent.desired_pipeline import DesiredPipeline
from agent.errors import DesiredStateError
from agent.fleet.document import AgentRelease, DesiredDocument, Problems, check_layer, parse_document
from agent.fsutil import atomic_write_bytes
from agent.registry.signing import TrustPolicy

log = logging.getLogger(__name__)

UNCHANGED = "unchanged"

_DOCUMENTS_DIR = "documents"
_APPLIED_FILE = "applied.json"


# --- layering ------------------------------------------------------------------------------------


def layer_order(document: DesiredDocument) -> tuple[int, int, str]:
    """Lowest layer first: by priority, then group documents before the device's, then by name."""
    return (document.priority, 0 if document.layer.startswith("group:") else 1, document.layer)


def layer_pipelines(
    base: Sequence[PipelineConfig],
    documents: Sequence[DesiredDocument],
    device_id: str,
    default_health: HealthWindowConfig,
) -> dict[str, DesiredPipeline]:
    """The pipelines `device_id` should run (docs/fleet.md, Layering): agent.yaml's, then each
    document's in `layer_order`, a name replacing the whole pipeline below it and null removing it.
    Disabled pipelines are left out. Order: agent.yaml's, then new names as the layers add them."""
    layered: dict[str, DesiredPipeline | None] = {p.name: DesiredPipeline(p) for p in base}
    for document in sorted(documents, key=layer_order):
        health = document.health or default_health
        for name, config in document.effective_pipelines(device_id).items():
            # Setting None (not deleting) keeps the name's place should a higher layer bring it back.
            layered[name] = (
                None
                if config is None
                else DesiredPipeline(config, document.layer, document.generation, health)
            )
    return {name: p for name, p in layered.items() if p is not None and p.config.enabled}


def layer_agent(documents: Sequence[DesiredDocument]) -> tuple[AgentRelease, str] | None:
    """The release the device should run and the layer that says so: the highest layer (in
    `layer_order`) whose document has `agent`; None when none has."""
    for document in sorted(documents, key=layer_order, reverse=True):
        if document.agent is not None:
            return document.agent, document.layer
    return None


# --- persistence and replays ---------------------------------------------------------------------


class DesiredStore:
    """The accepted documents and the applied generations, under `<state_dir>/fleet/`, so the agent
    starts on them before the broker answers. Not thread-safe: one reconciler owns it.

    `documents/<kind>_<name>.json` holds each layer's payload byte for byte (signature included);
    `applied.json` maps layer -> the last generation applied. A withdrawn layer's applied generation
    is kept: a replay of an older document stays refused after the withdrawal.
    """

    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir) / "fleet"
        self.documents_dir = self.root / _DOCUMENTS_DIR
        self.applied_path = self.root / _APPLIED_FILE

    def path_of(self, layer: str) -> Path:
        return self.documents_dir / f"{check_layer(layer).replace(':', '_', 1)}.json"

    def save(self, document: DesiredDocument) -> None:
        path = self.path_of(document.layer)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, document.raw)

    def remove(self, layer: str) -> None:
        self.path_of(layer).unlink(missing_ok=True)

    def raw(self, layer: str) -> bytes | None:
        """The persisted payload of `layer`; None when there is none or it cannot be read."""
        try:
            return self.path_of(layer).read_bytes()
        except OSError:
            return None

    def load(self, trust: TrustPolicy, max_bytes: int, now: float) -> tuple[list[DesiredDocument], list[str]]:
        """The persisted documents that still pass `parse_document` (signature, expiry: a key no
        longer trusted or a document expired since drops its layer, and the layers below apply),
        and a reason for each file left out. Never raises for what is on disk."""
        documents: list[DesiredDocument] = []
        reasons: list[str] = []
        try:
            paths = sorted(self.documents_dir.glob("*.json"))
        except OSError as exc:
            return [], [f"{self.documents_dir}: cannot list persisted documents: {exc.strerror or exc}"]
        for path in paths:
            layer = path.stem.replace("_", ":", 1)
            try:
                check_layer(layer)
            except ValueError:
                reasons.append(
                    f"{path}: not a desired-state document (expected device_<id>.json or group_<name>.json)"
                )
                continue
            try:
                payload = path.read_bytes()
            except OSError as exc:
                reasons.append(f"{layer}: cannot read the persisted document {path}: {exc.strerror or exc}")
                continue
            try:
                documents.append(parse_document(payload, layer, trust, max_bytes, now))
            except DesiredStateError as exc:
                reasons.extend(f"{line} (persisted in {path})" for line in exc.problems)
        _, problem = self._read_applied()
        if problem:
            reasons.append(problem)
        return documents, reasons

    def applied_generation(self, layer: str) -> int | None:
        """The last generation applied from `layer`. An unreadable applied.json counts as empty (it
        is logged, and `load` reports it): documents are still signed and expire."""
        applied, problem = self._read_applied()
        if problem:
            log.warning("%s", problem)
        return applied.get(layer)

    def mark_applied(self, layer: str, generation: int) -> None:
        check_layer(layer)
        applied, _ = self._read_applied()  # a corrupt file is replaced
        applied[layer] = generation
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.applied_path, (json.dumps(applied, indent=2, sort_keys=True) + "\n").encode())

    def _read_applied(self) -> tuple[dict[str, int], str | None]:
        try:
            data = json.loads(self.applied_path.read_bytes())
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            return {}, f"{self.applied_path}: cannot read applied generations: {exc.strerror or exc}"
        except ValueError as exc:
            return {}, f"{self.applied_path}: applied generations are not valid JSON ({exc}); starting afresh"
        if not isinstance(data, dict) or not all(
            type(v) is int and isinstance(k, str) for k, v in data.items()
        ):
            return {}, f"{self.applied_path}: expected {{layer: generation}}; starting afresh"
        return data, None


def admit(document: DesiredDocument, store: DesiredStore) -> str | None:
    """The replay rule against what this box applied (see `admit_after`)."""
    applied = store.applied_generation(document.layer)
    return admit_after(document, applied, store.raw(document.layer) if applied is not None else None)


def admit_after(document: DesiredDocument, applied: int | None, applied_raw: bytes | None) -> str | None:
    """The replay rule, given the generation applied from the document's layer and that document's
    bytes: None for a new document; UNCHANGED ("unchanged") for the applied one delivered again (a
    retained message after a reconnect); DesiredStateError for an older generation, or another
    document reusing the applied generation."""
    if applied is None or document.generation > applied:
        return None
    problems = Problems(document.layer)
    if document.generation == applied:
        if applied_raw == document.raw:
            return UNCHANGED
        if applied_raw is not None:
            problems.fail(
                ("generation",),
                f"generation {applied} is already applied from another document (a second document "
                "reusing a generation): publish a higher generation",
            )
    problems.fail(
        ("generation",),
        f"generation {document.generation} is not newer than the applied {applied} (replayed or stale)",
    )
