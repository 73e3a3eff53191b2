"""Where a config's state dir is, read without building the config models (agent/config/): `edge-agent
status` asks it of the config at every start, and a daemon whose config does not validate looks there
for its last good one (agent/reload.py)."""

from __future__ import annotations

from pathlib import Path

# AgentConfig's default `state_dir`.
DEFAULT_STATE_DIR = Path("/var/lib/edge-agent")


def state_dir_of(path: Path, default: Path = DEFAULT_STATE_DIR) -> Path:
    """Where a config's state dir is, even when the config does not validate: its `state_dir` when
    the file still parses that far, else `default` (the config's own default state dir)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return default
    value = data.get("state_dir") if isinstance(data, dict) else None
    return Path(value) if isinstance(value, str) and value and "${" not in value else default
