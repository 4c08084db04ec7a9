"""A resumable handler for the replica tests: the demo handler, whose `slow` tasks a replica
that takes them over starts again (`ResumableHandler.is_resumable`)."""

from __future__ import annotations

from synapse.demo.handler import DemoHandler


class ResumableDemo(DemoHandler):
    def is_resumable(self, task_type: str) -> bool:
        return task_type == "slow"
