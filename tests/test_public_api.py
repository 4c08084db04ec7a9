"""`synapse` exports what a handler author needs and nothing else; public names are unique."""

from __future__ import annotations

import ast
import enum
import importlib.metadata
from pathlib import Path
from typing import Protocol, get_args

import synapse
from synapse.p2p.engine import TaskEvent, TaskEventKind, TaskNote
from synapse.types import MessageType

PACKAGE = Path(synapse.__file__).resolve().parent

EXPECTED = {
    "TaskHandler",
    "ResumableHandler",
    "ExecutionContext",
    "Validation",
    "MissingField",
    "Reason",
    "HumanContext",
    "HumanOption",
    "TaskResult",
    "Peer",
    "Partner",
    "P2PConfig",
    "SynapseException",  # the root of every exception the package raises
    "ProtocolError",
    "NackError",  # a refusal answered with a nack: one of the two below
    "RemoteProtocolError",
    "NotReady",
    "LocalProtocolError",
    "DeliveryError",
    # what `Peer.submit` returns and what its handle says (issue 27: `from synapse import
    # TaskHandle` works, as the README says)
    "TaskHandle",
    "TaskEvent",
    "TaskEventKind",
    "TaskNote",
    "Outcome",
    "TaskAbandoned",
    "TaskUndeliverable",
    "TaskFailure",
    "__version__",
}


def test_the_public_api_is_exactly_the_handler_authors_names() -> None:
    assert set(synapse.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(synapse, name) is not None
    assert not hasattr(synapse, "DemoHandler")


def test_errors_are_one_hierarchy() -> None:
    assert issubclass(synapse.RemoteProtocolError, synapse.ProtocolError)
    assert issubclass(synapse.LocalProtocolError, synapse.ProtocolError)
    from synapse.runtime.sender import DeliveryError as RuntimeDeliveryError
    from synapse.types import SynapseError
    from synapse.types.errors import DeliveryError

    assert RuntimeDeliveryError is DeliveryError is synapse.DeliveryError
    assert SynapseError is synapse.RemoteProtocolError


def test_no_two_public_classes_share_a_name() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: where for name, where in seen.items() if len(where) > 1}
    assert shared == {}


def test_task_event_kind_is_the_message_types_and_the_notes_comparing_as_text() -> None:
    """An event's kind is a message type (declared once, in `MessageType`) or a note: both
    enums of text, so `kind == "p2p:task_need_info"` holds as it always did."""
    assert TaskEvent.__dataclass_fields__["kind"].type in ("TaskEventKind", TaskEventKind)
    assert get_args(TaskEventKind) == (MessageType, TaskNote)
    assert issubclass(TaskNote, enum.StrEnum) and issubclass(MessageType, enum.StrEnum)
    assert MessageType.TASK_NEED_INFO == "p2p:task_need_info"
    assert isinstance(MessageType.TASK_NEED_INFO, TaskEventKind)
    assert {"partner_unreachable", "partner_reachable", "undeliverable", "refused"} <= set(TaskNote)
    assert not set(TaskNote) & set(MessageType)  # a note never reads as a message type


def test_a_resumable_handler_is_a_declared_protocol() -> None:
    assert issubclass(synapse.ResumableHandler, Protocol)  # type: ignore[arg-type]

    class Plain:
        def get_capabilities(self) -> list[str]:
            return []

        def validate_task(self, task_type: str, payload: dict[str, object]) -> bool:
            return True

        async def execute_task(self, ctx: object, task_type: str, payload: object) -> None:
            return None

    class Resumable(Plain):
        def is_resumable(self, task_type: str) -> bool:
            return True

    assert isinstance(Resumable(), synapse.ResumableHandler)
    assert not isinstance(Plain(), synapse.ResumableHandler)


def test_the_version_lives_in_one_place() -> None:
    assert synapse.__version__ == importlib.metadata.version("synapse-agent-p2p")
    init = (PACKAGE / "__init__.py").read_text("utf-8")
    assert synapse.__version__ not in init


def test_capacity_policy_is_gone() -> None:
    from synapse.p2p.config import P2PConfig

    assert "capacity_policy" not in P2PConfig.__dataclass_fields__
