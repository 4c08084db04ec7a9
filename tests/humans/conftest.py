"""The real receivers the humans tests share: an SMTP server (STARTTLS, login) and a webhook
receiver, both on 127.0.0.1, started and stopped by each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from humanskit import HookReceiver, SmtpServer, running_hooks, start_smtp


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[SmtpServer]:
    server = start_smtp(tmp_path)
    try:
        yield server
    finally:
        server.controller.stop()


@pytest.fixture
async def hooks() -> AsyncIterator[HookReceiver]:
    async with running_hooks() as receiver:
        yield receiver
