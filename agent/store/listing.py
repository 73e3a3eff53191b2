"""What `edge-agent models list` shows of the store, as rows of plain data: every installed version,
its files and who signed it. The CLI prints them (agent/cli/render/models.py), the web page's models
page shows them (agent/web/models_page.py): one listing for both."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.store import ModelStore


def installed_rows(store: ModelStore) -> list[dict[str, Any]]:
    """Per installed version: name, version, signed_by (the trusted signer, None: unchecked or
    unsigned), and its artifacts (file, format, size, sha256, target; a reduced-precision variant's
    precision and made_from too)."""
    return [
        {
            "name": m.name,
            "version": m.version,
            "signed_by": m.signed_by,
            "artifacts": [
                {
                    "file": a.file,
                    "format": a.format,
                    "size": a.size,
                    "sha256": a.sha256,
                    "target": a.target,
                    **variant_fields(a.precision, a.made_from),
                }
                for a in m.manifest.artifacts
            ],
        }
        for m in store.list()
    ]


def variant_fields(precision: str | None, made_from: str | None) -> dict[str, str]:
    """A reduced-precision variant's `precision` and `made_from` (registry publish --quantize), as
    `models list`, `models inspect` and the models page show them; {} for any other file, so the
    output of versions without variants is as it was."""
    if precision is None or made_from is None:
        return {}
    return {"precision": precision, "made_from": made_from}


def variant_note(artifact: dict[str, Any]) -> str | None:
    """ "precision: int8, made from 320n.onnx" for a reduced-precision variant, else None."""
    if artifact.get("precision") is None:
        return None
    return f"precision: {artifact['precision']}, made from {artifact['made_from']}"
