"""Typed errors. Each says what is wrong and, where it helps, what to do (`hint`).

The CLI maps these to exit codes and --json; the daemon logs them and keeps serving.
"""

from __future__ import annotations


class EdgeAgentError(Exception):
    """Base of every error the agent reports to a user."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class ConfigError(EdgeAgentError):
    """A config file (or document) is invalid; `problems` holds one line per problem."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        super().__init__("\n".join(problems), hint)
        self.problems = problems


class DesiredStateError(EdgeAgentError):
    """A desired-state document (docs/fleet.md) is refused; `problems` holds one line per problem,
    each `<layer>: <JSON path>: message`, e.g. `group:lobby: $.pipelines.door-cam.source.uri: ...`.
    Not a ConfigError: a bad document from the broker never stops the agent, its layer is dropped."""

    def __init__(self, layer: str, problems: list[str], hint: str | None = None) -> None:
        super().__init__("\n".join(problems), hint)
        self.layer = layer
        self.problems = problems


class RegistryError(EdgeAgentError):
    """The registry cannot be reached, or its answer is not a valid model version."""


class StoreError(EdgeAgentError):
    """The local model store cannot install or find an artifact."""


class IntegrityError(StoreError):
    """An artifact's bytes do not match its manifest (sha256 or size)."""


class ModelError(EdgeAgentError):
    """A model file cannot be loaded or run by any backend."""


class SourceError(EdgeAgentError):
    """A camera or sensor source cannot be opened or read."""
