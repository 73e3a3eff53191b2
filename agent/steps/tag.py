"""Tag: the pipeline's own tags on each result it publishes (`report.tags`: site, door, camera).

A consumer routes or filters on them (Node-RED, a rule in the fleet's back end) without a table of
which pipeline on which box is where. Added as the example of a new step: this module and one line
in agent/steps/__init__.py `build_steps`.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.steps.base import FrameRecord, Step


class TagStep(Step):
    name = "tags"
    thread = "report"

    def __init__(self, tags: Mapping[str, str]) -> None:
        super().__init__()
        self.tags = dict(tags)

    def run(self, record: FrameRecord) -> bool:
        record.tags.update(self.tags)
        return True
