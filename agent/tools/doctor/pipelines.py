"""Each enabled pipeline's source (read as the agent would, unless the agent runs it) and backend
(the choice the agent would make, loaded)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config import (
    AgentConfig,
    AudioSourceConfig,
    MqttSourceConfig,
    PipelineConfig,
    ReplaySourceConfig,
    SerialSourceConfig,
    SourceConfig,
    VideoSourceConfig,
)
from agent.errors import EdgeAgentError
from agent.status import PipelineStatus
from agent.tools.doctor.broker import tcp_problem
from agent.tools.doctor.core import FAIL, OK, WARN, Check

if TYPE_CHECKING:
    from agent.store import ModelStore
    from providers import ModelArtifact

# A status.json rewritten this recently, by a process that is alive, is a running agent's.
RUNNING_STATUS_AGE_S = 30.0


# --- pipelines: sources ---------------------------------------------------------------------


def running_agent(state_dir: Path) -> dict[str, Any] | None:
    """The running agent's status (state_dir/status.json, rewritten every few seconds), or None
    when no agent runs on this state dir."""
    path = state_dir / "status.json"
    try:
        if time.time() - path.stat().st_mtime > RUNNING_STATUS_AGE_S:
            return None
        status = json.loads(path.read_text())
        os.kill(int(status["pid"]), 0)
    except PermissionError:  # alive, as another user
        pass
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if isinstance(status, dict) else None


def _exclusive(source: SourceConfig) -> bool:
    """A V4L2 camera or serial port: one reader at a time, so a running agent's is not disturbed."""
    from agent.sources.video import source_kind

    if isinstance(source, SerialSourceConfig):
        return True
    return isinstance(source, VideoSourceConfig) and source_kind(source.uri) == "device"


def local_path(source: SourceConfig) -> tuple[str, Path] | None:
    """(what it is, path) of a source that is a file or device node on this box."""
    from agent.sources.video import source_kind

    if isinstance(source, VideoSourceConfig):
        kind = source_kind(source.uri)
        if kind == "device":
            return "camera", Path(f"/dev/video{source.uri}" if source.uri.isdigit() else source.uri)
        if kind in ("file", "folder"):
            return f"video {kind}", Path(source.uri)
    if isinstance(source, AudioSourceConfig) and not source.uri.startswith("alsa:"):
        return "audio file", Path(source.uri)
    if isinstance(source, ReplaySourceConfig):
        return "replay file", Path(source.uri)
    if isinstance(source, SerialSourceConfig):
        return "serial port", Path(source.uri)
    return None


def check_source_of(pipeline: PipelineConfig, timeout_s: float, running: dict[str, Any] | None) -> Check:
    """Does the pipeline's source give a frame within the timeout?"""
    from agent.sources.check import check_source

    name = f"source:{pipeline.name}"
    source = pipeline.source
    if isinstance(source, MqttSourceConfig):
        # Its readings come when the sensors publish, and it logs in with the agent's client id.
        broker = f"{source.host}:{source.port}" if source.host else "the agent's broker (see broker)"
        if source.host:
            problem = tcp_problem(source.host, source.port, timeout_s, "source.host / source.port", "it")
            if problem:
                return Check(name, FAIL, *problem)
        return Check(name, OK, f"MQTT sensor topic {source.topic} on {broker}: reachable, not read")
    local = local_path(source)
    if local is not None and not local[1].exists():
        what, path = local
        fix = (
            "plug the camera in, or fix source.uri (ls /dev/video* lists the cameras)"
            if what == "camera"
            else f"fix pipelines[{pipeline.name}].source.uri, or put the {what} there"
        )
        return Check(name, FAIL, f"{what} {path} does not exist", fix)
    seen = running.get("pipelines", {}).get(pipeline.name) if running and _exclusive(source) else None
    if isinstance(seen, dict) and running is not None:  # doctor would take it from the agent
        status = PipelineStatus.from_json(seen)  # status.json's
        read = None if status.run is None else status.run.source  # None: not running (yet)
        state = status.state if read is None else read.state
        error = (None if read is None else read.error) or status.error
        detail = f"read by the running agent (pid {running.get('pid')}): {state}"
        if state == "streaming":
            return Check(name, OK, detail)
        return Check(name, FAIL, detail + (f": {error}" if error else ""), _source_fix(source))
    outcome = check_source(source, timeout_s, until_first=True)
    uri = outcome.stats.uri
    if outcome.ok:
        shape = "x".join(str(n) for n in outcome.shape or [])
        return Check(name, OK, f"{uri}: a frame after {outcome.first_after_s} s ({shape} {outcome.dtype})")
    error = outcome.stats.error
    ended = outcome.stats.state == "finished"
    why = "it ended without one" if ended else f"none within {timeout_s:g} s"
    return Check(name, FAIL, f"{uri}: no frame, {why}" + (f": {error}" if error else ""), _source_fix(source))


def _source_fix(source: SourceConfig) -> str:
    from agent.sources.video import source_kind

    kind = source_kind(source.uri) if isinstance(source, VideoSourceConfig) else source.type
    return {
        "device": "check the camera (v4l2-ctl --list-devices) and that no other program holds it",
        "url": "check the URL, the camera's login and that it is reachable (edge-agent source URI)",
        "gstreamer": "try the pipeline with gst-launch-1.0; see edge-agent source URI",
        "serial": "check the port, its baud rate and that the sensor sends lines",
    }.get(kind, "try it with edge-agent source PIPELINE -c CONFIG, which says what comes")


# --- pipelines: backends --------------------------------------------------------------------


def check_backend_of(config: AgentConfig, pipeline: PipelineConfig) -> Check:
    """Does the backend the agent would serve the pipeline's model on (`current_choice`: its cached
    decision for this box, model and policy, else what a first start serves) load here? Nothing is
    run on the model, no decision is recorded."""
    from agent.backend_choice import current_choice, load_choice
    from agent.store import store_for
    from providers import BackendError
    from providers.select import NoBackendError

    name = f"backend:{pipeline.name}"
    ref = f"{pipeline.model.name}@{pipeline.model.version}"
    shown, spec = ref, ref  # how the rows name the model; what `edge-agent models check` takes
    try:
        store = store_for(config)
        if pipeline.model.path is not None:  # a file on the box: checked where it is, not imported
            found = _model_file(pipeline, store)
            if isinstance(found, Check):
                return found
            artifacts, testdata = found, []
            shown, spec = f"{ref} ({pipeline.model.path})", str(pipeline.model.path)
        elif not store.is_installed(pipeline.model.name, pipeline.model.version):
            return Check(
                name,
                WARN,
                f"not checked: {ref} is not in the store yet",
                "edge-agent models pull (the agent pulls it at start, too)",
            )
        else:
            installed = store.get(pipeline.model.name, pipeline.model.version)
            artifacts, testdata = installed.model_artifacts(), installed.testdata_artifacts()
    except EdgeAgentError as exc:
        return Check(name, FAIL, exc.message, exc.hint or "see the store row")
    # As another user (root), nothing is written where the agent keeps its files (Box.here and the
    # upgraded twins see to that; compiled engines go to a scratch dir).
    with _writable_state(config.state_dir) as scratch:
        try:
            choice = current_choice(config, pipeline, artifacts, ref, testdata)
        except NoBackendError as exc:
            return Check(
                name,
                FAIL,
                f"no backend can run {shown}: {exc}",
                f"edge-agent models check {spec} says why; edge-agent providers lists this box's",
            )
        if scratch is not None:
            choice = replace(
                choice, policy=replace(choice.policy, options=_caches_in(choice.policy.options, scratch))
            )
        try:
            session, choice = load_choice(choice, f"doctor {ref}")
        except BackendError as exc:
            return Check(
                name,
                FAIL,
                f"{shown}: {exc}",
                f"edge-agent providers says what this box has; edge-agent models check {spec}",
            )
        serving = session.backend
        session.close()
    how = (
        "the agent's cached decision"
        if choice.cached
        else "not proven yet: what a first start serves until a frame proves the candidates"
    )
    artifact = choice.decision.artifact_on(serving) or choice.artifact
    detail = f"{shown}: {serving} loads {artifact} ({how})"
    if choice.load_failures:
        return Check(
            name,
            WARN,
            f"{detail}; the chosen one did not: {'; '.join(choice.load_failures)}",
            "edge-agent providers says what is missing for it; edge-agent explain PIPELINE",
        )
    return Check(name, OK, detail)


def _model_file(pipeline: PipelineConfig, store: ModelStore) -> list[ModelArtifact] | Check:
    """The file `model.path` names as the backends take it, checked as the agent's start checks it
    (there, readable, the format its suffix says: agent/tools/inventory.py resolve_model); else the
    FAIL row naming the file and what is wrong with it."""
    from agent.tools.inventory import resolve_model

    name, path = f"backend:{pipeline.name}", pipeline.model.path
    assert path is not None
    key = f"pipelines[{pipeline.name}].model.path"
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        return Check(name, FAIL, f"model file {path} {what}", f"fix {key}, or put the model file there")
    if store.trust.required:  # as the store's import refuses it
        return Check(
            name,
            FAIL,
            f"model file {path}: this agent runs only signed models (registry.trusted_keys), and a file "
            "given by model.path has no signature",
            "publish it to a registry with --sign, and name it by name and version",
        )
    try:
        return resolve_model(str(path), store).artifacts
    except OSError as exc:
        return Check(
            name,
            FAIL,
            f"cannot read model file {path}: {exc.strerror or exc}",
            f"make it readable by the agent's user, or run doctor as that user ({key})",
        )
    except EdgeAgentError as exc:  # not what its suffix says (ModelError), or no known suffix
        return Check(
            name,
            FAIL,
            exc.message if str(path) in exc.message else f"model file {path}: {exc.message}",
            f"export the model again, or fix {key}; edge-agent models inspect {path} says more",
        )


@contextlib.contextmanager
def _writable_state(state_dir: Path) -> Iterator[Path | None]:
    """None when doctor runs as the state dir's owner (compiled engines and upgraded models go
    where the agent keeps them); else a scratch dir for them, removed afterwards: files doctor
    made there as another user (root) would be in the agent's way."""
    try:
        own = state_dir.stat().st_uid == os.geteuid()
    except OSError:
        own = False
    if own:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="edge-agent-doctor-") as scratch:
        yield Path(scratch)


def _caches_in(options: Any, scratch: Path) -> dict[str, dict[str, Any]]:
    moved = {backend: dict(values) for backend, values in options.items()}
    for values in moved.values():
        for key in ("cache_dir", "engine_cache_dir"):
            if key in values:
                values[key] = str(scratch / "cache" / Path(values[key]).name)
    return moved
