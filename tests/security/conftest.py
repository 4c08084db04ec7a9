"""Fixtures of the security tests: test CAs made by `trustme`, in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from seckit import Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    (tmp_path / "pki").mkdir()
    return Pki(trustme.CA(organization_name="Synapse test CA"), tmp_path / "pki")


@pytest.fixture
def rogue_pki(tmp_path: Path) -> Pki:
    """Another CA, which nobody trusts."""
    (tmp_path / "rogue").mkdir()
    return Pki(trustme.CA(organization_name="Rogue CA"), tmp_path / "rogue")
