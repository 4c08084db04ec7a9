"""Fixtures of the security tests: test CAs made by `trustme`, in a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from issuer import Issuer
from seckit import AUDIENCE, Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    (tmp_path / "pki").mkdir()
    return Pki(trustme.CA(organization_name="Synapse test CA"), tmp_path / "pki")


@pytest.fixture
def rogue_pki(tmp_path: Path) -> Pki:
    """Another CA, which nobody trusts."""
    (tmp_path / "rogue").mkdir()
    return Pki(trustme.CA(organization_name="Rogue CA"), tmp_path / "rogue")


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    """A local OAuth 2.0 / OpenID Connect issuer on loopback."""
    running = Issuer(audience=AUDIENCE)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
