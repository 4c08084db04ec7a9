"""Micro-benchmark of the wire codec and signing: µs per message, against a msgspec floor.

    python -m benchmarks.codec [--seconds 3]

For a typical signed `task_request` (~600 bytes) and a `task_status_update` it times the full
receive path (`decode_message`: I-JSON pass + typed decode), its two halves (`parse_i_json`,
`decode_typed`), `decode_head`, `encode_message`, and header- and body-mode sign + verify.
The floor is a bare `msgspec.json.decode` of the same bytes into one flat, unvalidated Struct.
Each row keeps the best of several runs; the whole run is bounded by `--seconds`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from synapse.types import (
    Sender,
    TaskContext,
    TaskRequest,
    TaskRequestPayload,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    body_signature,
    build_message,
    decode_head,
    decode_message,
    decode_typed,
    encode_message,
    header_signature,
    parse_i_json,
    verify_body_signature,
    verify_header_signature,
)

SECRETS = ["secret-2026", "secret-2025"]
ALICE = Sender(agent_id="agent-alice", endpoint="https://alice.example.com/synapse/callback")
BOB = Sender(agent_id="agent-bob", endpoint="https://bob.example.com/synapse/callback")
AT = datetime(2026, 1, 1, tzinfo=UTC)


class Flat(msgspec.Struct):
    """The envelope's members with no nesting, no constraints, no tag: the decoding floor."""

    version: str
    id: str
    type: str
    from_: Any = msgspec.field(name="from")
    to: Any = None
    timestamp: str = ""
    reply_to: str | None = None
    payload: Any = None
    signature: str | None = None


def _signed(message: Any) -> bytes:
    """The message as sent in body mode: JCS signature inside, as a sender would."""
    unsigned = encode_message(message)
    signature = body_signature(SECRETS[0], parse_i_json(unsigned))
    return encode_message(msgspec.structs.replace(message, signature=signature))


def samples() -> dict[str, tuple[Any, bytes]]:
    request = build_message(
        TaskRequest,
        TaskRequestPayload(
            task=TaskSpec(
                id="task-20260101-poem-0001",
                type="text_generation",
                deadline=datetime(2026, 1, 1, 1, tzinfo=UTC),
                payload={"prompt": "写一首诗", "style": "古典"},
            ),
            context=TaskContext(
                session_id="sess-5b1e7c",
                parent_task_id="task-20251231-anthology-0007",
                correlation_id="corr-9d04a2",
                metadata={"locale": "zh-CN"},
            ),
        ),
        sender=ALICE,
        to="agent-bob",
        message_id="msg-alice-0001",
        timestamp=AT,
    )
    update = build_message(
        TaskStatusUpdate,
        TaskStatusUpdatePayload(
            task_id="task-20260101-poem-0001",
            status=TaskState.EXECUTING,
            progress=50,
            message="正在生成内容",
        ),
        sender=BOB,
        to="agent-alice",
        message_id="msg-bob-0004",
        timestamp=AT,
    )
    return {
        "task_request": (request, _signed(request)),
        "task_status_update": (update, _signed(update)),
    }


def best_time(fn: Callable[[], object], budget: float) -> float:
    """Seconds per call: the best of five runs, each sized to about budget / 5."""
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= budget / 25 or loops >= 1 << 24:
            break
        loops *= 2
    per_run = max(1, int(loops * (budget / 5) / max(elapsed, 1e-9)))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_run):
            fn()
        best = min(best, (time.perf_counter() - start) / per_run)
    return best


def cases(message: Any, data: bytes) -> dict[str, Callable[[], object]]:
    flat = msgspec.json.Decoder(Flat)
    header = header_signature(SECRETS[1], data)
    value = parse_i_json(data)
    return {
        "msgspec floor (flat Struct)": lambda: flat.decode(data),
        "parse_i_json": lambda: parse_i_json(data),
        "decode_typed": lambda: decode_typed(data),
        "decode_message (both)": lambda: decode_message(data),
        "decode_head": lambda: decode_head(data),
        "encode_message": lambda: encode_message(message),
        "header sign + verify": lambda: verify_header_signature(
            SECRETS, data, header_signature(SECRETS[1], data)
        ),
        "header verify (2 secrets)": lambda: verify_header_signature(SECRETS, data, header),
        "body verify (JCS)": lambda: verify_body_signature(SECRETS, value),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codec", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="total time budget")
    args = parser.parse_args(argv)
    table = {name: cases(message, data) for name, (message, data) in samples().items()}
    rows = sum(len(c) for c in table.values())
    budget = args.seconds / rows
    print(f"{'operation':<28} {'message':<20} {'bytes':>5} {'µs/op':>8} {'ops/s':>9}")
    print("-" * 74)
    for name, (_, data) in samples().items():
        for label, fn in table[name].items():
            seconds = best_time(fn, budget)
            print(
                f"{label:<28} {name:<20} {len(data):>5} {seconds * 1e6:>8.2f} {1 / seconds:>9,.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
