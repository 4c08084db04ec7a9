"""Clear answers to common mistakes (issue 12 §10), as a new user would make them.

A target URL that is not a Synapse endpoint (a web server's 404 page), `send --a2a-agent` against a
Synapse peer served without A2A, a `send` whose request is refused (it was never "sent"), a
`Peer` whose port is taken: each is one line that says what is wrong, never a decoder's
"Extra data" or `-32603 INTERNAL_ERROR`, and nothing is left open.
"""

from __future__ import annotations

import gc
import http.server
import socket
import threading
import warnings
from collections.abc import Iterator

import pytest
from clikit import EXECUTOR, REQUESTER, SECRET, Server, client_args, free_port, run, url
from test_cli_errors import one_error

from synapse.transport.peer import Peer


class NotFound(http.server.BaseHTTPRequestHandler):
    """A web server with nothing at the callback path: its 404 page."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        page = b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_page() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_target_that_is_not_a_synapse_endpoint_is_named_as_such(web_page: int) -> None:
    result = run(
        "send",
        "--target",
        url(web_page),
        "--agent-id",
        EXECUTOR,
        "--as",
        REQUESTER,
        "--secret",
        SECRET,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "echo",
        '{"text": "x"}',
    )
    line = one_error(result)
    assert "not a Synapse endpoint: HTTP 404 with an HTML page" in line, line
    assert "Extra data" not in result.stderr and "not an envelope" not in line
    assert "sent to" not in result.stderr  # it never was


def test_send_a2a_to_a_peer_without_a2a_says_it_has_no_agent_card(executor: Server) -> None:
    result = run(
        "send", "--a2a-agent", f"http://127.0.0.1:{executor.port}", "echo", '{"text": "x"}'
    )
    line = one_error(result)
    assert "has no A2A agent card" in line, line
    assert "-32603" not in line and "INTERNAL_ERROR" not in line


def test_a_refused_request_is_never_reported_as_sent(executor: Server, requester_port: int) -> None:
    refused = run(
        "send",
        *client_args(executor, requester_port, secret="wrong-secret-0123456789abcdefghij"),
        "echo",
        '{"text": "x"}',
    )
    assert one_error(refused).startswith("synapse: 403 permission_denied: ")
    assert "sent to" not in refused.stderr, refused.stderr
    accepted = run("send", *client_args(executor, requester_port), "echo", '{"text": "x"}')
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stderr.count("sent to") == 1, accepted.stderr


async def test_a_peer_that_cannot_start_raises_one_clear_error_and_leaks_nothing() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        peer = Peer("agent-x", port=port)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: ") as info:
                await peer.start()
            session = peer.client._session
            assert session is None or session.closed, "the client session was left open"
            assert peer._runner is None
            del session
            gc.collect()
        assert not [w for w in caught if "Unclosed" in str(w.message)], caught
        assert info.value.errno is not None
    finally:
        taken.close()
