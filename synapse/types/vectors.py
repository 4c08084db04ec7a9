"""Signature test vectors (specs/protocol.md, 'Signatures') that another implementation can check
itself against.

Run as a module to write `specs/signature-vectors.json`, or with `--check` to fail (exit 1)
when the checked-in file is stale:

    python -m synapse.types.vectors [--check] [--out specs/signature-vectors.json]

Each case is an HTTP body exactly as sent, signed in both modes:

- `secret`: the signing secret (its UTF-8 bytes are the HMAC key);
- `secrets`: for rotation, what the receiver holds (default: `[secret]`);
- `header_secrets`: when the header carries several signatures, the secrets that made them;
- `body`: the exact HTTP body as a string (its UTF-8 encoding is what was sent);
- `header_signature`: the `X-Synapse-Signature` value, `sha256=` + lowercase hex HMAC-SHA256
  over the body bytes (several, space-separated, when `header_secrets` is given);
- `envelope`: the body parsed (I-JSON), the value body-mode signing works on;
- `canonical`: RFC 8785 (JCS) text of `envelope` without `signature`, for debugging;
- `body_signature`: HMAC-SHA256 over `canonical` with `secret`, equal to `envelope["signature"]`.

What a checker asserts for every case: HMAC(`secret`, body) is one of the header signatures;
HMAC(`secret`, canonical) is `body_signature`; a receiver holding `secrets` accepts both.
A body-mode signature is computed first and placed in the body; the header signature then
covers the finished body, `signature` member included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from synapse.types.ijson import parse_i_json
from synapse.types.signing import body_signature, canonical_form, header_signature

DEFAULT_OUT = Path("specs") / "signature-vectors.json"

_ALICE = {"agent_id": "agent-alice", "endpoint": "https://alice.example.com/synapse/callback"}
_BOB = {"agent_id": "agent-bob", "endpoint": "https://bob.example.com/synapse/callback"}


def _envelope(type_: str, id_: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    sender = _BOB if type_ in {"task_status_update", "task_complete", "heartbeat"} else _ALICE
    receiver = _ALICE if sender is _BOB else _BOB
    return {
        "version": "1.0",
        "id": id_,
        "type": f"p2p:{type_}",
        "from": sender,
        "to": {"agent_id": receiver["agent_id"]},
        "timestamp": "2026-01-01T00:00:00Z",
        **extra,
        "payload": payload,
    }


def _splice_signature(body: str, signature: str) -> str:
    """Add `"signature": …` as the last member of the body text, keeping the rest as written."""
    stripped = body.rstrip()
    assert stripped.endswith("}")
    return f'{stripped[:-1].rstrip()}, "signature": "{signature}"}}'


def _case(
    name: str,
    notes: str,
    secret: str,
    body_without_signature: str,
    *,
    secrets: list[str] | None = None,
    header_secrets: list[str] | None = None,
) -> dict[str, Any]:
    unsigned = parse_i_json(body_without_signature.encode("utf-8"))
    signature = body_signature(secret, unsigned)
    body = _splice_signature(body_without_signature, signature)
    raw = body.encode("utf-8")
    header = " ".join(header_signature(s, raw) for s in header_secrets or [secret])
    case: dict[str, Any] = {"name": name, "notes": notes, "secret": secret}
    if secrets is not None:
        case["secrets"] = secrets
    if header_secrets is not None:
        case["header_secrets"] = header_secrets
    envelope = parse_i_json(raw)
    case |= {
        "body": body,
        "header_signature": header,
        "envelope": envelope,
        "canonical": canonical_form(envelope).decode("utf-8"),
        "body_signature": signature,
    }
    return case


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def signature_vectors() -> list[dict[str, Any]]:
    """The cases, deterministic: fixed ids, timestamps and secrets."""
    poem = {
        "task": {
            "id": "task-vec-0001",
            "type": "text_generation",
            "payload": {"prompt": "写一首诗", "style": "古典"},
        }
    }
    progress = {
        "task_id": "task-vec-0001",
        "status": "executing",
        "progress": 50,
        "message": "正在生成内容",
    }
    return [
        _case(
            "ascii_compact",
            "Plain ASCII, compact, members in wire order.",
            "s3cr3t",
            _compact(_envelope("heartbeat", "msg-vec-0001", {"status": "ok", "active_tasks": 0})),
        ),
        _case(
            "non_ascii_raw_utf8",
            "Chinese text sent as raw UTF-8: the header signs those bytes; JCS keeps them raw.",
            "s3cr3t",
            _compact(_envelope("task_request", "msg-vec-0002", poem)),
        ),
        _case(
            "non_ascii_escaped",
            "Same envelope as non_ascii_raw_utf8 but with \\u escapes and indentation: a "
            "different header signature, the same canonical form and body signature.",
            "s3cr3t",
            json.dumps(_envelope("task_request", "msg-vec-0002", poem), indent=2),
        ),
        _case(
            "floats",
            "Numbers as written differ from JCS: 1.0 → 1, 2.5e-7 stays, 1E21 → 1e+21, "
            "-0.0 → 0, 100.50 → 100.5; 9007199254740991 is the largest I-JSON integer.",
            "s3cr3t",
            _compact(
                _envelope(
                    "task_complete",
                    "msg-vec-0003",
                    {"task_id": "task-vec-0001", "result": {"output_type": "json"}},
                )
            ).replace(
                '"output_type":"json"}',
                '"output_type":"json","output":{"score":1.0,"epsilon":2.5e-7,"big":1E21,'
                '"zero":-0.0,"progress":100.50,"max_int":9007199254740991}}',
            ),
        ),
        _case(
            "unknown_members",
            "Members this version does not know, at the top level and in the payload: "
            "ignored by decoding, covered by both signatures.",
            "s3cr3t",
            _compact(
                _envelope(
                    "task_status_update",
                    "msg-vec-0004",
                    {**progress, "x_eta_seconds": 42},
                    x_trace={"hops": 2, "via": ["edge-1"]},
                )
            ),
        ),
        _case(
            "key_order_utf16",
            "JCS sorts member names by UTF-16 code units: '😀' (D83D DE00) before 'ｚ' (FF5A), "
            'unlike code point order; escapes: only \\" \\\\ \\b \\f \\n \\r \\t and \\u00XX '
            "controls, U+2028 stays raw.",
            "s3cr3t",
            _compact(
                _envelope(
                    "task_request",
                    "msg-vec-0005",
                    {
                        "task": {
                            "id": "task-vec-0002",
                            "type": "echo",
                            "payload": {
                                "ｚ": 1,
                                "😀": 2,
                                "é": 3,
                                "text": 'tab\there "quoted" back\\slash \u2028 \u0007 end',
                            },
                        }
                    },
                )
            ),
        ),
        _case(
            "non_ascii_secret",
            "The HMAC key is the secret's UTF-8 bytes.",
            "密钥-2026",
            _compact(_envelope("task_status_update", "msg-vec-0006", progress)),
        ),
        _case(
            "rotation_old_secret",
            "The receiver holds [new, old] and accepts a message signed with the old one.",
            "secret-2025",
            _compact(_envelope("task_status_update", "msg-vec-0007", progress)),
            secrets=["secret-2026", "secret-2025"],
        ),
        _case(
            "rotation_two_header_signatures",
            "A sender mid-rotation sends two space-separated header signatures (new, old); "
            "one match is enough, so a receiver holding only the old secret accepts. The body "
            "has room for one signature: made with the old secret, still shared by both.",
            "secret-2025",
            _compact(_envelope("task_status_update", "msg-vec-0008", progress)),
            secrets=["secret-2025"],
            header_secrets=["secret-2026", "secret-2025"],
        ),
    ]


def render(cases: list[dict[str, Any]]) -> str:
    return json.dumps(cases, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m synapse.types.vectors",
        description="Write the signature test vectors, or check the file is current.",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output file (default: %(default)s)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    args = parser.parse_args(argv)
    text = render(signature_vectors())
    if args.check:
        if not args.out.is_file() or args.out.read_text("utf-8") != text:
            print(f"stale {args.out}; run `python -m synapse.types.vectors`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, "utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
