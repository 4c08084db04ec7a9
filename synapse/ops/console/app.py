"""The console's routes: the page, its assets, the JSON API and the SSE stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from synapse.logs import get_logger
from synapse.ops.console.auth import ConsoleAuth, Reviewer, Session, Sessions, csrf_ok
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.p2p.states import Role
from synapse.runtime.answers import AnswerRefused
from synapse.runtime.listener import RuntimeListener
from synapse.store.base import TaskFilter
from synapse.transport.http1_server import LEAN_CALLBACKS
from synapse.types import (
    DecidedBy,
    DecisionAction,
    DeliveryError,
    LocalProtocolError,
    NackError,
    RemoteProtocolError,
    TaskState,
)
from synapse.types.enums import FINAL_STATES

if TYPE_CHECKING:
    from synapse.p2p.engine import Transition
    from synapse.runtime.protocol import P2PProtocol, TaskHandle
    from synapse.transport.peer import Peer

log = get_logger("synapse.console")

CONSOLE_PATH = "/console"
SESSION_COOKIE = "synapse_console"
CSRF_HEADER = "X-CSRF-Token"
#: Assets of the page (package data beside this module); the style is also the sign-in page's.
ASSETS = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "favicon.ico": "image/x-icon",
}
PUBLIC_ASSETS = frozenset({"console.css", "favicon.ico"})
#: Seconds to wait for a partner's capability_response (the new-task form's task types).
CAPABILITIES_TIMEOUT = 5.0
#: States in which a person at the requester is expected to answer.
WAITING = frozenset({TaskState.INFO_NEEDED, TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING})
#: Keep-alive comments on the event stream, so proxies do not close an idle one.
KEEPALIVE = 15.0
#: The largest JSON body an API call accepts.
MAX_BODY = 256 * 1024
#: Tasks in one list: every task waiting for a person, then the newest others.
LIST_LIMIT = 500
#: The event stream sends at most one list this often, however fast tasks change.
STREAM_INTERVAL = 0.25

_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _asset(name: str) -> bytes:
    return resources.files("synapse.ops.console").joinpath("static", name).read_bytes()


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value) if value is not None else None


def task_view(rec: TaskRecord, now: float, *, detail: bool = False) -> dict[str, Any]:
    """What the page shows of one task (`detail`: its payload, questions and history too)."""
    view: dict[str, Any] = {
        "requester": rec.key.requester,
        "task_id": rec.task_id,
        "role": rec.role.value,
        "partner": rec.partner,
        "type": rec.task.type,
        "state": rec.state.value,
        "progress": rec.progress,
        "status_message": rec.status_message,
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
        "age_seconds": max(0.0, now - rec.created_at),
        "waiting_for_person": rec.role is Role.REQUESTER and rec.state in WAITING,
        "final": rec.is_final,
    }
    if detail:
        view |= {
            "payload": rec.task.payload,
            "priority": rec.task.priority.value,
            "need_info": _builtins(rec.need_info) if rec.state is TaskState.INFO_NEEDED else None,
            "need_human": _builtins(rec.need_human)
            if rec.state in (TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING)
            else None,
            "result": _builtins(rec.result),
            "error": _builtins(rec.error),
            "reject": _builtins(rec.reject),
            "refusal": _builtins(rec.refusal),
            "history": [
                {
                    "at": t.at,
                    "from_state": t.from_state.value,
                    "to_state": t.to_state.value,
                    "event": t.event.value,
                    "message_id": t.message_id,
                }
                for t in rec.history
            ],
            "audit": [msgspec.to_builtins(entry) for entry in rec.audit],
        }
    return view


#: The request key of a reviewer another replica signed in and vouches for.
_VOUCHED = "synapse.console.vouched"

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    403: web.HTTPForbidden,
    404: web.HTTPNotFound,
    409: web.HTTPConflict,
    503: web.HTTPServiceUnavailable,
}


#: The states a decision answers.
_DECIDING = frozenset({TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING})


def _error(status: int, message: str, **extra: Any) -> web.HTTPException:
    """A JSON error the page shows (`{"error": ...}`)."""
    body = json.dumps({"error": message, **extra})
    if status == 413:
        return web.HTTPRequestEntityTooLarge(
            max_size=MAX_BODY, actual_size=MAX_BODY + 1, text=body, content_type="application/json"
        )
    return _ERRORS[status](text=body, content_type="application/json")


class Console(RuntimeListener):
    """The console of one `Peer` (see `enable_console`)."""

    def __init__(
        self,
        peer: Peer,
        auth: ConsoleAuth,
        *,
        path: str = CONSOLE_PATH,
        secure_cookie: bool = False,
        session_lifetime: float = 8 * 3600.0,
    ) -> None:
        self.peer = peer
        self.auth = auth
        self.path = path.rstrip("/")
        #: Mark the cookie `Secure` (serve the console over HTTPS, or behind a TLS proxy).
        self.secure_cookie = secure_cookie
        self.sessions = Sessions(session_lifetime)
        #: Extra panels of a task's page: name → (title, rows of that task, or none).
        self.panels: dict[str, tuple[str, Callable[[TaskRecord], list[dict[str, Any]]]]] = {}
        #: Rules of who sees which task (`restrict`): a task is shown if every rule allows it.
        self.rules: list[Callable[[Reviewer, TaskRecord], bool]] = []
        self._version = 0
        self._wake = asyncio.Event()
        self._closing = False

    def add_panel(
        self, name: str, title: str, rows: Callable[[TaskRecord], list[dict[str, Any]]]
    ) -> None:
        """Show a table on each task's page: `rows(record)` (plain JSON values; an empty list
        shows nothing). Other layers say what they know of a task this way, the A2A binding
        its push deliveries, without the console importing them."""
        self.panels[name] = (title, rows)

    def restrict(self, rule: Callable[[Reviewer, TaskRecord], bool]) -> None:
        """Show (and let answer) a task only to the reviewers `rule(reviewer, record)` allows:
        `synapse.humans` shows a reviewer only the questions routed to them."""
        self.rules.append(rule)

    def _visible(self, reviewer: Reviewer, rec: TaskRecord) -> bool:
        return all(rule(reviewer, rec) for rule in self.rules)

    def _panels(self, rec: TaskRecord) -> list[dict[str, Any]]:
        shown = []
        for name, (title, rows) in self.panels.items():
            try:
                found = rows(rec)
            except Exception as exc:  # a panel never breaks the page
                log.warning("console_panel_failed", panel=name, error=repr(exc))
                continue
            if found:
                shown.append({"name": name, "title": title, "rows": found})
        return shown

    # --- RuntimeListener: anything that changes what the page shows ---------------------------

    def on_transition(self, transition: Transition) -> None:
        self._changed()

    def on_dead_letter(self, message: Any, partner: str, reason: str) -> None:
        self._changed()

    def _changed(self) -> None:
        self._version += 1
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    # --- wiring -------------------------------------------------------------------------------

    @property
    def protocol(self) -> P2PProtocol:
        protocol: P2PProtocol | None = getattr(self.peer, "_protocol", None)
        if protocol is None or not protocol.running:
            raise _error(503, "the peer is not running")
        return protocol

    def add_routes(self, app: web.Application) -> None:
        p = self.path
        router = app.router
        router.add_get(p, self.page)
        router.add_get(p + "/", self.page)
        router.add_post(p + "/login", self.login)
        router.add_post(p + "/logout", self.logout)
        router.add_get(p + "/static/{name}", self.asset)
        # Browsers ask the site root for its icon, whatever the page says.
        if not any(
            route.resource is not None and route.resource.canonical == "/favicon.ico"
            for route in router.routes()
        ):
            router.add_get("/favicon.ico", self.favicon)
        router.add_get(p + "/api/session", self.api_session)
        router.add_get(p + "/api/tasks", self.api_tasks)
        router.add_get(p + "/api/partners/{partner}/capabilities", self.api_capabilities)
        router.add_post(p + "/api/tasks", self.api_submit)
        router.add_get(p + "/api/tasks/{requester}/{task_id}", self.api_task)
        router.add_post(p + "/api/tasks/{task_id}/info", self.api_info)
        router.add_post(p + "/api/tasks/{task_id}/decision", self.api_decision)
        router.add_post(p + "/api/tasks/{task_id}/cancel", self.api_cancel)
        router.add_post(p + "/api/tasks/{task_id}/deciding", self.api_deciding)
        router.add_get(p + "/api/events", self.api_events)
        app.middlewares.append(self._headers_middleware())
        app.on_shutdown.append(self._shutdown)

    def _headers_middleware(self) -> Any:
        prefix = self.path

        @web.middleware
        async def headers(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path != prefix and not request.path.startswith(prefix + "/"):
                return await handler(request)
            owners = self.peer.task_owners
            if owners is not None and (user := await owners.vouched(request)) is not None:
                request[_VOUCHED] = Reviewer(**json.loads(user))
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                exc.headers.update(_SECURITY_HEADERS)
                raise
            if not response.prepared:
                response.headers.update(_SECURITY_HEADERS)
            return response

        # Nothing to do on the callback route (not under the console's prefix).
        setattr(headers, LEAN_CALLBACKS, None)
        return headers

    async def _shutdown(self, app: web.Application) -> None:
        self._closing = True
        self._changed()

    # --- who is asking --------------------------------------------------------------------------

    def _identify(self, request: web.Request) -> tuple[Reviewer, Session | None] | None:
        vouched = request.get(_VOUCHED)
        if isinstance(vouched, Reviewer):  # signed in (and CSRF-checked) by another replica
            return vouched, None
        authorization = request.headers.get("Authorization", "")
        if authorization[:7].lower() == "bearer ":
            reviewer = self.auth.bearer(authorization[7:].strip())
            return (reviewer, None) if reviewer is not None else None
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        return (session.reviewer, session) if session is not None else None

    def _require(self, request: web.Request, *, change: bool = False) -> Reviewer:
        """The signed-in reviewer; for a change, a session must also show its CSRF token."""
        who = self._identify(request)
        if who is None:
            raise _error(401, "sign in first", sign_in=self.path)
        reviewer, session = who
        if change and session is not None:
            if not _same_origin(request):
                raise _error(403, "cross-origin request refused")
            if not csrf_ok(session, request.headers.get(CSRF_HEADER)):
                raise _error(403, "missing or wrong CSRF token")
        return reviewer

    async def _at_owner(
        self, request: web.Request, key: TaskKey, reviewer: Reviewer
    ) -> web.StreamResponse | None:
        """On replicas: the answer of the replica working on task `key`, if not this one
        (a balancer picks the replica, not the person); `reviewer`, signed in here, is
        vouched for there."""
        owners = self.peer.task_owners
        if owners is None:
            return None
        user = json.dumps(
            {"user_id": reviewer.user_id, "user_name": reviewer.user_name, "role": reviewer.role}
        )
        found = await owners.answer_at_owner(request, key, user=user)
        if isinstance(found, NackError):
            raise _error(503, "the replica working on this task cannot be reached: retry")
        return found

    # --- page, sign-in, assets ------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        if self._identify(request) is None:
            return self._sign_in_page()
        html = _asset("console.html").decode().replace("{{path}}", self.path)
        return web.Response(text=html, content_type="text/html")

    def _sign_in_page(self, error: str = "", status: int = 200) -> web.Response:
        html = _asset("signin.html").decode()
        html = html.replace("{{path}}", self.path).replace("{{scheme}}", self.auth.scheme)
        html = html.replace("{{agent_id}}", _escape(self.peer.agent_id))
        html = html.replace("{{error}}", _escape(error))
        return web.Response(text=html, content_type="text/html", status=status)

    async def login(self, request: web.Request) -> web.Response:
        if not _same_origin(request):
            raise _error(403, "cross-origin request refused")
        form = await request.post()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        reviewer = self.auth.sign_in(fields)
        if reviewer is None:
            log.warning("console_sign_in_refused", scheme=self.auth.scheme)
            return self._sign_in_page("That did not sign you in.", status=401)
        session_id, _ = self.sessions.create(reviewer)
        log.info("console_signed_in", user_id=reviewer.user_id)
        response = web.HTTPSeeOther(self.path)
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            path=self.path,
            httponly=True,
            samesite="Strict",
            secure=self.secure_cookie,
            max_age=int(self.sessions.lifetime),
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        self._require(request, change=True)
        self.sessions.end(request.cookies.get(SESSION_COOKIE))
        response = web.json_response({"signed_out": True})
        response.del_cookie(SESSION_COOKIE, path=self.path)
        return response

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise _error(404, "no such asset")
        if name not in PUBLIC_ASSETS:
            self._require(request)
        return web.Response(body=_asset(name), content_type=ASSETS[name])

    async def favicon(self, request: web.Request) -> web.Response:
        return web.Response(
            body=_asset("favicon.ico"),
            content_type=ASSETS["favicon.ico"],
            headers={"Cache-Control": "public, max-age=86400"},
        )

    # --- the API --------------------------------------------------------------------------------

    async def api_capabilities(self, request: web.Request) -> web.Response:
        """What a partner offers (a `capability_query`): the new-task form's task types."""
        self._require(request)
        partner = request.match_info["partner"]
        if self.peer.partners.get(partner) is None:
            raise _error(404, f"no partner {partner!r}")
        try:
            async with asyncio.timeout(CAPABILITIES_TIMEOUT):
                answer = await self.protocol.query_capabilities(partner)
        except (TimeoutError, RemoteProtocolError, DeliveryError) as exc:
            raise _error(502, f"{partner} did not say what it offers: {exc}") from exc
        return web.json_response(
            {
                "partner": partner,
                "capabilities": [msgspec.to_builtins(c) for c in answer.capabilities],
            }
        )

    async def api_session(self, request: web.Request) -> web.Response:
        reviewer = self._require(request)
        who = self._identify(request)
        session = who[1] if who is not None else None
        return web.json_response(
            {
                "reviewer": msgspec.to_builtins(reviewer),
                "csrf_token": session.csrf_token if session is not None else None,
                "agent_id": self.peer.agent_id,
                "partners": sorted(p.agent_id for p in self.peer.partners),
                "states": [s.value for s in TaskState],
            }
        )

    def _task_list(self, reviewer: Reviewer, state: str | None = None) -> list[dict[str, Any]]:
        now = self.protocol.clock()
        records = [
            r for r in self.protocol.view.records() if state is None or r.state.value == state
        ]
        # Finished tasks leave memory for the store (docs/durability.md): the newest of them.
        # Between replicas, the live tasks the others hold are there too, as last committed
        # (a person at any replica sees every question; what they answer goes to the holder).
        stored = FINAL_STATES if self.peer.task_owners is None else frozenset(TaskState)
        wanted = stored if state is None else stored & {TaskState(state)}
        held = {r.key for r in records}
        for states in (wanted - FINAL_STATES, wanted & FINAL_STATES):
            if not states:
                continue
            rows = self.protocol.store.list_tasks(
                limit=LIST_LIMIT, where=TaskFilter(states=frozenset(states))
            )
            for row in rows:
                rec = self.protocol.view.get(row.key) if row.key not in held else None
                if rec is not None:
                    records.append(rec)
        records = [r for r in records if self._visible(reviewer, r)]
        # Waiting for a person first, then the newest: a person's questions are never cut off.
        records.sort(
            key=lambda r: (r.role is Role.REQUESTER and r.state in WAITING, r.created_at),
            reverse=True,
        )
        return [task_view(r, now) for r in records[:LIST_LIMIT]]

    async def api_tasks(self, request: web.Request) -> web.Response:
        reviewer = self._require(request)
        state = request.query.get("state") or None
        if state is not None and state not in {s.value for s in TaskState}:
            raise _error(400, f"unknown state {state!r}")
        return web.json_response({"tasks": self._task_list(reviewer, state)})

    async def api_task(self, request: web.Request) -> web.StreamResponse:
        reviewer = self._require(request)
        key = TaskKey(request.match_info["requester"], request.match_info["task_id"])
        if (elsewhere := await self._at_owner(request, key, reviewer)) is not None:
            return elsewhere
        rec = self.protocol.view.get(key)
        if rec is None or not self._visible(reviewer, rec):
            raise _error(404, "no such task")
        view = task_view(rec, self.protocol.clock(), detail=True)
        view["panels"] = self._panels(rec)
        return web.json_response(view)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if request.content_type != "application/json":
            raise _error(400, "send application/json")
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise _error(413, "body too large")
        # Read once and kept (a replica vouched to has read it already); the app's own
        # body limit bounds a body sent without a length.
        raw = await request.read()
        if len(raw) > MAX_BODY:
            raise _error(413, "body too large")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise _error(400, f"not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _error(400, "send a JSON object")
        return body

    def _key(self, request: web.Request) -> TaskKey:
        """Our requester task named in the URL."""
        return TaskKey(self.peer.agent_id, request.match_info["task_id"])

    def _waiting(
        self, key: TaskKey, states: frozenset[TaskState], reviewer: Reviewer
    ) -> TaskHandle:
        """The handle of our requester task `key`, if it is in one of `states` (and
        `reviewer` may see it)."""
        rec = self.protocol.view.get(key)
        handle = self.protocol.handle(key) if rec is not None else None
        if rec is None or handle is None or not self._visible(reviewer, rec):
            raise _error(404, "no such task requested by this peer")
        if rec.state not in states:
            raise _error(409, f"the task is {rec.state.value}, not waiting for this answer")
        return handle

    async def api_submit(self, request: web.Request) -> web.Response:
        reviewer = self._require(request, change=True)
        body = await self._body(request)
        partner, task_type = body.get("partner"), body.get("task_type")
        payload = body.get("payload", {})
        if not isinstance(partner, str) or partner not in self.peer.partners:
            raise _error(400, "`partner` must be one of this peer's partners")
        if not isinstance(task_type, str) or not task_type:
            raise _error(400, "`task_type` must be a non-empty string")
        if not isinstance(payload, dict):
            raise _error(400, "`payload` must be a JSON object")
        try:
            handle = await self.peer.submit(partner, task_type, payload)
        except (LocalProtocolError, ValueError, msgspec.ValidationError) as exc:
            raise _error(400, str(exc)) from exc
        log.info(
            "console_task_submitted",
            task_id=handle.task_id,
            partner=partner,
            type=task_type,
            user_id=reviewer.user_id,
        )
        return web.json_response(task_view(handle.record, self.protocol.clock(), detail=True))

    async def api_info(self, request: web.Request) -> web.StreamResponse:
        reviewer = self._require(request, change=True)
        key = self._key(request)
        if (elsewhere := await self._at_owner(request, key, reviewer)) is not None:
            return elsewhere
        self._waiting(key, frozenset({TaskState.INFO_NEEDED}), reviewer)  # before the body
        return web.json_response(await self.provide(reviewer, key, await self._body(request)))

    async def provide(
        self, reviewer: Reviewer, key: TaskKey, body: dict[str, Any]
    ) -> dict[str, Any]:
        """`reviewer` provides the information task `key` waits for, as `POST
        .../info` takes it once the request is read and found to be the holder's: the task's
        view, with what the answer gate `said`; a refusal is raised as the HTTP error the
        page shows."""
        handle = self._waiting(key, frozenset({TaskState.INFO_NEEDED}), reviewer)
        fields, notes = body.get("fields"), body.get("notes")
        if not isinstance(fields, dict):
            raise _error(400, "`fields` must be a JSON object")
        if notes is not None and not isinstance(notes, str):
            raise _error(400, "`notes` must be a string")
        need = handle.record.need_info
        missing = [f.field for f in need.missing_fields if f.field not in fields] if need else []
        if missing:
            raise _error(400, f"missing fields: {', '.join(missing)}", missing=missing)
        try:
            said = await handle.provide_info(
                fields, notes or None, provided_by=reviewer.user_id, front="console"
            )
        except AnswerRefused as exc:
            raise _error(exc.status, exc.reason) from exc
        except NackError as exc:  # the task moved to another replica meanwhile
            raise _error(503, exc.message) from exc
        except (LocalProtocolError, msgspec.ValidationError) as exc:
            raise _error(409, str(exc)) from exc
        log.info("console_info_provided", task_id=handle.task_id, user_id=reviewer.user_id)
        view = task_view(handle.record, self.protocol.clock(), detail=True)
        return {**view, "said": said}

    async def api_decision(self, request: web.Request) -> web.StreamResponse:
        reviewer = self._require(request, change=True)
        key = self._key(request)
        if (elsewhere := await self._at_owner(request, key, reviewer)) is not None:
            return elsewhere
        self._waiting(key, _DECIDING, reviewer)  # before the body
        return web.json_response(await self.decide(reviewer, key, await self._body(request)))

    async def decide(
        self, reviewer: Reviewer, key: TaskKey, body: dict[str, Any]
    ) -> dict[str, Any]:
        """`reviewer`'s decision on the question task `key` waits on, as `POST .../decision`
        takes it once the request is read and found to be the holder's: the task's view,
        with what the answer gate `said`; a refusal is raised as the HTTP error the page
        shows."""
        handle = self._waiting(key, _DECIDING, reviewer)
        action = body.get("action")
        approved = body.get("approved_fields", {})
        reason = body.get("rejection_reason", "")
        notes = body.get("notes", "")
        if action not in ("approve", "reject"):
            raise _error(400, "`action` must be approve or reject")
        if not isinstance(approved, dict):
            raise _error(400, "`approved_fields` must be a JSON object")
        if not isinstance(reason, str) or not isinstance(notes, str):
            raise _error(400, "`rejection_reason` and `notes` must be strings")
        if action == "reject" and not reason.strip():
            raise _error(400, "a rejection needs a reason")
        decided_by = DecidedBy(
            user_id=reviewer.user_id, user_name=reviewer.user_name, role=reviewer.role
        )
        try:
            said = await handle.decide(
                DecisionAction(action),
                approved_fields=approved if action == "approve" else None,
                rejection_reason=reason.strip() if action == "reject" else "",
                notes=notes,
                decided_by=decided_by,
                front="console",
            )
        except AnswerRefused as exc:
            raise _error(exc.status, exc.reason) from exc
        except NackError as exc:  # the task moved to another replica meanwhile
            raise _error(503, exc.message) from exc
        except (LocalProtocolError, msgspec.ValidationError) as exc:
            raise _error(409, str(exc)) from exc
        log.info(
            "console_decision",
            task_id=handle.task_id,
            action=action,
            user_id=reviewer.user_id,
        )
        view = task_view(handle.record, self.protocol.clock(), detail=True)
        return {**view, "said": said}

    async def api_deciding(self, request: web.Request) -> web.StreamResponse:
        """A person opened a `task_need_human`: `need_human → human_deciding` (ours only)."""
        reviewer = self._require(request, change=True)
        if (elsewhere := await self._at_owner(request, self._key(request), reviewer)) is not None:
            return elsewhere
        handle = self._waiting(self._key(request), frozenset({TaskState.NEED_HUMAN}), reviewer)
        try:
            await handle.start_deciding()
        except LocalProtocolError as exc:
            raise _error(409, str(exc)) from exc
        except NackError as exc:
            raise _error(503, exc.message) from exc
        log.info("console_deciding", task_id=handle.task_id, user_id=reviewer.user_id)
        return web.json_response(task_view(handle.record, self.protocol.clock(), detail=True))

    async def api_cancel(self, request: web.Request) -> web.StreamResponse:
        reviewer = self._require(request, change=True)
        key = self._key(request)
        if (elsewhere := await self._at_owner(request, key, reviewer)) is not None:
            return elsewhere
        handle = self.protocol.handle(key)
        if handle is None or not self._visible(reviewer, handle.record):
            raise _error(404, "no such task requested by this peer")
        if handle.record.is_final:
            raise _error(409, f"the task is already {handle.state.value}")
        try:
            await handle.cancel(f"cancelled by {reviewer.user_id} in the console")
        except NackError as exc:
            raise _error(503, exc.message) from exc
        log.info("console_cancel", task_id=handle.task_id, user_id=reviewer.user_id)
        return web.json_response(task_view(handle.record, self.protocol.clock(), detail=True))

    async def api_events(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: the task list each time it changes (and keep-alives)."""
        reviewer = self._require(request)
        session_id = request.cookies.get(SESSION_COOKIE)
        by_session = self._identify(request)
        uses_session = by_session is not None and by_session[1] is not None
        response = web.StreamResponse(
            headers={
                **_SECURITY_HEADERS,
                "Content-Type": "text/event-stream",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        sent = -1
        try:
            while not self._closing:
                if uses_session and self.sessions.get(session_id) is None:
                    await response.write(b"event: signed_out\ndata: {}\n\n")
                    break
                wake = self._wake
                if sent != self._version:
                    sent = self._version
                    data = json.dumps({"tasks": self._task_list(reviewer)}, separators=(",", ":"))
                    await response.write(f"event: tasks\ndata: {data}\n\n".encode())
                else:
                    await response.write(b": keep-alive\n\n")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), KEEPALIVE)
                if sent != self._version and not self._closing:
                    # Coalesce a burst of changes into one list (a rate limit, not a wait).
                    await asyncio.sleep(STREAM_INTERVAL)
        except (ConnectionResetError, ConnectionError):
            pass
        return response


def _same_origin(request: web.Request) -> bool:
    """No `Origin` (not a browser's cross-site request), or ours."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == request.host.lower()


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#39;")
    )


def enable_console(
    peer: Peer,
    auth: ConsoleAuth,
    *,
    path: str = CONSOLE_PATH,
    secure_cookie: bool = False,
) -> Console:
    """Serve the console under `path` on `peer`'s app (call before `start()` / `attach()`)."""
    console = Console(peer, auth, path=path, secure_cookie=secure_cookie)
    peer.protocol_hooks.append(lambda protocol: protocol.listeners.append(console))
    peer.app_hooks.append(console.add_routes)
    return console


__all__ = ["CONSOLE_PATH", "Console", "enable_console", "task_view"]
