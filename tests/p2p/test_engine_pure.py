"""The core is pure: it writes only the `now` it is given, mints ids from the factory it is
given, and importing it loads no asyncio, structlog or aiohttp."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pairing import T0, Pair, at

from synapse.p2p.engine import Step
from synapse.p2p.states import Event
from synapse.types import LocalProtocolError, ProtocolError, RemoteProtocolError, TaskState

CORE_MODULES = (
    "synapse.p2p.engine",
    "synapse.p2p.states",
    "synapse.p2p.timers",
    "synapse.p2p.config",
    "synapse.p2p.dedup",
)
IO_MODULES = ("asyncio", "structlog", "aiohttp")


@pytest.mark.parametrize("module", CORE_MODULES)
def test_importing_the_core_loads_no_io(module: str) -> None:
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps([m for m in {list(IO_MODULES)!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == []


def test_the_runtime_does_load_asyncio() -> None:
    """The check above can fail: the runtime's own modules do load it."""
    code = "import sys, synapse.runtime.protocol; print('asyncio' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "True"


def test_every_message_carries_the_fake_clock_and_no_wall_clock() -> None:
    """A reply to a message at a fake 2026-01-01 carries 2026-01-01, never today's time."""
    pair = Pair(now=T0)
    key = pair.submit("echo")
    pair.deliver_all()
    pair.complete(key, "done")
    pair.deliver_all()
    assert pair.states(key) == (TaskState.COMPLETED, TaskState.COMPLETED)
    stamps = set()
    for exchange in pair.log:
        stamps.add(exchange.message.timestamp)
        if exchange.reply is not None:
            stamps.add(exchange.reply.timestamp)
    assert stamps and all(stamp.year == 2026 and stamp.month == 1 for stamp in stamps)
    assert max(stamps) <= at(pair.now)


def test_ids_come_from_the_factory_the_engine_is_given() -> None:
    first, second = Pair(deterministic_ids=True), Pair(deterministic_ids=True)
    for pair in (first, second):
        pair.submit("echo", task_id=None)
        pair.deliver_all()
    ids = [
        [(x.message.id, x.reply.id if x.reply else None) for x in p.log] for p in (first, second)
    ]
    assert ids[0] == ids[1]
    assert ids[0][0][0] == "msg-r1" and ids[0][0][1].startswith("msg-e")


def test_a_local_step_the_table_refuses_fails_loudly() -> None:
    """A table bug on our side is a LocalProtocolError, not a nack for the partner; a received
    message the state does not allow stays a RemoteProtocolError (the partner's fault)."""
    pair = Pair()
    key = pair.submit("echo")
    pair.deliver_all()
    rec = pair.e.get(key)
    assert rec is not None and rec.state is not TaskState.IDLE
    before = rec.state
    with pytest.raises(LocalProtocolError) as raised:
        pair.e._move(rec, Event.SEND_TASK_CONFIRM, pair.now, None, Step())
    assert isinstance(raised.value, ProtocolError)
    assert not isinstance(raised.value, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError):
        pair.e._move(rec, Event.RECV_TASK_INFO_PROVIDED, pair.now, None, Step())
    assert rec.state is before


def test_the_two_kinds_share_one_base() -> None:
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(LocalProtocolError, ProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
