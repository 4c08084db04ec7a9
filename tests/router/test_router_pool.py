"""The pool without the network: configuration, and the choice of a partner."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse.router import PoolConfig
from synapse.router.pool import Member, Pool
from synapse.router.trust import judge_card, same_origin
from synapse.types import HeartbeatStatus

POOL_TOML = """
refresh_interval = 10
require_signed_cards = true
request_retries = 1

[[partner]]
agent_id = "spoke-a"
endpoint = "http://127.0.0.1:8001/synapse/callback"
secret = "s3cret"
weight = 2

[[partner]]
agent_id = "spoke-b"
endpoint = "http://127.0.0.1:8002/synapse/callback"
secrets = ["new", "old"]
task_types = ["echo"]

[[a2a]]
name = "sdk"
url = "http://127.0.0.1:9000"
token = "t0ken"

[pin]
portrait = ["spoke-a", "sdk"]
"""


def test_a_toml_pool_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pool.toml"
    path.write_text(POOL_TOML)
    config = PoolConfig.load(path)
    assert [p.agent_id for p in config.partner] == ["spoke-a", "spoke-b"]
    assert config.partner[0].secrets == ["s3cret"] and config.partner[0].weight == 2
    assert config.partner[1].secrets == ["new", "old"]
    assert config.a2a[0].token == "t0ken"
    assert config.pin == {"portrait": ["spoke-a", "sdk"]}
    assert config.require_signed_cards and config.request_retries == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[partner]]\nagent_id = "a"\nendpoint = "http://x"\nsecret = "s"\nweight = 0',
            "must be positive",
        ),
        ('[pin]\necho = ["nobody"]', "not in the pool"),
        ('[[partner]]\nagent_id = "a"\nendpoint = "http://x"', "needs a secret"),
        (
            '[[partner]]\nagent_id = "a"\nendpoint = "http://x"\nsecret = "s"\n'
            '[[a2a]]\nname = "a"\nurl = "http://y"',
            "unique",
        ),
        ("refresh_interval = -1", "positive"),
        ("colour = 'blue'", "bad pool configuration"),
        ("[[partner]\n", "not TOML"),
    ],
)
def test_a_bad_pool_file_is_refused_with_a_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pool.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        PoolConfig.load(path)


def member(name: str, offers: set[str], **kw: object) -> Member:
    m = Member(name, "synapse", offers=frozenset(offers), reachable=True)
    for key, value in kw.items():
        setattr(m, key, value)
    return m


def test_the_least_loaded_capable_reachable_member_with_room_is_chosen() -> None:
    pool = Pool(
        {
            "a": member("a", {"echo"}, in_flight=2),
            "b": member("b", {"echo"}, in_flight=1),
            "c": member("c", {"slow"}),
            "d": member("d", {"echo"}, reachable=False),
            "e": member("e", {"echo"}, max_concurrent=1, in_flight=1),
        }
    )
    assert pool.choose("echo", 0.0).name == "b"  # type: ignore[union-attr]
    assert pool.choose("echo", 0.0, exclude=["b"]).name == "a"  # type: ignore[union-attr]
    assert pool.choose("echo", 0.0, exclude=["a", "b"]) is None  # d down, e full
    assert pool.choose("slow", 0.0).name == "c"  # type: ignore[union-attr]
    assert pool.choose("portrait", 0.0) is None


def test_heartbeat_load_status_and_retry_after_count() -> None:
    pool = Pool(
        {
            "a": member("a", {"echo"}, remote_active=3),
            "b": member("b", {"echo"}, in_flight=1),
            "c": member("c", {"echo"}, status=HeartbeatStatus.BUSY),
            "d": member("d", {"echo"}, busy_until=10.0),
        }
    )
    assert pool.choose("echo", 0.0).name == "b"  # type: ignore[union-attr]
    assert pool.choose("echo", 0.0, exclude=["a", "b"]) is None  # c busy, d asked to wait
    assert pool.next_room("echo", 0.0, exclude=["a", "b"]) == 10.0
    assert pool.choose("echo", 11.0, exclude=["a", "b"]).name == "d"  # type: ignore[union-attr]


def test_weights_share_the_load() -> None:
    heavy = member("heavy", {"echo"}, weight=3.0)
    light = member("light", {"echo"})
    pool = Pool({"heavy": heavy, "light": light})
    picks = []
    for _ in range(8):
        chosen = pool.choose("echo", 0.0)
        assert chosen is not None
        chosen.in_flight += 1
        picks.append(chosen.name)
    assert picks.count("heavy") == 6 and picks.count("light") == 2


def test_pins_restrict_a_type_to_their_partners_in_their_order() -> None:
    pool = Pool(
        {n: member(n, {"echo", "slow"}) for n in ("a", "b", "c")},
        pins={"echo": ["c", "b"]},
    )
    assert pool.choose("echo", 0.0).name == "c"  # type: ignore[union-attr]
    assert pool.choose("echo", 0.0, exclude=["c", "b"]) is None  # a is never used for echo
    assert pool.choose("slow", 0.0).name == "a"  # type: ignore[union-attr]
    assert pool.task_types(0.0) == {"echo", "slow"}


def test_a_configured_task_type_list_limits_what_a_member_gets() -> None:
    limited = member("a", {"echo", "slow"}, task_types=frozenset({"echo"}))
    pool = Pool({"a": limited})
    assert pool.choose("slow", 0.0) is None
    assert pool.task_types(0.0) == {"echo"}


def test_quarantine_lasts_its_span() -> None:
    m = member("a", {"echo"}, quarantined_until=5.0)
    pool = Pool({"a": m})
    assert pool.choose("echo", 1.0) is None and pool.task_types(1.0) == set()
    assert pool.choose("echo", 6.0) is m


SIGNED = b'{"name": "x", "signatures": [{"protected": "e30", "signature": "s"}]}'
UNSIGNED = b'{"name": "x"}'


@pytest.mark.parametrize(
    ("raw", "required", "verdict", "expected"),
    [
        (UNSIGNED, False, None, True),
        (UNSIGNED, True, True, False),  # unsigned refused when required
        (SIGNED, True, True, True),
        (SIGNED, True, False, False),
        (SIGNED, False, False, False),  # a bad signature is refused even when optional
        (SIGNED, True, None, False),  # required, but no verifier: nothing can verify
        (SIGNED, False, None, True),
        (b"not json", True, True, False),
    ],
)
def test_the_card_policy(raw: bytes, required: bool, verdict: bool | None, expected: bool) -> None:
    verifier = None if verdict is None else (lambda _raw: verdict)
    assert judge_card(raw, required=required, verifier=verifier).accepted is expected


def test_a_verifier_that_raises_refuses_the_card() -> None:
    def broken(raw: bytes) -> bool:
        raise RuntimeError("boom")

    result = judge_card(SIGNED, required=False, verifier=broken)
    assert not result.accepted and "raised" in result.reason


def test_same_origin() -> None:
    assert same_origin("http://h:80/a", "http://H/b")
    assert not same_origin("http://h:8000/", "http://h:8001/")
    assert not same_origin("https://h/", "http://h/")


def test_checks_named_in_the_pool_file_are_loaded() -> None:
    from synapse.router.trust import load_callable

    assert load_callable("synapse.router.trust:same_origin", "result_check") is same_origin
    for bad, message in [
        ("no_colon", "MODULE:ATTR"),
        ("synapse.nowhere:f", "cannot load"),
        ("synapse.router.trust:missing", "cannot load"),
        ("synapse.router.trust:__doc__", "not callable"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_callable(bad, "result_check")


async def test_a_router_takes_its_checks_from_the_pool_file() -> None:
    from synapse.router import Router
    from synapse.transport.peer import Peer

    config = PoolConfig(
        card_verifier="synapse.router.trust:card_signatures",
        result_check="synapse.router.trust:same_origin",
    )
    router = Router(Peer("hub"), config)
    from synapse.router.trust import card_signatures

    assert router.card_verifier is card_signatures
    assert router.result_check is same_origin


def test_the_sdk_is_installed() -> None:
    """The hub-and-spokes tests need the official A2A SDK (one spoke is built with it); without
    it conftest.py leaves them out, and this test says what to install."""
    import importlib.util

    missing = [n for n in ("a2a", "uvicorn", "httpx") if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(
            f"the hub-and-spokes tests need a2a-sdk[http-server], uvicorn and httpx "
            f"(pip install -e '.[dev]'); missing: {missing}"
        )


def test_the_pool_file_in_docs_routing_md_is_valid() -> None:
    import tomllib

    doc = (Path(__file__).resolve().parents[2] / "docs" / "routing.md").read_text()
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    config = PoolConfig.from_mapping(tomllib.loads(block))
    assert [p.agent_id for p in config.partner] == ["writer-1"]
    assert [a.name for a in config.a2a] == ["translator"]
    assert config.pin == {"portrait": ["writer-1"]}
    assert config.max_hops == 8 and not config.sticky_sessions


async def test_the_router_refuses_tasks_until_its_pool_is_known() -> None:
    from synapse.router import Router
    from synapse.transport.peer import Peer

    hub = Peer("hub")
    router = Router(hub, PoolConfig())
    await hub.start()
    try:
        assert hub.protocol.engine.ready is False  # new tasks: 503 agent_not_ready
        await router.start()
        assert hub.protocol.engine.ready is True
    finally:
        await router.close()
        await hub.close()
