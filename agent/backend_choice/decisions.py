"""The decision cache: what a decision depends on (`decision_key`), decisions on disk by key and
by pipeline (`DecisionStore`), and the lock pipelines on one model decide under."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.fsutil import atomic_write_bytes
from agent.hardware import HardwareInfo
from agent.testdata import TestData
from providers import Backend, Decision, ModelArtifact, SelectionPolicy
from providers.select import NoBackendError

log = logging.getLogger(__package__)  # the package's logger, as before it was split


def decision_key(
    artifacts: Sequence[ModelArtifact],
    testdata: Sequence[TestData],
    policy: SelectionPolicy,
    backends: Sequence[Backend],
    hardware: HardwareInfo,
) -> str:
    """What a decision depends on: the files (models and test data, with the test data's
    tolerances), the hardware, the runtimes and the policy."""
    facts = {
        "artifacts": sorted(a.sha256 for a in [*artifacts, *(t.artifact for t in testdata)]),
        "tolerances": sorted(str((t.artifact.sha256, t.rtol, t.atol)) for t in testdata),
        "hardware": hardware.fingerprint(),
        "runtimes": sorted({f"{k}={v}" for b in backends for k, v in b.probe().versions.items()}),
        "available": sorted(b.name for b in backends if b.probe().available),
        "policy": json.dumps(asdict(policy), sort_keys=True, default=str),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


class DecisionStore:
    """Decisions on disk: by key (the cache) and by pipeline name (for `edge-agent explain`)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "decisions"

    def get(self, key: str) -> Decision | None:
        path = self.root / f"{key}.json"
        try:
            return Decision.from_dict(json.loads(path.read_text())["decision"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable cached decision %s: %s", path, exc)
            return None

    def put(self, key: str, decision: Decision, pipeline: str | None, model: str, cache: bool = True) -> None:
        """Record the pipeline's decision (for `explain`; None: no pipeline's); with `cache` also
        under its key, for the next start to reuse (an unchecked decision is only recorded: it is
        made again)."""
        record = {
            "key": key,
            "pipeline": pipeline,
            "model": model,
            "decided_at": time.time(),
            "decision": decision.to_dict(),
        }
        data = json.dumps(record, indent=2).encode()
        self.root.mkdir(parents=True, exist_ok=True)
        if cache:
            atomic_write_bytes(self.root / f"{key}.json", data)
        if pipeline is not None:
            (self.root / "pipelines").mkdir(exist_ok=True)
            atomic_write_bytes(self.root / "pipelines" / f"{pipeline}.json", data)

    def put_refusal(self, error: NoBackendError, pipeline: str, model: str) -> None:
        """Record that no candidate could serve the pipeline, and why each could not (for `explain`)."""
        record = {
            "pipeline": pipeline,
            "model": model,
            "decided_at": time.time(),
            "refused": str(error),
            "candidates": [asdict(c) for c in error.candidates],
        }
        (self.root / "pipelines").mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(
            self.root / "pipelines" / f"{pipeline}.json", json.dumps(record, indent=2).encode()
        )

    def forget(self, pipeline: str, key: str | None = None) -> bool:
        """Drop the cached decision `key` (default: the one the pipeline's record names), so the
        pipeline's next build decides again; False when there was none cached."""
        if key is None:
            record = self.for_pipeline(pipeline)
            key = record.get("key") if record else None
        if not isinstance(key, str) or not key:
            return False
        path = self.root / f"{key}.json"
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed

    def for_pipeline(self, pipeline: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads((self.root / "pipelines" / f"{pipeline}.json").read_text())
            return record
        except (OSError, ValueError):
            return None

    def all_pipelines(self) -> list[dict[str, Any]]:
        folder = self.root / "pipelines"
        records = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return records


_decision_locks: dict[str, threading.Lock] = {}
_decision_locks_guard = threading.Lock()


def deciding_lock(key: str) -> threading.Lock:
    """The lock held while deciding for one decision key (one model, policy and box)."""
    with _decision_locks_guard:
        return _decision_locks.setdefault(key, threading.Lock())
