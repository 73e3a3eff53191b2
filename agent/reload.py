"""Config reload (SIGHUP, `systemctl reload`) and the last good config.

A reload re-reads agent.yaml and applies only what changed: the pipelines go through the same
`Supervisor.apply` as fleet updates (an unchanged pipeline is not touched: no gap in its stream; a
changed one is brought in beside the old, which serves until the new is ready), and `log_level`,
`telemetry`, `state_topics` and `home_assistant` take effect at once. Everything else (the device
id, the broker, the state dir, the registry, the store, backend selection, fleet settings) is wired
into the running daemon: a change there is named as needing a restart and the running value is kept
until then. An invalid file is refused whole, with its problems logged and reported, and the old
config runs on.

Every config the daemon has run is kept as `<state_dir>/config/last-good.yaml` (the file's text, as
written: `${VAR}`s are interpolated again when it is used). A daemon that boots on an invalid
agent.yaml runs that one instead, and reports the problems, rather than crash-looping under systemd.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.clock import iso_utc
from agent.config import REVEAL_SECRETS, AgentConfig
from agent.config_loader import parse_config, read_config
from agent.errors import ConfigError
from agent.fsutil import atomic_write_bytes
from agent.sources.uri import redact_uri
from agent.state_dir import state_dir_of

log = logging.getLogger(__name__)

# Top-level settings a reload applies; every other one needs a restart.
HOT_SETTINGS = ("pipelines", "log_level", "telemetry", "state_topics", "home_assistant")

LAST_GOOD_DIR = "config"
LAST_GOOD_FILE = "last-good.yaml"
LAST_GOOD_META = "last-good.json"


SHOWN_CHARS = 60  # a longer value is shortened in `config diff`
SECRET_CHANGED = "(a secret; changed)"


@dataclass
class ReloadPlan:
    """What applying `new` over `running` changes. Values are shown as `old -> new` with secrets
    masked (SecretStr fields, passwords in URLs) and long values shortened (`shown`)."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)  # pipeline -> the keys that differ
    unchanged: list[str] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)  # applied at once (log_level, telemetry.*)
    restart_needed: list[str] = field(default_factory=list)  # kept as running until a restart
    # "old -> new" (masked, shortened) per key: a setting's dotted key, "pipelines.<name>.<key>"
    shown: dict[str, str] = field(default_factory=dict)
    retried: list[str] = field(default_factory=list)  # failed pipelines a reload started again at once

    @property
    def changes_anything(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.settings or self.restart_needed)

    def retry(self, names: list[str]) -> None:
        """`names` (unchanged pipelines that had failed) were started again by the reload."""
        self.retried = [n for n in self.unchanged if n in names]
        self.unchanged = [n for n in self.unchanged if n not in names]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipelines": {
                "added": self.added,
                "removed": self.removed,
                "changed": self.changed,
                "unchanged": self.unchanged,
                "retried": self.retried,
            },
            "settings": self.settings,
            "restart_needed": self.restart_needed,
            "values": [{"key": key, "change": change} for key, change in self.shown.items()],
        }

    def lines(self) -> list[str]:
        """For people: one line per change."""
        if not self.changes_anything and not self.retried:
            return ["no changes"]
        out = [f"+ pipeline {name} (new)" for name in self.added]
        out += [f"- pipeline {name} (removed)" for name in self.removed]
        for name, keys in self.changed.items():
            out += [f"~ pipeline {name}: {self._with_value(key, f'pipelines.{name}.{key}')}" for key in keys]
        out += [f"~ {self._with_value(key)} (applied at once)" for key in self.settings]
        out += [
            f"! {self._with_value(key)} (needs a restart: systemctl restart edge-agent)"
            for key in self.restart_needed
        ]
        out += [f"> pipeline {name} (had failed: retried at once)" for name in self.retried]
        if self.unchanged:
            out.append(f"= unchanged, running on: {', '.join(self.unchanged)}")
        return out

    def _with_value(self, key: str, full_key: str | None = None) -> str:
        change = self.shown.get(full_key or key)
        return f"{key}: {change}" if change else key

    def summary(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", list(self.changed)),
                ("unchanged", self.unchanged),
                ("retried", self.retried),
            )
            if names
        ]
        if self.settings:
            parts.append(f"settings {', '.join(self.settings)}")
        return "; ".join(parts) or "no pipelines"


def plan_reload(running: AgentConfig, new: AgentConfig) -> ReloadPlan:
    plan = ReloadPlan()
    old_dump, new_dump = _dump(running), _dump(new)
    old_shown, new_shown = _masked(running), _masked(new)
    for key in AgentConfig.model_fields:
        if key == "pipelines" or old_dump.get(key) == new_dump.get(key):
            continue
        target = plan.settings if key in HOT_SETTINGS else plan.restart_needed
        for dotted, path in _changes(old_dump.get(key), new_dump.get(key), key, (key,)):
            target.append(dotted)
            plan.shown[dotted] = _shown_change(old_shown, new_shown, path)
    before = {p["name"]: p for p in old_dump["pipelines"] if p.get("enabled", True)}
    after = {p["name"]: p for p in new_dump["pipelines"] if p.get("enabled", True)}
    shown_before = {p["name"]: p for p in old_shown["pipelines"]}
    shown_after = {p["name"]: p for p in new_shown["pipelines"]}
    for name, config in after.items():
        if name not in before:
            plan.added.append(name)
        elif before[name] == config:
            plan.unchanged.append(name)
        else:
            plan.changed[name] = []
            for dotted, path in _changes(before[name], config, "", ()):
                plan.changed[name].append(dotted)
                change = _shown_change(shown_before[name], shown_after[name], path)
                plan.shown[f"pipelines.{name}.{dotted}"] = change
    plan.removed = [name for name in before if name not in after]
    return plan


def differences(old: Any, new: Any, prefix: str, depth: int = 3) -> list[str]:
    """The dotted keys under which `old` and `new` differ (down to `depth` levels)."""
    return [dotted for dotted, _path in _changes(old, new, prefix, (), depth)]


@dataclass(frozen=True)
class _Named:
    """A step into a list to the item of this `name` (a pipeline's zones and lines)."""

    name: str


Step = str | int | _Named
_NONE = object()  # an item on one side only: shown as (none)


def _changes(
    old: Any, new: Any, prefix: str, path: tuple[Step, ...], depth: int = 3
) -> list[tuple[str, tuple[Step, ...]]]:
    """(dotted key, key path) of each place under which `old` and `new` differ."""
    if old == new:
        return []
    if isinstance(old, list) and isinstance(new, list):
        return _list_changes(old, new, prefix, path, depth)
    if depth == 0 or not (isinstance(old, dict) and isinstance(new, dict)):
        return [(prefix or "(all)", path)]
    keys = list(old) + [k for k in new if k not in old]
    found: list[tuple[str, tuple[Step, ...]]] = []
    for key in keys:
        dotted = f"{prefix}.{key}" if prefix else str(key)
        found += _changes(old.get(key), new.get(key), dotted, (*path, str(key)), depth - 1)
    return found


def _list_changes(
    old: list[Any], new: list[Any], prefix: str, path: tuple[Step, ...], depth: int
) -> list[tuple[str, tuple[Step, ...]]]:
    """Inside two lists (a step that is no level of `depth`): items with names (zones, lines) by
    name, `lines[door].points`; objects of two lists of one length by place, `[0].x`; any other
    list (points, labels) as a whole. A moved line is then its points, not the whole list twice."""
    before, after = _by_name(old), _by_name(new)
    if before is not None and after is not None:
        found: list[tuple[str, tuple[Step, ...]]] = []
        for name in list(before) + [n for n in after if n not in before]:
            step = (*path, _Named(name))
            found += _changes(
                before.get(name, _NONE), after.get(name, _NONE), f"{prefix}[{name}]", step, depth
            )
        return found or [(prefix or "(all)", path)]  # the same items, in another order
    objects = all(isinstance(item, dict) for item in [*old, *new])
    if objects and len(old) == len(new):
        found = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found += _changes(a, b, f"{prefix}[{i}]", (*path, i), depth)
        return found
    return [(prefix or "(all)", path)]


def _by_name(items: list[Any]) -> dict[str, Any] | None:
    """The items by their `name`, when each is an object with a name of its own."""
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        return None
    return {str(name): item for name, item in zip(names, items, strict=True)}


def _step(value: Any, step: Step) -> Any:
    if isinstance(step, _Named):
        items = value if isinstance(value, list) else []
        return next((v for v in items if isinstance(v, dict) and v.get("name") == step.name), _NONE)
    if isinstance(step, int):
        return value[step] if isinstance(value, list) and step < len(value) else _NONE
    return value.get(step) if isinstance(value, dict) else None


def _shown_change(old: Any, new: Any, path: tuple[Step, ...]) -> str:
    """`old -> new` at `path` of two masked dumps; a change only a secret makes is not shown."""
    for step in path:
        old, new = _step(old, step), _step(new, step)
    if old == new:
        return SECRET_CHANGED
    return f"{_shown(old)} -> {_shown(new)}"


def _shown(value: Any) -> str:
    if value is _NONE:
        return "(none)"
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _masked(config: AgentConfig) -> Any:
    """The config as it may be shown: SecretStr fields masked, passwords in URLs replaced."""

    def redact(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: redact(v) for k, v in value.items()}
        if isinstance(value, list):
            return [redact(v) for v in value]
        return redact_uri(value) if isinstance(value, str) else value

    return redact(config.model_dump(mode="json"))


def with_hot_settings(running: AgentConfig, new: AgentConfig) -> AgentConfig:
    """The running config with `new`'s reloadable settings; ConfigError when the mix is not a valid
    config (e.g. pipelines naming registry models while the registry, restart-only, is not set)."""
    fields = {name: getattr(running, name) for name in AgentConfig.model_fields}
    fields.update({name: getattr(new, name) for name in HOT_SETTINGS})
    try:
        return AgentConfig.model_validate(fields)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            [f"with the settings that need a restart kept as they run: {p}" for p in problems],
            hint="restart the daemon (systemctl restart edge-agent) to apply this config",
        ) from None


def _dump(config: AgentConfig) -> dict[str, Any]:
    # Secrets revealed so a changed password counts as a change; only `_masked` values are shown.
    return config.model_dump(mode="json", context={REVEAL_SECRETS: True})


# --- the last good config ----------------------------------------------------------------------


class LastGoodConfig:
    """`<state_dir>/config/last-good.yaml` and, beside it, where it came from and when."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / LAST_GOOD_DIR
        self.path = self.dir / LAST_GOOD_FILE
        self.meta_path = self.dir / LAST_GOOD_META

    def save(self, text: str, source: Path | None) -> None:
        """Keep `text` (a config the daemon runs); a failure is logged, never raised."""
        meta = {
            "source": str(source) if source else None,
            "sha256": sha256_text(text),
            "saved_at": iso_utc(time.time()),
        }
        try:
            if self.path.exists() and self.path.read_text(encoding="utf-8") == text:
                return
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write_bytes(self.path, text.encode(), mode=0o600)
            atomic_write_bytes(self.meta_path, json.dumps(meta, indent=2).encode(), mode=0o600)
        except OSError as exc:
            log.warning("cannot keep the last good config in %s: %s", self.path, exc)

    def load(self) -> tuple[str, AgentConfig, dict[str, Any]] | None:
        """(text, config, meta), or None when there is none or it no longer validates (logged)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        try:
            config = parse_config(text, source=str(self.path))
        except ConfigError as exc:
            log.error("the last good config %s is not valid any more: %s", self.path, exc)
            return None
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        return text, config, meta if isinstance(meta, dict) else {}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class LoadedConfig:
    """The config a daemon runs and where it came from. `problems`: `path` did not validate and
    this is the last good config standing in for it."""

    config: AgentConfig
    path: Path | None
    text: str | None
    problems: list[str] = field(default_factory=list)
    last_good_saved_at: str | None = None

    @property
    def running_last_good(self) -> bool:
        return bool(self.problems)


def load_for_run(path: Path) -> LoadedConfig:
    """`path`'s config; when it is invalid, the last good one (the problems logged and kept for the
    status). Raises the ConfigError when there is no last good config to fall back on."""
    path = path.absolute()  # a reload re-reads it, whatever the working directory is by then
    try:
        text, config = read_config(path)
        return LoadedConfig(config, path, text)
    except ConfigError as exc:
        last_good = LastGoodConfig(state_dir_of(path)).load()
        if last_good is None:
            raise
        text, config, meta = last_good
        log.error(
            "%s is not valid (%d problem(s)); running the last good config instead (saved %s from "
            "%s). Fix the file, then `systemctl reload edge-agent`:\n  %s",
            path,
            len(exc.problems),
            meta.get("saved_at", "?"),
            meta.get("source", "?"),
            "\n  ".join(exc.problems),
        )
        return LoadedConfig(config, path, text, list(exc.problems), meta.get("saved_at"))
