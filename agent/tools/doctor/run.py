"""`run_doctor`: every check in order, each bounded (core.py), those needing a valid config
skipped when it is not."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.config import (
    AgentConfig,
)
from agent.errors import ConfigError
from agent.tools.doctor.box import (
    check_clock,
    check_devices,
    check_disk,
    check_secret_files,
    check_state_dir,
    ntp_synchronized,
)
from agent.tools.doctor.broker import check_broker
from agent.tools.doctor.core import FAIL, OK, SKIPPED, SKIPPED_FIX, WARN, Check, bounded
from agent.tools.doctor.pipelines import check_backend_of, check_source_of, running_agent
from agent.tools.doctor.storage import check_registry, check_store

# Re-hashing every installed model: seconds per GB on an SD card, so much longer than a network wait.
STORE_LIMIT_S = 600.0
# What a check may take beyond its own waits (starting a thread, stopping a source's reader).
GRACE_S = 10.0


# --- running them ---------------------------------------------------------------------------


def run_doctor(config_path: Path, timeout_s: float = 10.0) -> list[Check]:
    """Every check, in order; those that need a valid config are rows saying they were not checked
    when it is not."""
    from agent.config_loader import load_config
    from agent.label_check import check_config

    started = time.monotonic()
    config: AgentConfig | None = None
    try:
        loaded = load_config(config_path)
    except ConfigError as exc:
        if not config_path.is_file():
            fix = "give the agent's config with -c FILE (or EDGE_AGENT_CONFIG)"
        elif not os.access(config_path, os.R_OK):
            fix = "run doctor as the agent's user (sudo -u edge-agent edge-agent doctor) or as root"
        else:
            fix = f"edge-agent config validate {config_path}"
        checks = [Check("config", FAIL, "\n".join(exc.problems), fix)]
    else:
        config = loaded
        enabled = [p for p in loaded.pipelines if p.enabled]
        # Labels against the models at hand, as `config validate` checks them: the daemon would
        # refuse these pipelines once it has their models.
        labels = check_config(loaded, enabled)
        if labels.problems:
            fix = "; ".join(dict.fromkeys(labels.hints))
            checks = [Check("config", FAIL, "\n".join(labels.problems), fix)]
        else:
            detail = (
                f"{config_path}: device {loaded.device.id}, {len(enabled)} enabled pipeline(s) "
                f"of {len(loaded.pipelines)}"
            )
            checks = [Check("config", OK, detail)]
    checks[0] = replace(checks[0], seconds=round(time.monotonic() - started, 2))
    made = config is not None and _make_state_dir(config.state_dir)
    for name, check, limit_s in _plan(config, config_path, timeout_s, made):
        checks += bounded(name, check, limit_s)
    return checks


def _make_state_dir(state_dir: Path) -> bool:
    """Make a state dir that is not there yet as the agent makes it (owner only: 0700), before the
    checks that write in it (the backends' probe cache): made by them, it would be 0755, and the
    state dir row would warn about what doctor itself made. False when it exists or cannot be made
    (the state dir row says why)."""
    if state_dir.exists():
        return False
    try:
        state_dir.mkdir(mode=0o700, parents=True)
    except OSError:
        return False
    return True


Plan = list[tuple[str, Callable[[], Check | list[Check]], float]]


def _plan(config: AgentConfig | None, config_path: Path, timeout_s: float, made: bool = False) -> Plan:
    network = 3 * timeout_s + GRACE_S
    local = timeout_s + GRACE_S
    if config is None:
        skipped = ("broker", "registry", "store", "pipelines", "disk", "state dir", "secret files")
        plan: Plan = [(name, _skipped(name), local) for name in skipped]
        return [
            *plan,
            ("devices", lambda: check_devices(None), local),
            ("clock", lambda: check_clock(synchronized=ntp_synchronized(timeout_s)), local),
        ]
    cfg = config
    enabled = [p for p in cfg.pipelines if p.enabled]
    plan = [
        ("broker", lambda: check_broker(cfg, timeout_s), network),
        ("registry", lambda: check_registry(cfg, timeout_s), network + len(enabled) * timeout_s),
        ("store", lambda: check_store(cfg), STORE_LIMIT_S),
    ]
    if not enabled:
        plan.append(("pipelines", lambda: Check("pipelines", OK, "none enabled in the config"), local))
    running = running_agent(cfg.state_dir)
    for pipeline in enabled:
        plan.append(
            (
                f"source:{pipeline.name}",
                _bind(check_source_of, pipeline, timeout_s, running),
                local + timeout_s,
            )
        )
    for pipeline in enabled:
        limit = cfg.backends.timeout_s + timeout_s + GRACE_S  # the agent's own limit on loading one
        plan.append((f"backend:{pipeline.name}", _bind(check_backend_of, cfg, pipeline), limit))
    return [
        *plan,
        ("disk", lambda: check_disk(cfg.state_dir), local),
        ("state dir", lambda: check_state_dir(cfg.state_dir, made), local),
        ("devices", lambda: check_devices(cfg), local),
        ("secret files", lambda: check_secret_files(config_path, cfg), local),
        ("clock", lambda: check_clock(synchronized=ntp_synchronized(timeout_s)), local),
    ]


def _skipped(name: str) -> Callable[[], Check]:
    return lambda: Check(name, WARN, SKIPPED, SKIPPED_FIX)


def _bind(function: Callable[..., Check], *args: Any) -> Callable[[], Check]:
    return lambda: function(*args)
