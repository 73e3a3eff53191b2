"""edge-agent: the edge ML deployment daemon (see docs/architecture.md)."""

__version__ = "0.1.0"
