"""The web console: where people see a peer's tasks and answer `need_info` and `need_human`.

    peer = Peer("agent-r", partners=[...])
    enable_console(peer, TokenAuth({"a-long-secret-token": Reviewer("alice", "Alice")}))
    await peer.start()          # the console is at http://HOST:PORT/console

`task_need_info` and `task_need_human` arrive at the requester, so the console runs on the
requester's peer: its people answer the questions their executors ask. It can also request
tasks of the peer's partners, so that a person can start a flow and answer it in one place.
Every answer is sent as `task_info_provided` / `human_decision` with `decided_by` from the
signed-in reviewer, and recorded in the task's audit trail (`TaskRecord.audit`).

Served by the peer's own aiohttp app under `/console`: a page, its vendored script and style
(package data, no build step), a JSON API under `/console/api` and live updates over
Server-Sent Events. Nothing but the sign-in page answers without a session (or a bearer token
for API clients), and every state-changing request needs the session's CSRF token.
"""

from synapse.ops.console.app import CONSOLE_PATH, Console, enable_console
from synapse.ops.console.auth import ConsoleAuth, Reviewer, TokenAuth

__all__ = ["CONSOLE_PATH", "Console", "ConsoleAuth", "Reviewer", "TokenAuth", "enable_console"]
