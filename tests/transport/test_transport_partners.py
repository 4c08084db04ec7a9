"""Partners and RFC 3986 endpoint normalization (specs/protocol.md, 'Transport')."""

from __future__ import annotations

import pytest

from synapse.transport.partners import Partner, PartnerRegistry, normalize_url, same_endpoint


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("HTTP://Example.COM/synapse/callback", "http://example.com/synapse/callback"),
        ("http://example.com:80/synapse/callback", "http://example.com/synapse/callback"),
        ("https://example.com:443/x", "https://example.com/x"),
        ("http://example.com:443/x", "http://example.com:443/x"),
        ("https://example.com:80/x", "https://example.com:80/x"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com:80", "http://example.com/"),
        ("http://127.0.0.1:8080/cb", "http://127.0.0.1:8080/cb"),
        ("http://[::1]:80/cb", "http://[::1]/cb"),
        ("http://[FE80::1]:8080/cb", "http://[fe80::1]:8080/cb"),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/%7Euser/%41", "http://example.com/~user/A"),
        ("http://example.com/Path/Case?Q=Case", "http://example.com/Path/Case?Q=Case"),
        ("http://User@Example.com/", "http://User@example.com/"),
        ("  http://example.com/x  ", "http://example.com/x"),
    ],
)
def test_normalize_url(url: str, normal: str) -> None:
    assert normalize_url(url) == normal
    assert normalize_url(normal) == normal  # idempotent


@pytest.mark.parametrize(
    "url",
    ["", "example.com/cb", "/synapse/callback", "http://", "http://h:99999/", "http://h:x/"],
)
def test_normalize_url_refuses_what_is_not_an_absolute_url(url: str) -> None:
    with pytest.raises(ValueError):
        normalize_url(url)


def test_same_endpoint() -> None:
    assert same_endpoint("HTTP://Peer.example:80", "http://peer.example/")
    assert not same_endpoint("http://peer.example/a", "http://peer.example/b")
    assert not same_endpoint("http://peer.example/", "https://peer.example/")
    assert not same_endpoint("http://peer.example/cb", "http://peer.example/cb/")
    assert not same_endpoint("not a url", "not a url")


def test_partner_signs_with_the_newest_secret_and_hides_secrets() -> None:
    partner = Partner("b", "http://B.example:80/cb", ("new", "old"))
    assert partner.signing_secret == "new"
    assert partner.normalized_endpoint == "http://b.example/cb"
    assert partner.is_endpoint("http://b.example/cb")
    assert "new" not in repr(partner)
    assert Partner("b", "http://b.example/cb").signing_secret is None


def test_partner_refuses_a_bad_configuration() -> None:
    with pytest.raises(ValueError):
        Partner("b", "not a url")
    with pytest.raises(ValueError):
        Partner("", "http://b.example/")
    with pytest.raises(ValueError):
        Partner("b", "http://b.example/", ("",))


def test_registry() -> None:
    registry = PartnerRegistry.from_mapping(
        {"b": "http://b.example/cb", "c": "http://c.example/cb"},
        {"b": [b"k2", b"k1"]},
        default_secrets=["shared"],
    )
    assert len(registry) == 2
    assert "b" in registry and "z" not in registry
    assert registry["b"].secrets == (b"k2", b"k1")
    assert registry.get("c") is not None and registry["c"].secrets == ("shared",)
    assert registry.get("z") is None
    assert {p.agent_id for p in registry} == {"b", "c"}
    assert registry.by_endpoint("HTTP://C.example:80/cb") is registry["c"]
    assert registry.by_endpoint("http://d.example/cb") is None
    registry.add(Partner("b", "http://b2.example/cb"))
    assert registry["b"].endpoint == "http://b2.example/cb"
    with pytest.raises(ValueError):
        PartnerRegistry.from_mapping({"b": "http://b.example/"}, {"z": ["s"]})
