"""A postprocessor plugin installed the way pip leaves a package: the module and its dist-info
with the `edge_agent.postprocessors` entry points (docs/plugins.md)."""

from __future__ import annotations

from pathlib import Path


def install_plugin(
    site: Path, distribution: str, module: str, source: str, entry_points: dict[str, str]
) -> None:
    """`module`/__init__.py holding `source`, and `<distribution>-1.0.dist-info` naming
    `entry_points` (entry-point name -> "module:function") in site (a folder on sys.path)."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[edge_agent.postprocessors]\n{lines}")
