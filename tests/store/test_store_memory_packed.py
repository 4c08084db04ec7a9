"""The memory store keeps finished tasks packed (`synapse.p2p.packed`): compact, and exact.

A finished record goes in as objects and is kept as one `bytes`; `get_task` gives back a
record equal to the one put, field for field, history included, as a copy (the way a
durable store gives one): changing it changes the store only through `put_task`.
"""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from storekit import Duo

from synapse.p2p.commands import Cancel, Fail
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.p2p.packed import RECORD_DEFLATE_ABOVE, record_packer
from synapse.store.memory import MemoryStore
from synapse.types import TaskContext, TaskError, TaskResult, TaskState

#: JSON values as a decoded body holds them (I-JSON: integers within ±2^53).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def finished_duo(count: int = 3) -> tuple[Duo, list[TaskKey]]:
    duo = Duo(MemoryStore(), MemoryStore())
    keys = []
    for n in range(count):
        key = duo.submit(task_id=f"t-{n}")
        if n % 3 == 0:
            duo.complete(key)
        elif n % 3 == 1:
            duo.progress(key, 40)
            error = TaskError(code="execution_failed", message="no", details={"n": n})
            duo.deliver(duo.e, duo.e.handle(Fail(key, error), duo.tick()))
        else:
            duo.deliver(duo.r, duo.r.handle(Cancel(key, reason="enough"), duo.tick()))
        keys.append(key)
    return duo, keys


def test_finished_records_come_back_equal_from_compact_bytes() -> None:
    duo, keys = finished_duo(6)
    for side, store in (("r", duo.r_store), ("e", duo.e_store)):
        assert isinstance(store, MemoryStore)
        for key in keys:
            original = duo.record(side, key)
            assert original.is_final
            back = store.get_task(key)
            assert back == original  # every field, the history included
            assert back is not original
            updated_at, role, state, _context, kept = store._finished[(key.requester, key.task_id)]
            assert isinstance(kept, bytes)
            # Its fields without their names: well under the record as MessagePack.
            assert len(kept) < len(msgspec.msgpack.encode(original)) * 0.7
            assert (role, state) == (original.role.value, original.state.value)
            assert updated_at == original.updated_at
    states = {duo.record("r", key).state for key in keys}
    assert states == {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED}


def test_a_record_read_back_is_a_copy() -> None:
    duo, [key] = finished_duo(1)
    store = duo.r_store
    back = store.get_task(key)
    assert back is not None
    back.status_message = "changed"
    back.history.clear()
    again = store.get_task(key)
    assert again == duo.record("r", key)
    store.put_task(back, [])
    changed = store.get_task(key)
    assert changed is not None and changed.status_message == "changed"


async def test_listing_counting_and_purging_read_the_rows_not_the_records() -> None:
    duo, keys = finished_duo(6)
    store = duo.r_store
    assert isinstance(store, MemoryStore)
    assert store.count_tasks() == 6
    counts = store.count_finished()
    assert sum(counts.values()) == 6
    assert counts[("requester", TaskState.COMPLETED)] == 2
    listed = [row.key for row in store.list_tasks(limit=10)]
    assert set(listed) == set(keys)
    newest = store.list_tasks(limit=1)[0]
    assert newest.updated_at == max(duo.record("r", key).updated_at for key in keys)
    assert await store.purge(finished_before=newest.updated_at, now=duo.now, limit=100) == 5
    assert list(store.finished) == [newest.key]


@settings(max_examples=60, deadline=None)
@given(output=json_values, metadata=st.dictionaries(st.text(), json_values, max_size=3))
def test_any_json_result_round_trips_exactly(output: object, metadata: dict[str, object]) -> None:
    duo, [key] = finished_duo(1)
    record = duo.record("e", key)
    record = dataclasses.replace(
        record, result=TaskResult(output_type="text", output=output, metadata=metadata)
    )
    store = MemoryStore()
    store.put_task(record, [])
    back = store.get_task(key)
    assert back == record
    assert msgspec.json.encode(back) == msgspec.json.encode(record)


def test_a_value_messagepack_cannot_hold_is_kept_as_objects() -> None:
    duo, [key] = finished_duo(1)
    record = duo.record("e", key)
    huge = dataclasses.replace(record, result=TaskResult(output_type="n", output=2**70))
    store = MemoryStore()
    store.put_task(huge, [])
    kept = store._finished[(key.requester, key.task_id)][4]
    assert isinstance(kept, TaskRecord)
    assert store.get_task(key) == huge


def test_the_packer_round_trips_its_own_sample() -> None:
    packer = record_packer()
    duo, [key] = finished_duo(1)
    record = duo.record("e", key)
    assert packer.unpack(packer.pack(record)) == record


def test_a_history_naming_another_task_is_kept_as_objects() -> None:
    duo, [key] = finished_duo(1)
    record = duo.record("e", key)
    other = msgspec.structs.replace(record.history[0], key=TaskKey("agent-x", "t-x"))
    odd = dataclasses.replace(record, history=[other, *record.history[1:]])
    store = MemoryStore()
    store.put_task(odd, [])
    kept = store._finished[(key.requester, key.task_id)][4]
    assert isinstance(kept, TaskRecord)
    assert store.get_task(key) == odd


def test_a_long_record_is_deflated_as_well() -> None:
    duo, [key] = finished_duo(1)
    record = duo.record("e", key)
    # Like an A2A task's record: its context carries the first A2A message.
    message = {"messageId": "m" * 32, "role": "ROLE_USER", "parts": [{"text": "hello"}] * 16}
    context = TaskContext(session_id="s-1", metadata={"a2a": {"message": message}})
    long = dataclasses.replace(record, context=context)
    plain = len(msgspec.msgpack.encode(record_packer()._values(long)))
    assert plain > RECORD_DEFLATE_ABOVE
    store = MemoryStore()
    store.put_task(long, [])
    kept = store._finished[(key.requester, key.task_id)][4]
    assert isinstance(kept, bytes) and len(kept) < plain / 2
    assert store.get_task(key) == long
