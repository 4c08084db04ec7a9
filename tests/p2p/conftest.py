"""Fixtures of the sans-IO engine tests: a paired requester and executor on a fake clock."""

from __future__ import annotations

import pytest
from pairing import Pair


@pytest.fixture
def pair() -> Pair:
    return Pair()
