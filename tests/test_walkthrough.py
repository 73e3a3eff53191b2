"""The README's "Using it" commands and scripts/walkthrough.py agree: every command the README shows is
walked there (in order, each checked for its exit status and key output: scripts/walkthrough.sh runs
it on a clean clone after the quick start) or named in NOT_WALKED with the reason."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
NOUNS_WITH_VERBS = {"config", "registry", "models", "fleet"}


def _walkthrough() -> ModuleType:
    spec = importlib.util.spec_from_file_location("walkthrough", ROOT / "scripts/walkthrough.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_commands() -> list[tuple[str, str]]:
    """(head, line) of each command in the README's "Using it" block: `models pull`, `run`, ..."""
    section = (ROOT / "README.md").read_text().split("\n## Using it", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    found = []
    for line in block.splitlines():
        words = re.sub(r"^sudo ", "", line.strip()).split()
        if line.strip().startswith("systemctl reload"):
            found.append(("systemctl reload", line))
        elif words[:1] == ["edge-agent"] and len(words) > 1:
            head = " ".join(words[1:3]) if words[1] in NOUNS_WITH_VERBS else words[1]
            found.append((head, line))
    return found


def test_every_readme_command_is_walked_or_says_why_not() -> None:
    walk = _walkthrough()
    commands = readme_commands()
    assert len(commands) >= 25, commands  # the block was read
    unwalked = [
        line
        for head, line in commands
        if head not in walk.WALKED and not any(key in f"{head} {line}" for key in walk.NOT_WALKED)
    ]
    assert unwalked == []


def test_the_walk_runs_what_it_says_it_walks() -> None:
    walk = _walkthrough()
    source = (ROOT / "scripts/walkthrough.py").read_text()
    readme_heads = {head for head, _ in readme_commands()}
    assert readme_heads >= walk.WALKED  # nothing claimed that the README does not show
    for head in walk.WALKED - {"systemctl reload"}:
        quoted = ", ".join(f'"{word}"' for word in head.split())
        assert quoted in source, f"scripts/walkthrough.py never runs `edge-agent {head}`"
    assert "signal.SIGHUP" in source  # what `systemctl reload edge-agent` sends
