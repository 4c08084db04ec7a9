"""Pure parts of the A2A binding (no network, no SDK): state and content mappings, the push
allowlist, the card, the wire types."""

from __future__ import annotations

import importlib.util
import json
import os

import msgspec
import pytest

from synapse.a2a import mapping, wire
from synapse.a2a.card import build_card, example_value
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.server.push import PushAllowlist
from synapse.demo.handler import CAPABILITIES
from synapse.types import (
    MissingField,
    TaskError,
    TaskNeedInfoPayload,
    TaskResult,
    TaskState,
)


def test_the_official_sdk_is_installed_for_the_interop_tests() -> None:
    """Without the SDK the interop tests are not collected: outside CI that is a skip naming
    what to install; under CI=true it fails, since the interop would silently not be tested."""
    missing = [n for n in ("a2a", "uvicorn", "httpx") if importlib.util.find_spec(n) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} missing: pip install 'a2a-sdk[http-server]' uvicorn httpx"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the A2A interop tests did not run under CI: {reason}")
    pytest.skip(f"the A2A interop tests did not run: {reason}")


def test_every_synapse_state_maps_to_the_issue_table() -> None:
    assert set(mapping.STATE_MAP) == set(TaskState)
    expected = {
        wire.SUBMITTED: {"idle", "pending", "confirmed"},
        wire.WORKING: {"executing", "info_provided", "human_approved"},
        wire.INPUT_REQUIRED: {"info_needed", "need_human", "human_deciding"},
        wire.COMPLETED: {"completed"},
        wire.FAILED: {"failed", "human_rejected"},
        wire.CANCELED: {"cancelled"},
        wire.REJECTED: {"rejected"},
    }
    for a2a_state, synapse_states in expected.items():
        assert {s.value for s, a in mapping.STATE_MAP.items() if a == a2a_state} == synapse_states
    for a2a_state, final in mapping.FINAL_STATE_MAP.items():
        assert mapping.STATE_MAP[final] == a2a_state


def message(*parts: wire.Part, **fields: object) -> wire.Message:
    return wire.Message(message_id="m", role=wire.ROLE_USER, parts=list(parts), **fields)  # type: ignore[arg-type]


def test_payload_task_type_and_numbers() -> None:
    text = message(wire.text_part("hello"), wire.text_part("world"))
    assert mapping.payload_of(text) == {"text": "hello\nworld"}
    assert mapping.task_type_of(text, "echo") == "echo"
    data = message(
        wire.text_part("ignored"),
        wire.data_part({"steps": 3.0, "delay": 0.5}),
        metadata={"task_type": "slow"},
    )
    assert mapping.payload_of(data) == {"steps": 3, "delay": 0.5}
    assert isinstance(mapping.payload_of(data)["steps"], int)
    assert mapping.task_type_of(data, None) == "slow"
    with pytest.raises(A2AError) as caught:
        mapping.task_type_of(text, None)
    assert caught.value.code == A2ACode.INVALID_PARAMS
    with pytest.raises(A2AError) as caught:
        mapping.payload_of(message(wire.Part()))  # a part with no content at all
    assert caught.value.code == A2ACode.CONTENT_TYPE_NOT_SUPPORTED
    assert mapping.payload_of(message(wire.Part(url="https://x/f.pdf"))) == {
        "files": [{"url": "https://x/f.pdf"}]
    }
    assert mapping.json_numbers([1.0, 1.5, {"a": 2.0}, True]) == [1, 1.5, {"a": 2}, True]
    assert mapping.json_numbers(1e300) == 1e300  # beyond 2**53: left as it is


def test_follow_up_contents() -> None:
    need = TaskNeedInfoPayload(task_id="t", missing_fields=[MissingField(field="style")])
    assert mapping.info_fields(message(wire.text_part(" 现代 ")), need) == {"style": "现代"}
    assert mapping.info_fields(message(wire.data_part({"style": "a"})), need) == {"style": "a"}
    two = TaskNeedInfoPayload(
        task_id="t", missing_fields=[MissingField(field="a"), MissingField(field="b")]
    )
    with pytest.raises(A2AError):
        mapping.info_fields(message(wire.text_part("x")), two)
    assert mapping.decision_of(message(wire.text_part("Approve."))) == (True, {}, "", "")
    assert mapping.decision_of(message(wire.text_part("reject too risky"))) == (
        False,
        {},
        "too risky",
        "",
    )
    assert mapping.decision_of(message(wire.data_part({"approve": True}))) == (True, {}, "", "")
    approve = wire.data_part({"action": "approve", "approved_fields": {"authorized": True}})
    assert mapping.decision_of(message(approve))[:2] == (True, {"authorized": True})
    with pytest.raises(A2AError):
        mapping.decision_of(message(wire.text_part("maybe")))


@pytest.mark.parametrize(
    "result",
    [
        TaskResult(output_type="text", output="plain"),
        TaskResult(output_type="json", output={"a": [1, 2]}, metadata={"k": "v"}),
        TaskResult(output_type="image_url", output="https://x/img.png"),
    ],
)
def test_results_round_trip_through_artifacts(result: TaskResult) -> None:
    artifact = mapping.result_artifact(result, name="t")
    assert mapping.artifact_result([artifact]) == result


def test_status_errors() -> None:
    error = TaskError(code="execution_failed", message="boom", recoverable=True)
    status = wire.TaskStatus(
        state=wire.FAILED, message=mapping.error_message(error, task_id="t", context_id="c")
    )
    assert mapping.status_error(status) == error
    bare = wire.TaskStatus(
        state=wire.FAILED,
        message=wire.Message(message_id="x", role=wire.ROLE_AGENT, parts=[wire.text_part("no")]),
    )
    assert mapping.status_error(bare) == TaskError(code="execution_failed", message="no")


def test_the_push_allowlist() -> None:
    allow = PushAllowlist(["https://hooks.example/a2a/", "http://127.0.0.1:9000"])
    assert allow.allows("https://hooks.example/a2a/x")
    assert allow.allows("HTTPS://Hooks.Example:443/a2a/")
    assert allow.allows("http://127.0.0.1:9000/anything")
    assert not allow.allows("https://hooks.example/a2ab")
    assert not allow.allows("https://hooks.example/")
    assert not allow.allows("http://hooks.example/a2a/x")
    assert not allow.allows("https://hooks.example:8443/a2a/x")
    assert not allow.allows("https://user:pw@hooks.example/a2a/x")
    assert not allow.allows("ftp://hooks.example/a2a/x")
    assert not allow.allows("not a url")
    assert not PushAllowlist()
    with pytest.raises(ValueError, match="not an http"):
        PushAllowlist(["file:///etc"])


def test_a_push_allowlist_entry_with_any_port() -> None:
    """`host:*` allows every port of that host (a receiver on an ephemeral port), nothing
    more: the scheme, the host and the path prefix still have to match."""
    allow = PushAllowlist(["http://localhost:*/webhook", "http://127.0.0.1:*"])
    assert allow.allows("http://localhost:41234/webhook")
    assert allow.allows("http://localhost/webhook/more")
    assert allow.allows("http://127.0.0.1:9/anything")
    assert not allow.allows("http://localhost:41234/webhooks")
    assert not allow.allows("https://localhost:41234/webhook")
    assert not allow.allows("http://localhost.evil:41234/webhook")
    assert not allow.allows("http://127.0.0.1.evil/")
    for bad in ("http://h:*:1/", "ftp://h:*/", "http://u@h:*/", "http://[::1]:*/"):
        with pytest.raises(ValueError, match="not an http"):
            PushAllowlist([bad])


def test_the_card() -> None:
    card = build_card(
        CAPABILITIES,
        name="agent",
        description="",
        interfaces=[
            wire.AgentInterface(
                url="http://h/a2a", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        version="1",
        default_task_type="echo",
        push_notifications=False,
        bearer=False,
    )
    raw = json.loads(wire.encode(card))
    assert raw["capabilities"] == {
        "streaming": True,
        "extensions": raw["capabilities"]["extensions"],
    }
    assert "securitySchemes" not in raw
    examples = {s.id: json.loads(s.examples[0]) for s in card.skills}
    assert examples["slow"]["parts"] == [{"data": {"steps": 5, "delay": 0.2}}]
    assert examples["echo"]["metadata"] == {"taskType": "echo"}
    assert example_value({"type": "array", "items": {"type": "integer", "minimum": 2}}) == [2]
    assert msgspec.json.decode(wire.encode(card), type=wire.AgentCard) == card
    assert card.interface() is not None


def test_interfaces_prefer_1_0_and_refuse_0_3() -> None:
    def card(*versions: str) -> wire.AgentCard:
        interfaces = [
            wire.AgentInterface(url=f"http://h/{v}", protocol_binding="JSONRPC", protocol_version=v)
            for v in versions
        ]
        return wire.AgentCard(name="x", supported_interfaces=interfaces)

    assert card("0.3").interface() is None
    assert card("0.3", "1.2", "1.0").interface() == card("1.0").supported_interfaces[0]
    assert card("1.2").interface() is not None


def test_follow_up_dispatch_is_derived_from_the_executor_transition_table() -> None:
    from synapse.a2a.server.follow_ups import answer_builder
    from synapse.p2p.states import TRANSITIONS, Role

    info, human = answer_builder(TaskState.INFO_NEEDED), answer_builder(TaskState.NEED_HUMAN)
    assert info is not None and info.__name__ == "_info_provided"
    assert human is not None and human.__name__ == "_human_decision"
    # Every other state of the executor's table takes no answer (a working one keeps the
    # message for its handler); `human_deciding` is a requester-only state: none either.
    for state in [*TRANSITIONS[Role.EXECUTOR], TaskState.HUMAN_DECIDING]:
        if state not in (TaskState.INFO_NEEDED, TaskState.NEED_HUMAN):
            assert answer_builder(state) is None, state
