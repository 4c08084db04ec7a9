"""The demo handler, logging every start of a handler (`task_id` a line) to the file named
by `SYNAPSE_TEST_EXECUTIONS`: the partition runs count executions across replicas and
namespaces (one file, appended by every replica)."""

from __future__ import annotations

import os
from typing import Any

from synapse.demo.handler import DemoHandler
from synapse.runtime.handler import ExecutionContext


class CountingDemo(DemoHandler):
    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        path = os.environ.get("SYNAPSE_TEST_EXECUTIONS")
        if path:
            # One write per line with O_APPEND: lines of several processes never interleave.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{ctx.task_id}\n".encode())
            finally:
                os.close(fd)
        return await super().execute_task(ctx, task_type, payload)
