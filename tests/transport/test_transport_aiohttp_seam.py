"""The guard (`synapse.transport.guard`) extends aiohttp's connection handler and site, and
reads members aiohttp does not document. The package allows only the aiohttp releases the
suite was run against (`pyproject.toml`); this test names each member the guard relies on,
so that a release that renames one fails here, by name, instead of letting a connection
through unguarded."""

from __future__ import annotations

import inspect
from importlib.metadata import requires, version

from aiohttp import web, web_protocol, web_server
from packaging.requirements import Requirement
from packaging.version import Version

from synapse._distribution import NAME

#: What `GuardedHandler` reads or overrides of aiohttp's `RequestHandler`.
HANDLER_SLOTS = ("_request_count", "_loop")
HANDLER_METHODS = ("connection_made", "connection_lost", "data_received", "finish_response")
#: What `GuardedSite.start` reads of aiohttp's `TCPSite` to listen in its place.
SITE_MEMBERS = (
    "_runner",
    "_server",
    "_host",
    "_port",
    "_reuse_address",
    "_reuse_port",
    "_backlog",
    "_ssl_context",
)


def test_the_installed_aiohttp_is_in_the_tested_range() -> None:
    declared = [Requirement(r) for r in requires(NAME) or []]
    (aiohttp,) = [r for r in declared if r.name == "aiohttp" and r.marker is None]
    assert aiohttp.specifier.contains(Version(version("aiohttp")))
    # Closed above: a release the suite never ran against is not installed with us.
    assert any(spec.operator == "<" for spec in aiohttp.specifier)


def test_the_handler_members_the_guard_reads_exist() -> None:
    slots = {
        name
        for cls in web_protocol.RequestHandler.__mro__
        for name in vars(cls).get("__slots__", ())
    }
    for name in HANDLER_SLOTS:
        assert name in slots, f"aiohttp's RequestHandler has no {name}"
    for name in HANDLER_METHODS:
        assert callable(getattr(web_protocol.RequestHandler, name, None)), name
    params = list(inspect.signature(web_protocol.RequestHandler.finish_response).parameters)
    assert params == ["self", "request", "resp", "start_time"]
    # The handler's keyword arguments, which the guard passes on to its own handlers.
    assert "self._kwargs" in inspect.getsource(web_server.Server.__init__)


async def test_the_site_members_the_guard_reads_exist() -> None:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        missing = [name for name in SITE_MEMBERS if not hasattr(site, name)]
        assert not missing, f"aiohttp's TCPSite has none of {missing}"
    finally:
        await runner.cleanup()
