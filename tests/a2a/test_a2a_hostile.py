"""A2A input gets the same scrutiny as Synapse input (issue 12 §2).

JSON-RPC bodies go through the I-JSON parser of the envelopes: duplicate member names, lone
surrogates, non-finite numbers and out-of-range integers are parse errors (-32700); nesting
deeper than the parser's limit is an invalid request (-32600); none of them is -32603 and
none leaves a task behind, so a flood of them cannot use up the capacity. Anything that
fails while a task is being created rolls back the engine, its capacity and the store.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from a2akit import A2APeer
from test_a2a_binding import V1, code, rpc, send_params

from synapse.store import StoreUnavailable


def send_body(text_literal: str) -> bytes:
    """A SendMessage whose text part is `text_literal` (raw JSON text, escapes and all)."""
    return (
        '{"jsonrpc":"2.0","id":"req-1","method":"SendMessage","params":{"message":'
        '{"messageId":"m-1","role":"ROLE_USER","parts":[{"text":' + text_literal + "}]}}}"
    ).encode()


def footprint(a2a_peer: A2APeer) -> tuple[int, int, int]:
    engine = a2a_peer.peer.protocol.engine
    return len(engine.tasks), engine.active_executor_tasks(), len(a2a_peer.a2a.tasks)


NOT_I_JSON = {
    "lone high surrogate": send_body('"\\ud800"'),
    "lone low surrogate": send_body('"a\\udc00b"'),
    "duplicate member": b'{"jsonrpc":"2.0","id":"req-1","method":"SendMessage","method":"x",'
    b'"params":{}}',
    "duplicate in params": send_body('"x","text":"y"'),
    "NaN": send_body('"x","metadata":NaN'),
    "Infinity": b'{"jsonrpc":"2.0","id":"req-1","method":"ListTasks","params":{"pageSize":1e400}}',
    "big integer": b'{"jsonrpc":"2.0","id":"req-1","method":"ListTasks",'
    b'"params":{"pageSize":9007199254740993}}',
    "invalid UTF-8": send_body('"\xff"'.encode("latin-1").decode("latin-1")).replace(
        b"\xc3\xbf", b"\xff"
    ),
}


@pytest.mark.parametrize("name", sorted(NOT_I_JSON))
async def test_not_i_json_is_a_parse_error_and_leaves_nothing(a2a_peer: A2APeer, name: str) -> None:
    before = footprint(a2a_peer)
    _, answer = await rpc(a2a_peer.base_url, "SendMessage", body=NOT_I_JSON[name], headers=V1)
    assert code(answer) == -32700, answer
    assert footprint(a2a_peer) == before


async def test_a_flood_of_lone_surrogates_cannot_lock_partners_out(a2a_peer: A2APeer) -> None:
    limit = a2a_peer.peer.config.max_concurrent_tasks
    for _ in range(limit + 20):
        _, answer = await rpc(
            a2a_peer.base_url, "SendMessage", body=send_body('"\\ud83d"'), headers=V1
        )
        assert code(answer) == -32700, answer
    assert footprint(a2a_peer) == (0, 0, 0)
    _, listed = await rpc(a2a_peer.base_url, "ListTasks", {})
    assert "result" in listed, listed
    _, ok = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="hello"))
    assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", ok


DEEP = "@@deep@@"


@pytest.mark.parametrize(
    ("where", "depth"),
    [("params", 1000), ("data", 900), ("metadata", 500), ("params", 129), ("data", 5000)],
)
async def test_deep_nesting_is_a_client_error(a2a_peer: A2APeer, where: str, depth: int) -> None:
    before = footprint(a2a_peer)
    if where == "params":
        params: dict[str, Any] = {"x": DEEP}
    elif where == "data":
        params = send_params(data={"deep": DEEP})
    else:
        params = send_params(text="x", metadata={"deep": DEEP})
    text = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params})
    body = text.replace(f'"{DEEP}"', "[" * depth + "1" + "]" * depth).encode()
    _, answer = await rpc(a2a_peer.base_url, "SendMessage", body=body, headers=V1)
    assert code(answer) in (-32600, -32602), answer
    assert footprint(a2a_peer) == before


async def test_a_failure_while_a_task_is_created_rolls_everything_back(
    a2a_peer: A2APeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = a2a_peer.peer.store
    failing = True
    original = store.put_task

    def put_task(record: Any, transitions: Any) -> None:
        if failing:
            raise ValueError("cannot encode this record")
        original(record, transitions)

    monkeypatch.setattr(store, "put_task", put_task)
    limit = a2a_peer.peer.config.max_concurrent_tasks
    for _ in range(limit + 5):
        _, answer = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="x"))
        assert "error" in answer, answer
    assert footprint(a2a_peer) == (0, 0, 0)
    assert not getattr(store, "outbox", {}), "no callback of a rolled-back task is queued"
    failing = False
    _, ok = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="hello"))
    assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", ok


async def test_a_store_that_cannot_write_refuses_the_task_and_keeps_nothing(
    a2a_peer: A2APeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    protocol = a2a_peer.peer.protocol

    async def failing_commit(*, discard_after: int | None = None) -> None:
        raise StoreUnavailable("disk full")

    monkeypatch.setattr(protocol.store, "commit", failing_commit)
    _, answer = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="x"))
    assert code(answer) == -32101, answer  # agent not ready: retry later
    assert footprint(a2a_peer) == (0, 0, 0)
