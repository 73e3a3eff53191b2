"""Reported state stays within the broker's packet limit however many pipelines a box runs."""

from __future__ import annotations

import json

from agent.fleet.reconciler import _fit


def _document(pipelines: int) -> dict[str, object]:
    return {
        "device": "box",
        "pipelines": {
            f"cam-{i}": {
                "phase": "running",
                "model": "m@1",
                "backend_why": "w" * 500,
                "reason": "r" * 500,
                "last_error": "e" * 500,
            }
            for i in range(pipelines)
        },
        "refused": [{"reason": "x" * 600}] * 10,
    }


def test_a_small_document_is_sent_whole() -> None:
    payload = _fit(_document(3), 262_144)
    assert "trimmed" not in json.loads(payload) and len(json.loads(payload)["refused"]) == 10


def test_many_pipelines_lose_their_long_texts_first_and_fit() -> None:
    payload = _fit(_document(200), 65_536)
    state = json.loads(payload)
    assert len(payload) <= 65_536 and state["trimmed"] is True
    assert len(state["pipelines"]) == 200  # every pipeline's phase and model is still there
    assert all(p["phase"] == "running" and p["model"] == "m@1" for p in state["pipelines"].values())
