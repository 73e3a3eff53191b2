"""`edge-agent models validate`: every candidate of this box on every test set of a model, which
are correct, and the one the agent would activate, kept as its decision for the model on this box."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import replace
from pathlib import Path

from agent.config import AgentConfig
from agent.errors import EdgeAgentError
from agent.store import ModelStore
from agent.testdata import TestData
from agent.tools.inventory import resolve_model
from agent.validate import Validation
from providers import (
    ModelArtifact,
)


def validate_model(
    model: str,
    testdata: list[Path],
    rtol: float | None,
    atol: float | None,
    agent_config: AgentConfig | None,
    store_dir: Path | None,
    states: Path | None,
) -> Validation:
    """`models validate`: every candidate of this box (backends x artifacts, upgraded opsets
    included) on every test set of MODEL (its own, plus `testdata`); the candidate it activates is
    kept as the agent's decision for the model on this box when `states` is its state dir."""

    from agent.backend_choice import Box, DecisionStore, current_choice, model_candidates, owns_state_dir
    from agent.testdata import testdata_files
    from agent.tools.infer.choice import settings_for
    from agent.validate import validate
    from providers import NoBackendError
    from providers.select import SelectionPolicy

    with tempfile.TemporaryDirectory(prefix="edge-agent-validate-") as work:
        resolved = resolve_model(model, ModelStore((store_dir or Path(".")) / "store"))
        tests = list(resolved.testdata)
        primary = resolved.artifacts[0]
        for file in testdata_files(testdata, primary.path, primary.format, Path(work) / "tests", rtol, atol):
            digest = hashlib.sha256(file.path.read_bytes()).hexdigest()
            tests.append(
                TestData(
                    ModelArtifact(file.path, "test-data", digest, name=file.name), None, file.rtol, file.atol
                )
            )
        if not tests:
            raise EdgeAgentError(
                f"{resolved.ref} has no test data to validate on",
                hint="publish it with --test-data, or pass --test-data here",
            )
        settings = settings_for(agent_config, states or Path(work) / "state")
        box = Box.here(settings)
        # The choice every start and tool takes for this model: its key, policy and candidates.
        try:
            choice = current_choice(settings, None, resolved.artifacts, resolved.ref, resolved.testdata, box)
        except NoBackendError:
            choice = None
        artifacts = choice.artifacts if choice else model_candidates(settings, resolved.artifacts, box)
        policy = replace(
            choice.policy if choice else SelectionPolicy(), warmup=2, runs=10, min_time_s=0.2, max_trials=99
        )
        result = validate(resolved.ref, artifacts, tests, policy, None, list(box.backends))
        keep = choice is not None and result.usable and result.proven is not None and states is not None
        if keep and owns_state_dir(settings):  # as another user (root): nothing written in its way
            assert choice is not None and result.proven is not None
            DecisionStore(settings.state_dir).put(choice.key, result.proven, None, resolved.ref)
            result.cached = True
    return result
