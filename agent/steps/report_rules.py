"""Report rules: whether a frame's result is worth publishing (agent/rules.py), a gate.

A frame held back by the rules, with no tracking events either, ends here: nothing to report.
"""

from __future__ import annotations

from agent.config import ReportConfig
from agent.rules import ReportRules
from agent.steps.base import FrameRecord, Step


class ReportRulesStep(Step):
    name = "report rules"
    thread = "report"
    gate = True

    def __init__(self, config: ReportConfig, rules: ReportRules) -> None:
        super().__init__()
        self.config = config
        self.rules = rules  # the stage's: its held-back counts show in the status

    def run(self, record: FrameRecord) -> bool:
        assert record.output is not None
        record.publish = self.config.results and self.rules.check(record.output, record.captured_at) is None
        if not record.publish and not record.events:
            return False  # a good frame, only not worth a message (counted by its rule)
        record.held_back = self.rules.take_held_count() if record.publish else 0
        return True
