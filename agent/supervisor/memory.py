"""What a restart remembers: the last good and the last failed version of each pipeline."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.config import REVEAL_SECRETS, PipelineConfig
from agent.desired_pipeline import DesiredPipeline
from agent.fsutil import atomic_write_bytes

log = logging.getLogger(__package__)  # the package's logger, as before it was split


class VersionMemory:
    """Per pipeline, the last version that was committed and the last one that failed on this box,
    kept in `<state_dir>/pipelines.json`: after a restart a version known to fail here is not tried
    again (its persisted desired state still names it) and the last good one runs instead."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            data = json.loads(path.read_text())
            self._records: dict[str, dict[str, Any]] = data if isinstance(data, dict) else {}
        except FileNotFoundError:
            self._records = {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            self._records = {}

    def good(self, name: str, desired: DesiredPipeline) -> None:
        # With its secrets (an MQTT source's password): a fallback must be able to log in. The file
        # is the daemon's own (owner-only, like the desired-state documents it comes from).
        config = desired.config.model_dump(mode="json", context={REVEAL_SECRETS: True})
        record = {"config": config, "layer": desired.layer, "generation": desired.generation}
        with self._lock:
            entry = self._records.setdefault(name, {})
            entry["good"] = record
            if entry.get("failed", {}).get("fingerprint") == _fingerprint(desired.config):
                entry.pop("failed")
            self._save()

    def failed(self, name: str, desired: DesiredPipeline, why: str) -> None:
        with self._lock:
            entry = self._records.setdefault(name, {})
            entry["failed"] = {"fingerprint": _fingerprint(desired.config), "reason": why[:500]}
            self._save()

    def fallback_for(self, desired: DesiredPipeline) -> tuple[DesiredPipeline | None, str]:
        """(the last good version, why `desired` failed) when `desired` is the version that failed here
        last; (None, "") otherwise."""
        with self._lock:
            entry = self._records.get(desired.config.name, {})
        failed, good = entry.get("failed"), entry.get("good")
        if not failed or not good or failed.get("fingerprint") != _fingerprint(desired.config):
            return None, ""
        try:
            config = PipelineConfig.model_validate(good["config"])
        except (ValidationError, KeyError, TypeError) as exc:
            log.warning(
                "%s: the last good version of %s is unreadable: %s", self.path, desired.config.name, exc
            )
            return None, ""
        return DesiredPipeline(config, good.get("layer", "yaml"), good.get("generation")), str(
            failed.get("reason")
        )

    def _save(self) -> None:
        try:
            atomic_write_bytes(self.path, json.dumps(self._records, indent=2).encode())
        except OSError as exc:  # the daemon serves on; only a restart's memory is lost
            log.warning("cannot write %s: %s", self.path, exc)


def _fingerprint(config: PipelineConfig) -> str:
    # Secrets included: a version whose only change is a corrected password is a new version.
    dump = config.model_dump(mode="json", context={REVEAL_SECRETS: True})
    return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()
