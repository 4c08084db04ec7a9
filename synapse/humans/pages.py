"""The pages a signed link opens, on the peer's own app: `GET {path}/links/{token}` shows the
question and a confirmation form and changes nothing but the audit trail's `human.viewed` (so
a mail scanner that fetches every link decides nothing); `POST` to the same URL decides.

A forged link is answered 403, an expired one 410, one used already (or a question answered
already) 409, and a refused answer 400, each with a page saying why and nothing changed.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

from synapse.humans.decisions import HumansHost, defaults, is_reviewer, link_used, told
from synapse.humans.links import Link, LinkRefused, LinkSigner
from synapse.humans.notices import shown
from synapse.humans.question import VIEWED, OpenQuestion
from synapse.logs import get_logger
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.runtime.answers import AnswerRefused
from synapse.transport.peer import Peer
from synapse.types import (
    DecidedBy,
    DecisionAction,
    LocalProtocolError,
    NackError,
    TaskState,
)

log = get_logger("synapse.humans")

#: Links carry their capability in the URL: never cached, never sent on as a Referer.
HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    ),
}
STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:42rem;margin:2rem auto;padding:0 1rem;"
    "color:#1d232a}h1{font-size:1.4rem}dt{font-weight:600;margin-top:.5rem}"
    "label{display:block;margin-top:.8rem;font-weight:600}input,textarea{width:100%;"
    "padding:.4rem;font:inherit;box-sizing:border-box}.opt{color:#56606b;font-size:.9rem}"
    "button{margin:1rem .5rem 0 0;padding:.5rem 1.2rem;font:inherit;border-radius:4px;"
    "border:1px solid #8893a0;cursor:pointer}.approve{background:#1f7a3a;color:#fff}"
    ".reject{background:#a32020;color:#fff}.notice{padding:1rem;border-radius:4px;"
    "background:#eef3f8}.refused{background:#fbeaea}"
)
#: How a deadline is written on a page (as in the mail).
STAMP = "%Y-%m-%d %H:%M:%S UTC"
#: Form bodies larger than this are refused.
MAX_FORM = 64 * 1024


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str, status: int = 200) -> web.Response:
    text = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{_e(title)}</h1>{body}</body></html>"
    )
    return web.Response(text=text, status=status, content_type="text/html", headers=HEADERS)


def _refused(status: int, reason: str, back: str | None = None) -> web.Response:
    """A refusal; `back`: where the person can try again (the form they came from)."""
    again = f"<p><a href='{_e(back)}'>Back to the form</a></p>" if back else ""
    body = f"<p class='notice refused'>{_e(reason)}</p>{again}"
    return _page("Nothing was decided", body, status)


def _facts(question: OpenQuestion) -> str:
    rec = question.rec
    rows = [("Task", f"{rec.task_id} ({rec.task.type})"), ("Partner", rec.partner)]
    if question.kind == "need_info":
        rows.append(("Question", question.reason or "information is asked for"))
    else:
        rows.append(("Reason", f"{question.reason_code}: {question.reason}".rstrip(": ")))
    if question.summary:
        rows.append(("Summary", question.summary))
    due = "Answer before" if question.kind == "need_info" else "Decide before"
    rows.append((due, datetime.fromtimestamp(question.window.deadline, UTC).strftime(STAMP)))
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows) + "</dl>"


def _option_notes(question: OpenQuestion, name: str) -> str:
    """Every value proposed for field `name` (the alternatives too), with its confidence and
    its pros and cons."""
    notes = [
        " — ".join(
            part
            for part in (
                shown(o.value),
                f"{o.confidence:g}%" if o.confidence is not None else "",
                o.pros_cons,
            )
            if part
        )
        for o in question.options
        if o.field == name
    ]
    return "".join(f"<div class=opt>{_e(n)}</div>" for n in notes)


def _form(question: OpenQuestion, link: Link) -> str:
    """The confirmation form of `link`'s action."""
    parts = ["<form method=post>"]
    if question.kind == "need_info":
        for name, why in question.missing:
            asked = question.rec.need_info.missing_fields if question.rec.need_info else []
            suggested = next((f.suggested_value for f in asked if f.field == name), None)
            value = "" if suggested is None else shown(suggested)
            parts.append(
                f"<label for='f-{_e(name)}'>{_e(name)}</label>"
                f"<div class=opt>{_e(why)}</div>"
                f"<input id='f-{_e(name)}' name='field:{_e(name)}' value='{_e(value)}'>"
            )
        parts.append("<label for=notes>Notes</label><textarea id=notes name=notes></textarea>")
        parts.append("<button class=approve name=decision value=provide>Send</button>")
        return "".join(parts) + "</form>"
    proposed = defaults(question)
    editable = link.action == "form"
    for name, value in proposed.items():
        text = shown(value)
        if editable:
            parts.append(
                f"<label for='f-{_e(name)}'>{_e(name)}</label>{_option_notes(question, name)}"
                f"<input id='f-{_e(name)}' name='field:{_e(name)}' value='{_e(text)}'>"
            )
        else:
            parts.append(
                f"<label>{_e(name)}</label>{_option_notes(question, name)}"
                f"<div><b>{_e(text)}</b></div>"
            )
    if link.action in ("reject", "form"):
        parts.append(
            "<label for=reason>Reason for a rejection</label>"
            "<textarea id=reason name=reason></textarea>"
        )
    parts.append("<label for=notes>Notes</label><textarea id=notes name=notes></textarea>")
    if link.action in ("approve", "form"):
        parts.append("<button class=approve name=decision value=approve>Approve</button>")
    if link.action in ("reject", "form"):
        parts.append("<button class=reject name=decision value=reject>Reject</button>")
    return "".join(parts) + "</form>"


class PagesHost(HumansHost, Protocol):
    """What the pages need of `Humans`."""

    links: LinkSigner
    peer: Peer

    def clock(self) -> float: ...

    def record(self, task_id: str) -> TaskRecord | None: ...

    def question_of(self, rec: TaskRecord) -> OpenQuestion | None: ...


def issued_for(link: Link, question: OpenQuestion) -> bool:
    """Whether `link` was issued for `question` (a link of an earlier question of the same
    task, answered long ago, decides nothing now)."""
    return link.question == question.id


@dataclass(frozen=True, slots=True)
class LinkAnswer:
    """What an answer through a link got: 200 and what was said, or a refusal's status and
    reason (`back`: a value of the form to correct, so the page links back to it)."""

    status: int
    text: str
    back: bool = False


class LinkPages:
    def __init__(self, humans: PagesHost) -> None:
        self.humans = humans
        #: One answer at a time: the checks (used link, answered already, quorum counts)
        #: and what they lead to are one step, so two clicks at once never both count.
        self._answering = asyncio.Lock()

    def _open(self, token: str) -> tuple[Link, OpenQuestion]:
        humans = self.humans
        link = humans.links.read(token, humans.clock())
        rec = humans.record(link.task_id)
        if rec is None:
            raise LinkRefused(404, "this task is not known here (any more)")
        question = humans.question_of(rec)
        if question is None:
            raise LinkRefused(409, _closed(rec))
        if not issued_for(link, question):
            raise LinkRefused(409, "this link was for another question, answered already")
        if not is_reviewer(humans.config, link.reviewer):
            raise LinkRefused(403, "this link's reviewer is not (or no longer) a reviewer here")
        if link.reviewer not in told(question):
            raise LinkRefused(403, "this question was not sent to this link's reviewer")
        if link_used(question, link.nonce):
            raise LinkRefused(409, "this link was used already")
        return link, question

    async def _at_owner(self, request: web.Request) -> web.StreamResponse | None:
        """On replicas: the page of the replica that works on the link's task, when that is
        not this one (the person cannot choose the replica the balancer picks); it checks
        the link itself. A link refused on its face is refused here, by `_open`."""
        owners = self.humans.peer.task_owners
        if owners is None:
            return None
        try:
            link = self.humans.links.read(request.match_info["token"], self.humans.clock())
        except LinkRefused:
            return None
        key = TaskKey(self.humans.protocol.view.agent_id, link.task_id)
        found = await owners.answer_at_owner(request, key)
        if isinstance(found, NackError):
            refused = _refused(503, "this task cannot be reached right now: try again shortly")
            refused.headers["Retry-After"] = "2"
            return refused
        return found

    async def view(self, request: web.Request) -> web.StreamResponse:
        if (elsewhere := await self._at_owner(request)) is not None:
            return elsewhere
        try:
            link, question = self._open(request.match_info["token"])
        except LinkRefused as exc:
            return _refused(exc.status, exc.reason)
        viewed = any(e.detail.get("nonce") == link.nonce for e in question.entries(VIEWED))
        if not viewed:  # who opened what: once per link
            detail = {
                "question": question.id,
                "nonce": link.nonce,
                "reviewer": link.reviewer,
                "link": link.action,
            }
            try:
                await self.humans.protocol.note_task(
                    question.rec.key, VIEWED, detail, link.reviewer
                )
            except NackError:  # the task moved to another replica meanwhile: ask again there
                refused = _refused(503, "this task moved meanwhile: reload the page")
                refused.headers["Retry-After"] = "1"
                return refused
        title = {
            "approve": "Approve this decision?",
            "reject": "Reject this decision?",
            "form": "A decision waits for you"
            if question.kind == "need_human"
            else "Information is asked for",
        }[link.action]
        return _page(title, _facts(question) + _form(question, link))

    async def decide(self, request: web.Request) -> web.StreamResponse:
        if (request.content_length or 0) > MAX_FORM:
            return _refused(413, "this form is too large")
        if (elsewhere := await self._at_owner(request)) is not None:
            return elsewhere
        form = await request.post()
        answered = await self.answer(request.match_info["token"], form)
        if answered.status == 200:
            return _page("Done", f"<p class=notice>{_e(answered.text)}</p>")
        refused = _refused(answered.status, answered.text, request.path if answered.back else None)
        if answered.status == 503:
            refused.headers["Retry-After"] = "2"
        return refused

    async def answer(self, token: str, form: Mapping[str, Any]) -> LinkAnswer:
        """A person's answer through the link `token`, with the fields of its `form`: what
        was said (200), or why nothing was decided. The page's `decide`, once the request is
        read and at the replica that holds the task (the simulation calls it directly)."""
        async with self._answering:
            try:
                link, question = self._open(token)
            except LinkRefused as exc:
                return LinkAnswer(exc.status, exc.reason)
            decision = str(form.get("decision", ""))
            if link.action != "form" and decision != link.action:
                return LinkAnswer(400, f"this link can only {link.action}")
            fields: dict[str, Any] = {}
            if link.action == "form":
                like = _proposed(question)
                for name, raw in form.items():
                    if name.startswith("field:"):
                        field = name[len("field:") :]
                        fields[field] = _value(str(raw), like.get(field))
            handle = self.humans.protocol.handle(question.rec.key)
            if handle is None:
                return LinkAnswer(404, "this task is not known here (any more)")
            by = DecidedBy(user_id=link.reviewer)
            notes, reason = str(form.get("notes", "")), str(form.get("reason", ""))
            try:
                if question.kind == "need_info":
                    if decision != "provide":
                        return LinkAnswer(400, "this question asks for information: provide it")
                    said = await handle.provide_info(
                        fields,
                        notes or None,
                        provided_by=link.reviewer,
                        front="link",
                        link=link.nonce,
                    )
                elif decision not in ("approve", "reject"):
                    return LinkAnswer(400, "the decision is approve or reject")
                else:
                    said = await handle.decide(
                        DecisionAction(decision),
                        approved_fields=fields if decision == "approve" else None,
                        rejection_reason=reason,
                        notes=notes,
                        decided_by=by,
                        front="link",
                        link=link.nonce,
                    )
            except AnswerRefused as exc:
                return LinkAnswer(exc.status, exc.reason, back=exc.status == 400)  # to correct
            except LocalProtocolError as exc:  # answered meanwhile (the console, a time-out)
                return LinkAnswer(409, f"this question was answered already: {exc}")
            except NackError as exc:  # the task moved to another replica meanwhile
                return LinkAnswer(503, f"nothing was decided: {exc.message}")
        return LinkAnswer(200, said)


def _proposed(question: OpenQuestion) -> dict[str, Any]:
    """What each field of the form held: the proposed values, or the suggested ones."""
    if question.kind == "need_info":
        need = question.rec.need_info
        return {f.field: f.suggested_value for f in need.missing_fields} if need else {}
    return defaults(question)


def _value(raw: str, like: Any = None) -> Any:
    """A form field's value: text for a field that holds text (no quotes needed), else JSON
    if it reads as JSON (`1024`, `true`), else the text (which the gate then refuses for a
    field of another type, saying so)."""
    if isinstance(like, str):
        try:  # a string written as JSON ("oil", with its quotes) is that string
            decoded = json.loads(raw)
        except ValueError:
            return raw
        return decoded if isinstance(decoded, str) else raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _closed(rec: TaskRecord) -> str:
    """Why a link decides nothing any more: its task ended, or its question was answered."""
    if rec.state is TaskState.CANCELLED:
        return "this task was cancelled: there is nothing left to decide"
    if rec.state.is_final:
        return f"this task has ended ({rec.state.value}): there is nothing left to decide"
    return f"this question was answered already: the task is {rec.state.value}"


def add_routes(app: web.Application, humans: PagesHost) -> None:
    pages = LinkPages(humans)
    path = humans.config.path.rstrip("/")
    app.router.add_get(f"{path}/links/{{token}}", pages.view)
    app.router.add_post(f"{path}/links/{{token}}", pages.decide)


__all__ = ["HEADERS", "LinkAnswer", "LinkPages", "PagesHost", "add_routes", "issued_for"]
