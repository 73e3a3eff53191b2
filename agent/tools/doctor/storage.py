"""The registry (reachable, logged in, the pipelines' versions there) and the model store's integrity."""

from __future__ import annotations

import contextlib

from agent.config import (
    LOCAL_VERSION,
    AgentConfig,
)
from agent.errors import EdgeAgentError, RegistryError
from agent.tools.doctor.core import FAIL, OK, WARN, Check

# --- registry -------------------------------------------------------------------------------


def check_registry(config: AgentConfig, timeout_s: float) -> Check:
    """One listing (index or tags) proves the registry answers and takes the credentials; then
    every registry model the pipelines name must be there, or in the store."""
    from agent.registry import FileRegistry, HttpRegistry, open_registry
    from agent.store import store_for

    settings = config.registry
    if settings is None:
        return Check("registry", OK, "none configured: every pipeline's model is a file on the box")
    quick = settings.model_copy(
        update={"connect_timeout_s": timeout_s, "read_timeout_s": timeout_s, "retries": 0}
    )
    wanted = sorted(
        {(p.model.name, p.model.version) for p in config.pipelines if p.enabled and p.model.path is None}
    )
    try:
        registry = open_registry(settings.url, quick)
    except EdgeAgentError as exc:
        return Check("registry", FAIL, exc.message, exc.hint or "check registry.url and its credentials")
    missing: list[str] = []
    with contextlib.closing(registry):
        try:
            if isinstance(registry, (HttpRegistry, FileRegistry)):
                listed = registry.list_models()
                what = f"{len(listed)} model(s) listed"
            else:  # OCI has no listing of every model: the tags of each named one
                listed = sorted({name for name, _ in wanted})
                what = (
                    f"tags of {len(listed)} model(s) listed"
                    if listed
                    else "not asked: no pipeline names a model in it (an OCI registry lists no models)"
                )
            versions = {name: registry.list_versions(name) for name, _ in wanted if name in listed}
        except RegistryError as exc:
            return Check("registry", FAIL, exc.message, _registry_fix(exc, settings.url))
    store = store_for(config)
    for name, version in wanted:
        if version not in versions.get(name, []):
            installed = store.is_installed(name, version)
            missing.append(f"{name}@{version}" + (" (installed in the store)" if installed else ""))
    where = registry.url
    if any("installed" not in m for m in missing):
        return Check(
            "registry",
            FAIL,
            f"{where}: {what}, but {', '.join(missing)} is not in it",
            "publish it (edge-agent registry publish) or fix the pipeline's model name/version",
        )
    if missing:
        return Check(
            "registry",
            WARN,
            f"{where}: {what}, but {', '.join(missing)} is not in it",
            "the box runs it from its store; a reinstall could not pull it again",
        )
    return Check("registry", OK, f"{where}: {what}" + (", every pipeline's model in it" if wanted else ""))


def _registry_fix(exc: RegistryError, url: str) -> str:
    if url.startswith("file:"):
        return "check registry.url: a folder on this box (mounted, readable by the agent's user)"
    if "cannot reach" in exc.message:
        return "check registry.url and that the registry server is up and reachable from this box"
    if exc.hint and "keeps running" not in exc.hint:
        return exc.hint
    return "check registry.url and registry.username / password_file / token_file"


# --- store ----------------------------------------------------------------------------------


def check_store(config: AgentConfig) -> Check:
    """Re-hash every installed version's files and check its signatures against the trust policy
    (what `edge-agent models verify` does)."""
    from agent.store import store_for

    try:
        store = store_for(config)
        installed = store.list()
        damaged = [(m, store.verify(m.name, m.version)) for m in installed]
    except EdgeAgentError as exc:
        return Check("store", FAIL, exc.message, exc.hint or f"check {config.state_dir}/store")
    damaged = [(m, problems) for m, problems in damaged if problems]
    if not installed:
        return Check("store", OK, "empty: nothing installed yet (the agent pulls what pipelines name)")
    if damaged:
        in_use = {(p.model.name, p.model.version) for p in config.pipelines}
        detail = "; ".join(f"{m.ref}: {'; '.join(problems)}" for m, problems in damaged)
        fixes = [
            "edge-agent models pull (copies model.path files in again)"
            if m.version == LOCAL_VERSION
            else f"edge-agent models rm {m.ref}{' --force' if (m.name, m.version) in in_use else ''} "
            f"&& edge-agent models pull {m.ref}"
            for m, _ in damaged
        ]
        return Check("store", FAIL, detail, "; ".join(dict.fromkeys(fixes)))
    signed = ", signatures checked against registry.trusted_keys" if store.trust.required else ""
    return Check("store", OK, f"{len(installed)} version(s), every file's sha256 matches{signed}")
