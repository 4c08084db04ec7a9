"""Authentication of incoming POSTs: specs/protocol.md, 'Order of checks' and 'Signatures'."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.p2p.config import P2PConfig
from synapse.transport.inbound import (
    Inbound,
    Refused,
    authenticate,
    encode_reply,
    nack_for,
)
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.types import (
    SIGNATURE_HEADER,
    ErrorCode,
    Nack,
    SynapseError,
    body_signature,
    decode_message,
    format_timestamp,
    header_signature,
    verify_header_signature,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = P2PConfig(max_body_size=4096)
ME = "agent-e"
ME_ENDPOINT = "http://e.example/synapse/callback"
PEER = "agent-r"
PEER_ENDPOINT = "http://r.example:8001/synapse/callback"
NEW, OLD = "new-secret", b"old-secret"
PARTNERS = PartnerRegistry(
    [
        Partner(PEER, PEER_ENDPOINT, (NEW, OLD)),
        Partner("agent-open", "http://open.example/cb"),  # configured without secrets
    ]
)


def envelope(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "version": "1.0",
        "id": "msg-1",
        "type": "p2p:heartbeat",
        "from": {"agent_id": PEER, "endpoint": PEER_ENDPOINT},
        "to": {"agent_id": ME},
        "timestamp": format_timestamp(NOW),
        "payload": {"status": "ok", "active_tasks": 0},
    }
    value.update(changes)
    return value


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def header_signed(value: dict[str, Any], secret: str | bytes = NEW) -> tuple[bytes, str]:
    body = encode(value)
    return body, header_signature(secret, body)


def body_signed(value: dict[str, Any], secret: str | bytes = NEW) -> bytes:
    return encode({**value, "signature": body_signature(secret, value)})


def check(body: bytes, header: str | None = None, *, now: datetime = NOW) -> Inbound:
    return authenticate(body, header, partners=PARTNERS, agent_id=ME, now=now, config=CONFIG)


def refusal(body: bytes, header: str | None = None, *, now: datetime = NOW) -> Refused:
    with pytest.raises(Refused) as info:
        check(body, header, now=now)
    return info.value


# --- accepted -------------------------------------------------------------------------------


def test_header_mode_accepted() -> None:
    inbound = check(*header_signed(envelope()))
    assert inbound.signed_by == "header"
    assert inbound.partner is PARTNERS[PEER]
    assert inbound.key == (PEER, "msg-1")
    assert inbound.head.id == "msg-1" and inbound.value["id"] == "msg-1"


def test_body_mode_accepted_with_unknown_members_signed() -> None:
    value = envelope(x_future={"b": [1, 2.5, "ü"], "a": None})
    value["payload"]["x_extra"] = True
    inbound = check(body_signed(value))
    assert inbound.signed_by == "body"
    assert inbound.value["x_future"]["b"] == [1, 2.5, "ü"]
    # An unknown member is covered by the signature: changing it breaks it.
    tampered = json.loads(body_signed(value))
    tampered["x_future"]["a"] = 1
    assert refusal(encode(tampered)).error.details == {"reason": "bad_signature"}


def test_body_signature_is_verified_on_the_parsed_value_not_the_bytes() -> None:
    value = envelope()
    signed = {**value, "signature": body_signature(NEW, value)}
    pretty = json.dumps(signed, indent=4, sort_keys=True).encode()  # other spacing and order
    assert check(pretty).signed_by == "body"


def test_rotation_accepts_any_configured_secret() -> None:
    assert check(*header_signed(envelope(), OLD)).signed_by == "header"
    assert check(body_signed(envelope(), OLD)).signed_by == "body"


def test_several_header_signatures_one_match_is_enough() -> None:
    body = encode(envelope())
    header = f"{header_signature('unknown', body)} {header_signature(OLD, body)}"
    assert check(body, header).signed_by == "header"


def test_header_decides_when_both_are_present() -> None:
    value = envelope()
    good_body = body_signed(value)
    bad_header = header_signature("wrong", good_body)
    assert refusal(good_body, bad_header).error.details == {"reason": "bad_signature"}
    bad_body = encode({**value, "signature": "sha256=" + "0" * 64})
    assert check(bad_body, header_signature(NEW, bad_body)).signed_by == "header"


def test_partner_without_secrets_is_accepted_unsigned() -> None:
    value = envelope(**{"from": {"agent_id": "agent-open", "endpoint": "http://open.example/cb"}})
    assert check(encode(value)).signed_by == "none"


def test_endpoint_compared_after_normalization() -> None:
    value = envelope(
        **{"from": {"agent_id": PEER, "endpoint": "HTTP://R.Example:8001/synapse/callback"}}
    )
    assert check(*header_signed(value)).signed_by == "header"


@pytest.mark.parametrize("skew", [-299, 299])
def test_within_the_replay_window(skew: int) -> None:
    assert check(*header_signed(envelope()), now=NOW + timedelta(seconds=skew))


# --- refused: each check ----------------------------------------------------------------------


def test_too_large_is_413() -> None:
    refused = refusal(b"{" + b" " * CONFIG.max_body_size + b"}")
    assert refused.error.code is ErrorCode.MESSAGE_FORMAT_INVALID
    assert refused.http_status == 413
    assert refused.sign_with is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{", "not JSON"),
        (b"\xff{}", "invalid UTF-8"),
        (b'{"id": "a", "id": "b"}', "duplicate member name 'id'"),
        (b'{"n": 9007199254740992}', None),
        (b'{"n": NaN}', None),
        (b'{"n": 1e400}', None),
        (b'{"s": "\\ud800"}', "lone surrogate in a string"),
    ],
)
def test_not_i_json(body: bytes, reason: str | None) -> None:
    refused = refusal(body)
    assert refused.error.code is ErrorCode.MESSAGE_FORMAT_INVALID
    assert refused.http_status == 400
    assert refused.sign_with is None
    if reason is not None:
        assert refused.error.details == {"reason": reason}


@pytest.mark.parametrize(
    "value",
    [
        [1, 2],
        "envelope",
        {"hello": "world"},
        envelope(type="p2p:unknown"),
        envelope(id=""),
        envelope(id="x" * 129),
        envelope(timestamp="yesterday"),
        envelope(timestamp="2026-01-01T12:00:00"),  # no offset
        envelope(payload=[]),
        envelope(to="agent-e"),
        envelope(version="1"),
    ],
)
def test_not_an_envelope(value: Any) -> None:
    refused = refusal(encode(value))
    assert refused.error.code is ErrorCode.MESSAGE_FORMAT_INVALID
    assert refused.sign_with is None


def test_other_major_version_names_the_supported_ones() -> None:
    # Judged before the shape: a 2.x envelope may look otherwise.
    refused = refusal(encode({"version": "2.0", "id": "msg-9", "anything": "else"}))
    assert refused.error.code is ErrorCode.MESSAGE_FORMAT_INVALID
    assert refused.error.details is not None
    assert refused.error.details["supported_versions"] == ["1.x"]
    assert refused.request_id == "msg-9"
    assert check(*header_signed(envelope(version="1.7")))  # any 1.x


def test_unknown_partner() -> None:
    value = envelope(**{"from": {"agent_id": "stranger", "endpoint": PEER_ENDPOINT}})
    refused = refusal(*header_signed(value))
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert refused.error.details == {"reason": "unknown_partner"}
    assert (refused.request_id, refused.sender_id) == ("msg-1", "stranger")


@pytest.mark.parametrize(
    ("body", "header", "reason"),
    [
        (encode(envelope()), None, "missing_signature"),
        (encode(envelope(signature=None)), None, "missing_signature"),
        (encode(envelope()), "", "missing_signature"),  # an empty header is no header
        (encode(envelope()), "sha256=" + "0" * 64, "bad_signature"),
        (encode(envelope()), "garbage", "bad_signature"),
        (body_signed(envelope(), "wrong"), None, "bad_signature"),
        (encode(envelope(signature="sha256=" + "0" * 64)), None, "bad_signature"),
        (encode(envelope(signature="")), None, "bad_signature"),
    ],
)
def test_bad_or_missing_signature(body: bytes, header: str | None, reason: str) -> None:
    refused = refusal(body, header)
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert refused.error.details == {"reason": reason}
    assert refused.sign_with is None


def test_header_signature_covers_the_exact_bytes() -> None:
    body, header = header_signed(envelope())
    assert refusal(body + b" ", header).error.details == {"reason": "bad_signature"}


@pytest.mark.parametrize("skew", [-301, 301, 86400])
def test_stale_in_either_direction(skew: int) -> None:
    now = NOW + timedelta(seconds=skew)
    refused = refusal(*header_signed(envelope()), now=now)
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert refused.error.details == {"reason": "stale", "server_time": format_timestamp(now)}
    assert refused.sign_with is None


def test_wrong_recipient() -> None:
    refused = refusal(*header_signed(envelope(to={"agent_id": "agent-x"})))
    assert refused.error.details == {"reason": "wrong_recipient"}
    assert refused.sign_with is None


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://r.example:8002/synapse/callback",
        "https://r.example:8001/synapse/callback",
        "http://evil.example:8001/synapse/callback",
        "http://r.example:8001/synapse/callback/",
        "not a url",
    ],
)
def test_endpoint_mismatch(endpoint: str) -> None:
    value = envelope(**{"from": {"agent_id": PEER, "endpoint": endpoint}})
    refused = refusal(*header_signed(value))
    assert refused.error.code is ErrorCode.PERMISSION_DENIED
    assert refused.error.details == {"reason": "endpoint_mismatch"}
    assert refused.sign_with is None


@pytest.mark.parametrize(
    "message_type",
    [
        "p2p:task_confirm",
        "p2p:task_reject",
        "p2p:capability_response",
        "p2p:task_ack",
        "p2p:ack",
        "p2p:nack",
    ],
)
def test_reply_only_type_refused_and_signed(message_type: str) -> None:
    refused = refusal(*header_signed(envelope(type=message_type, payload={})))
    assert refused.error.code is ErrorCode.INVALID_PARAMS
    assert refused.http_status == 400
    assert refused.error.details == {"reason": "reply_only_type", "path": "$.type"}
    assert refused.sign_with is PARTNERS[PEER]  # verified first: this nack is signed


def test_reply_to_on_a_request_refused_and_signed() -> None:
    refused = refusal(*header_signed(envelope(reply_to="msg-0")))
    assert refused.error.code is ErrorCode.INVALID_PARAMS
    assert refused.error.details == {"reason": "reply_to_on_request", "path": "$.reply_to"}
    assert refused.sign_with is PARTNERS[PEER]


# --- refused: the earlier check answers ------------------------------------------------------

STALE = format_timestamp(NOW - timedelta(hours=1))
STRANGER = {"agent_id": "stranger", "endpoint": PEER_ENDPOINT}
ELSEWHERE = {"agent_id": PEER, "endpoint": "http://elsewhere.example/"}


def _unsigned(value: dict[str, Any]) -> tuple[bytes, str | None]:
    return encode(value), None


def _forged(value: dict[str, Any]) -> tuple[bytes, str | None]:
    return header_signed(value, "forged")


def _signed(value: dict[str, Any]) -> tuple[bytes, str | None]:
    return header_signed(value)


FORMAT, DENIED = ErrorCode.MESSAGE_FORMAT_INVALID, ErrorCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("body", "header", "code", "reason"),
    [
        pytest.param(
            b"[" * (CONFIG.max_body_size + 1), None, FORMAT, "too_large", id="large+not-json"
        ),
        pytest.param(
            b'{"id": 1, "id": 2}', None, FORMAT, "duplicate member name 'id'", id="ijson+shape"
        ),
        pytest.param(
            *_unsigned(envelope(type="p2p:nope", **{"from": STRANGER})),
            FORMAT,
            None,
            id="shape+partner+unsigned",
        ),
        pytest.param(
            *_forged(envelope(**{"from": STRANGER})), DENIED, "unknown_partner", id="partner+sig"
        ),
        pytest.param(
            *_forged(envelope(timestamp=STALE)), DENIED, "bad_signature", id="bad-sig+stale"
        ),
        pytest.param(
            *_unsigned(envelope(timestamp=STALE)),
            DENIED,
            "missing_signature",
            id="missing-sig+stale",
        ),
        pytest.param(
            *_signed(envelope(timestamp=STALE, to={"agent_id": "x"})),
            DENIED,
            "stale",
            id="stale+to",
        ),
        pytest.param(
            *_signed(envelope(to={"agent_id": "x"}, **{"from": ELSEWHERE})),
            DENIED,
            "wrong_recipient",
            id="to+endpoint",
        ),
        pytest.param(
            *_signed(envelope(type="p2p:ack", payload={}, **{"from": ELSEWHERE})),
            DENIED,
            "endpoint_mismatch",
            id="endpoint+reply-only",
        ),
        pytest.param(
            *_signed(envelope(type="p2p:ack", payload={}, reply_to="m")),
            ErrorCode.INVALID_PARAMS,
            "reply_only_type",
            id="reply-only+reply_to",
        ),
    ],
)
def test_the_first_failing_check_answers(
    body: bytes, header: str | None, code: ErrorCode, reason: str | None
) -> None:
    refused = refusal(body, header)
    assert refused.error.code is code
    if reason is not None:
        assert refused.error.details is not None
        assert refused.error.details["reason"] == reason


# --- fingerprint ------------------------------------------------------------------------------


def test_fingerprint_ignores_timestamp_and_signature_only() -> None:
    value = envelope()
    first = check(*header_signed(value)).fingerprint
    later = format_timestamp(NOW + timedelta(seconds=5))
    retry = check(body_signed(envelope(timestamp=later), OLD)).fingerprint  # other mode too
    assert first == retry


def test_fingerprint_is_independent_of_member_order_and_spacing() -> None:
    value = envelope()
    a = encode(value)
    b = json.dumps(dict(reversed(value.items())), indent=2).encode()
    fa = check(a, header_signature(NEW, a)).fingerprint
    fb = check(b, header_signature(NEW, b)).fingerprint
    assert fa == fb


def test_fingerprint_differs_for_other_content() -> None:
    first = check(*header_signed(envelope())).fingerprint
    other = check(*header_signed(envelope(payload={"status": "busy", "active_tasks": 0})))
    extra = check(*header_signed(envelope(x_unknown=1)))
    assert other.fingerprint != first
    assert extra.fingerprint != first


# --- nacks --------------------------------------------------------------------------------------


def test_nack_for_a_known_request() -> None:
    error = SynapseError(ErrorCode.PERMISSION_DENIED, "no", {"reason": "stale"})
    nack = nack_for(error, agent_id=ME, endpoint=ME_ENDPOINT, request_id="msg-1", to=PEER)
    assert isinstance(nack, Nack)
    assert nack.reply_to == "msg-1" and nack.to.agent_id == PEER
    assert nack.from_.agent_id == ME and nack.from_.endpoint == ME_ENDPOINT
    assert (nack.payload.code, nack.payload.message) == ("permission_denied", "no")
    assert nack.payload.details == {"reason": "stale"}


def test_nack_for_an_unreadable_request() -> None:
    refused = refusal(b"not json")
    nack = refused.nack(agent_id=ME, endpoint=ME_ENDPOINT, now=NOW)
    assert nack.reply_to is None
    assert nack.to.agent_id == "unknown"
    assert nack.timestamp == NOW
    assert nack.payload.code == "message_format_invalid"


def test_nack_of_a_refused_envelope_answers_its_id() -> None:
    refused = refusal(encode(envelope()))  # unsigned
    nack = refused.nack(agent_id=ME, endpoint=ME_ENDPOINT)
    assert (nack.reply_to, nack.to.agent_id) == ("msg-1", PEER)


def test_nack_claims_are_only_used_when_they_fit_an_envelope() -> None:
    refused = refusal(encode({"id": "x" * 200, "from": {"agent_id": ""}}))
    assert (refused.request_id, refused.sender_id) == (None, None)


def test_encode_reply_signs_only_with_a_partner() -> None:
    partner = PARTNERS[PEER]
    nack = nack_for(
        SynapseError(ErrorCode.INVALID_PARAMS, "x"),
        agent_id=ME,
        endpoint=ME_ENDPOINT,
        request_id="msg-1",
        to=PEER,
    )
    body, headers = encode_reply(nack, partner)
    assert headers["Content-Type"] == "application/json"
    assert verify_header_signature([NEW], body, headers[SIGNATURE_HEADER])
    assert isinstance(decode_message(body), Nack)
    body, headers = encode_reply(nack, None)
    assert SIGNATURE_HEADER not in headers
    _, headers = encode_reply(nack, PARTNERS["agent-open"])
    assert SIGNATURE_HEADER not in headers


# --- never anything but Refused -------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), header=st.none() | st.text(max_size=80))
def test_any_bytes_are_accepted_or_refused(body: bytes, header: str | None) -> None:
    try:
        check(body, header)
    except Refused as refused:
        assert refused.error.code in (ErrorCode.MESSAGE_FORMAT_INVALID, ErrorCode.PERMISSION_DENIED)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(
        ["version", "id", "type", "from", "to", "timestamp", "reply_to", "payload", "signature"]
    ),
    replacement=json_values,
    sign=st.booleans(),
)
def test_any_mutated_envelope_is_accepted_or_refused(
    field: str, replacement: Any, sign: bool
) -> None:
    value = envelope(**{field: replacement})
    try:
        body = json.dumps(value, allow_nan=True).encode()
    except (TypeError, ValueError):
        return
    try:
        check(body, header_signature(NEW, body) if sign else None)
    except Refused as refused:
        assert isinstance(refused.error, SynapseError)
        nack = refused.nack(agent_id=ME, endpoint=ME_ENDPOINT)
        assert isinstance(decode_message(encode_reply(nack, refused.sign_with)[0]), Nack)
