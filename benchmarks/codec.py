"""Micro-benchmark of the wire codec and signing: µs per message, side by side with pydantic v2,
plain `json` + dicts, and a msgspec floor.

    python -m benchmarks.codec [--seconds 3]

For a typical signed `task_request` (~600 bytes) and a `task_status_update` it times:

- decode + validate: Synapse's typed decode (`decode_typed`), the full receive path
  (`decode_message` = the I-JSON pass `parse_i_json` + the typed decode), `decode_head`; the
  same shapes as pydantic v2 models (`model_validate_json` into the one known model, no union
  dispatch: the easy case for pydantic); `json.loads` into dicts (no validation at all); and
  the floor: a bare `msgspec.json.decode` of the same bytes into one flat, unvalidated Struct;
- encode: `encode_message`, pydantic's `model_dump_json`, `json.dumps` of the dicts;
- HMAC-SHA256 sign + verify, header mode (the default) and body mode (RFC 8785).

Every case is timed in rounds that interleave all of them, keeping each case's best round, so
that the ratios compare runs made at the same moment. The whole run is bounded by `--seconds`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec

from benchmarks._common import Section, Table, ratio
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
    build_message_now,
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
ROUNDS = 5


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


# --- the same shapes as pydantic v2 models ------------------------------------------------------


def pydantic_models() -> dict[str, Any]:
    """`task_request` and `task_status_update` as pydantic v2 models, with Synapse's constraints
    (lengths, the version pattern, aware datetimes, enums, percent range; unknown members
    ignored)."""
    from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

    from synapse.types import Priority

    non_empty = Annotated[str, Field(min_length=1)]
    task_id = Annotated[str, Field(min_length=1, max_length=256)]
    message_id = Annotated[str, Field(min_length=1, max_length=128)]
    version = Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+$")]
    percent = Annotated[int, Field(ge=0, le=100)] | Annotated[float, Field(ge=0, le=100)]

    class Model(BaseModel):
        model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    class PSender(Model):
        agent_id: non_empty
        endpoint: non_empty

    class PRecipient(Model):
        agent_id: non_empty

    class PTaskSpec(Model):
        id: task_id
        type: non_empty
        priority: Priority = Priority.NORMAL
        deadline: AwareDatetime | None = None
        payload: dict[str, Any] = Field(default_factory=dict)

    class PTaskContext(Model):
        session_id: str | None = None
        parent_task_id: str | None = None
        correlation_id: str | None = None
        metadata: dict[str, Any] = Field(default_factory=dict)

    class PTaskRequestPayload(Model):
        task: PTaskSpec
        context: PTaskContext | None = None

    class PStatusPayload(Model):
        task_id: task_id
        status: TaskState
        progress: percent | None = None
        message: str = ""
        intermediate_result: Any = None

    class PEnvelope(Model):
        version: version
        id: message_id
        from_: PSender = Field(alias="from")
        to: PRecipient
        timestamp: AwareDatetime
        reply_to: message_id | None = None
        signature: str | None = None

    class PTaskRequest(PEnvelope):
        type: Literal["p2p:task_request"]
        payload: PTaskRequestPayload

    class PTaskStatusUpdate(PEnvelope):
        type: Literal["p2p:task_status_update"]
        payload: PStatusPayload

    return {"task_request": PTaskRequest, "task_status_update": PTaskStatusUpdate}


# --- samples -------------------------------------------------------------------------------------


def _signed(message: Any) -> bytes:
    """The message as sent in body mode: JCS signature inside, as a sender would."""
    unsigned = encode_message(message)
    signature = body_signature(SECRETS[0], parse_i_json(unsigned))
    return encode_message(msgspec.structs.replace(message, signature=signature))


def samples() -> dict[str, tuple[Any, bytes]]:
    request = build_message_now(
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
    update = build_message_now(
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


# --- timing --------------------------------------------------------------------------------------


def calibrate(fn: Callable[[], object], target: float) -> int:
    """Calls of `fn` that take about `target` seconds."""
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= target / 4 or loops >= 1 << 24:
            return max(1, int(loops * target / max(elapsed, 1e-9)))
        loops *= 2


def best_times(cases: dict[str, Callable[[], object]], budget: float) -> dict[str, float]:
    """Seconds per call of each case: the best of `ROUNDS` interleaved rounds."""
    slice_ = budget / (ROUNDS + 1) / max(1, len(cases))
    loops = {name: calibrate(fn, slice_) for name, fn in cases.items()}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in cases.items():
            n = loops[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / n)
    return best


DECODE = "decode + validate"
ENCODE = "encode"
SIGN = "sign / verify"


def cases(message: Any, data: bytes, model: Any) -> dict[str, tuple[str, Callable[[], object]]]:
    """Label → (group, callable). The labels are the rows of the table."""
    flat = msgspec.json.Decoder(Flat)
    header = header_signature(SECRETS[1], data)
    value = parse_i_json(data)
    as_dicts = json.loads(data)
    validated = model.model_validate_json(data)
    return {
        "msgspec floor (flat Struct)": (DECODE, lambda: flat.decode(data)),
        "decode_typed": (DECODE, lambda: decode_typed(data)),
        "decode_message (both)": (DECODE, lambda: decode_message(data)),
        "parse_i_json": (DECODE, lambda: parse_i_json(data)),
        "decode_head": (DECODE, lambda: decode_head(data)),
        "pydantic v2 model_validate_json": (DECODE, lambda: model.model_validate_json(data)),
        "json.loads (dicts, no checks)": (DECODE, lambda: json.loads(data)),
        "encode_message": (ENCODE, lambda: encode_message(message)),
        "pydantic v2 model_dump_json": (
            ENCODE,
            lambda: validated.model_dump_json(by_alias=True, exclude_none=True),
        ),
        "json.dumps (dicts)": (ENCODE, lambda: json.dumps(as_dicts, ensure_ascii=False)),
        "header sign + verify": (
            SIGN,
            lambda: verify_header_signature(SECRETS, data, header_signature(SECRETS[1], data)),
        ),
        "header verify (2 secrets)": (SIGN, lambda: verify_header_signature(SECRETS, data, header)),
        "body verify (JCS)": (SIGN, lambda: verify_body_signature(SECRETS, value)),
    }


#: The reference of the ratio column, per group.
REFERENCE = {DECODE: "decode_typed", ENCODE: "encode_message", SIGN: "header sign + verify"}
FLOOR = "msgspec floor (flat Struct)"


def run(seconds: float = 3.0) -> Section:
    started = time.monotonic()
    models = pydantic_models()
    table = Table(
        ["operation", "message", "bytes", "µs/op", "ops/s", "÷ Synapse", "÷ floor"],
        title="",
    )
    section = Section(
        "codec",
        "Codec: decode + validate, encode, sign (µs per message)",
        "python -m benchmarks.codec",
        tables=[table],
    )
    messages = samples()
    for name, (message, data) in messages.items():
        group_of = cases(message, data, models[name])
        times = best_times({k: fn for k, (_, fn) in group_of.items()}, seconds / len(messages))
        for label, (group, _) in group_of.items():
            t = times[label]
            reference = times[REFERENCE[group]]
            versus_floor = ratio(t / times[FLOOR]) if group == DECODE else ""
            table.add(
                label,
                name,
                len(data),
                f"{t * 1e6:.2f}",
                f"{1 / t:,.0f}",
                ratio(t / reference),
                versus_floor,
            )
        short = name.removeprefix("task_")
        typed, full = times["decode_typed"], times["decode_message (both)"]
        pyd, floor = times["pydantic v2 model_validate_json"], times[FLOOR]
        section.figures |= {
            f"codec.{short}.bytes": float(len(data)),
            f"codec.{short}.floor_us": floor * 1e6,
            f"codec.{short}.typed_us": typed * 1e6,
            f"codec.{short}.full_us": full * 1e6,
            f"codec.{short}.ijson_us": times["parse_i_json"] * 1e6,
            f"codec.{short}.pydantic_us": pyd * 1e6,
            f"codec.{short}.json_us": times["json.loads (dicts, no checks)"] * 1e6,
            f"codec.{short}.encode_us": times["encode_message"] * 1e6,
            f"codec.{short}.pydantic_encode_us": times["pydantic v2 model_dump_json"] * 1e6,
            f"codec.{short}.json_encode_us": times["json.dumps (dicts)"] * 1e6,
            f"codec.{short}.sign_verify_us": times["header sign + verify"] * 1e6,
            f"codec.{short}.body_verify_us": times["body verify (JCS)"] * 1e6,
            f"codec.{short}.pydantic_over_typed": pyd / typed,
            f"codec.{short}.pydantic_over_full": pyd / full,
            f"codec.{short}.typed_over_floor": typed / floor,
            f"codec.{short}.full_over_floor": full / floor,
        }
    section.notes += [
        "÷ Synapse: time relative to Synapse's own operation of the group (the typed "
        "decode, the encode, header sign + verify); ÷ floor: relative to the msgspec floor.",
        "Typed decode = decode + validate into the typed message (what the transport runs "
        "after authentication). The full receive path adds the I-JSON pass (duplicate names, "
        "surrogates, number range) that specs/protocol.md, 'Signatures' requires on every "
        "body, and which the transport runs once per message to get the value it "
        "authenticates and deduplicates.",
        "pydantic v2 validates into the one known model (no dispatch on `type` across the 17 "
        "messages, which Synapse's decoder does); json.loads checks nothing.",
        f"Each figure is the best of {ROUNDS} interleaved rounds.",
    ]
    section.seconds = time.monotonic() - started
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codec", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="total time budget")
    args = parser.parse_args(argv)
    section = run(args.seconds)
    print(section.tables[0].text())
    print()
    for note in section.notes:
        print(f"* {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
