"""Fixtures of the conformance kit's tests: a target peer (ours or a broken one) and a kit run."""

from __future__ import annotations

from typing import Any

import pytest
from brokenpeers import KIT_ID, SECRET, TARGET_ID, DemoPeer, RunKit

from synapse.conformance import Report, Timing, run_conformance


@pytest.fixture
def run_kit() -> RunKit:
    """`await run_kit(peer_class, only=...)`: start the target, run the kit against it."""

    async def run(peer_class: type[DemoPeer] = DemoPeer, **kw: Any) -> Report:
        async with peer_class() as peer:
            return await run_conformance(
                peer.endpoint,
                TARGET_ID,
                SECRET,
                kit_id=KIT_ID,
                listen="127.0.0.1:0",
                on_listening=peer.register_kit,
                timing=kw.pop("timing", Timing()),
                **kw,
            )

    return run
