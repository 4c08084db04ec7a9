"""What a notification says, and how each channel writes it: an e-mail (plain text and HTML),
a generic JSON webhook, a Slack incoming-webhook message (Block Kit) and a Microsoft Teams
incoming-webhook message (an Adaptive Card)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

#: Subjects and titles, by kind of notification.
HEADLINES = {
    "notify": "A decision waits for you",
    "remind": "Reminder: a decision still waits for you",
    "escalate": "Escalated to you: a decision nobody took",
}


@dataclass(frozen=True, slots=True)
class Option:
    field: str
    value: Any
    pros_cons: str = ""
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """One notification of one question, for one channel (and one reviewer, for e-mail)."""

    kind: str  # notify, remind, escalate
    task_id: str
    task_type: str
    partner: str
    question: str  # need_human, need_info
    level: int
    reason_code: str
    reason: str
    summary: str
    deadline: float
    #: Its idempotency key: the same notification sent again has the same one.
    key: str
    options: tuple[Option, ...] = ()
    #: need_info: the fields asked for, with why.
    missing: tuple[tuple[str, str], ...] = ()
    #: action → URL (approve, reject, form).
    links: dict[str, str] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        return HEADLINES.get(self.kind, HEADLINES["notify"])

    @property
    def deadline_text(self) -> str:
        return datetime.fromtimestamp(self.deadline, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def lines(self) -> list[str]:
        """The body as plain text lines."""
        out = [
            f"{self.headline} (level {self.level}).",
            "",
            f"Task {self.task_id} ({self.task_type}) with {self.partner}.",
            f"Reason: {self.reason_code}: {self.reason}"
            if self.reason
            else f"Reason: {self.reason_code}",
        ]
        if self.summary:
            out.append(f"Summary: {self.summary}")
        out.append(f"Decide before {self.deadline_text}.")
        if self.options:
            out += ["", "Options:"]
            for option in self.options:
                confidence = (
                    f" (confidence {option.confidence:g}%)" if option.confidence is not None else ""
                )
                out.append(f"- {option.field} = {option.value!r}{confidence}")
                if option.pros_cons:
                    out.append(f"  {option.pros_cons}")
        if self.missing:
            out += ["", "Information asked for:"]
            out += [f"- {name}: {why}" if why else f"- {name}" for name, why in self.missing]
        if self.links:
            out.append("")
            out += [f"{action.capitalize()}: {url}" for action, url in self.links.items()]
        return out


def email_message(notice: Notice, *, sender: str, to: str) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = f"[synapse] {notice.headline}: {notice.task_type} {notice.task_id}"
    message["From"] = sender
    message["To"] = to
    message["Date"] = formatdate(localtime=False)
    domain = sender.rpartition("@")[2] or "synapse.local"
    # The same notification sent again (after a crash) has the same Message-ID.
    message["Message-ID"] = f"<{notice.key.replace(':', '.')}@{domain}>"
    message["X-Synapse-Task"] = notice.task_id
    message["X-Synapse-Notification"] = notice.key
    message.set_content("\n".join(notice.lines()) + "\n")
    items = "".join(
        f"<li><b>{html.escape(o.field)}</b> = <code>{html.escape(repr(o.value))}</code>"
        + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
        + (f"<br>{html.escape(o.pros_cons)}" if o.pros_cons else "")
        + "</li>"
        for o in notice.options
    )
    buttons = " ".join(
        f'<a href="{html.escape(url)}">{html.escape(action.capitalize())}</a>'
        for action, url in notice.links.items()
    )
    message.add_alternative(
        f"<p><b>{html.escape(notice.headline)}</b> (level {notice.level})</p>"
        f"<p>Task <code>{html.escape(notice.task_id)}</code> ({html.escape(notice.task_type)})"
        f" with {html.escape(notice.partner)}.<br>Reason: {html.escape(notice.reason_code)}: "
        f"{html.escape(notice.reason)}<br>Decide before {notice.deadline_text}.</p>"
        + (f"<ul>{items}</ul>" if items else "")
        + f"<p>{buttons}</p>",
        subtype="html",
    )
    return message


def webhook_body(notice: Notice) -> dict[str, Any]:
    """The generic webhook's JSON body."""
    return {
        "event": f"synapse.human.{notice.kind}",
        "idempotency_key": notice.key,
        "task_id": notice.task_id,
        "task_type": notice.task_type,
        "partner": notice.partner,
        "question": notice.question,
        "level": notice.level,
        "reason": {"code": notice.reason_code, "message": notice.reason},
        "summary": notice.summary,
        "deadline": datetime.fromtimestamp(notice.deadline, UTC).isoformat(),
        "options": [
            {
                "field": o.field,
                "value": o.value,
                "pros_cons": o.pros_cons,
                "confidence": o.confidence,
            }
            for o in notice.options
        ],
        "missing_fields": [{"field": name, "reason": why} for name, why in notice.missing],
        "links": dict(notice.links),
    }


def _mrkdwn(text: str) -> str:
    # Slack's escaping: &, < and > only (https://api.slack.com/reference/surfaces/formatting).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(notice: Notice) -> dict[str, Any]:
    """A Slack incoming-webhook message: `text` (the fallback) and Block Kit `blocks`."""
    facts = "\n".join(
        f"*{_mrkdwn(o.field)}*: `{_mrkdwn(repr(o.value))}`"
        + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
        + (f" — {_mrkdwn(o.pros_cons)}" if o.pros_cons else "")
        for o in notice.options
    ) or "\n".join(f"*{_mrkdwn(name)}*: {_mrkdwn(why)}" for name, why in notice.missing)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": notice.headline[:150]}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": (
                    f"*Task* `{_mrkdwn(notice.task_id)}` ({_mrkdwn(notice.task_type)}) with "
                    f"{_mrkdwn(notice.partner)}\n*Reason*: {_mrkdwn(notice.reason_code)}: "
                    f"{_mrkdwn(notice.reason)}\n*Decide before*: {notice.deadline_text}"
                    f" (level {notice.level})"
                ),
            },
        },
    ]
    if facts:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": facts[:3000]}})
    if notice.links:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": action.capitalize()},
                        "url": url,
                        "action_id": f"synapse_{action}",
                        **(
                            {"style": {"approve": "primary", "reject": "danger"}[action]}
                            if action in ("approve", "reject")
                            else {}
                        ),
                    }
                    for action, url in notice.links.items()
                ],
            }
        )
    return {"text": f"{notice.headline}: {notice.task_type} {notice.task_id}", "blocks": blocks}


def teams_body(notice: Notice) -> dict[str, Any]:
    """A Microsoft Teams incoming-webhook message carrying an Adaptive Card (1.4)."""
    facts = [
        {"title": "Task", "value": f"{notice.task_id} ({notice.task_type})"},
        {"title": "Partner", "value": notice.partner},
        {"title": "Reason", "value": f"{notice.reason_code}: {notice.reason}"},
        {"title": "Decide before", "value": notice.deadline_text},
        {"title": "Level", "value": str(notice.level)},
    ]
    options = [
        {
            "title": o.field,
            "value": repr(o.value)
            + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
            + (f" — {o.pros_cons}" if o.pros_cons else ""),
        }
        for o in notice.options
    ] + [{"title": name, "value": why or "asked for"} for name, why in notice.missing]
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "size": "Medium", "weight": "Bolder", "text": notice.headline},
        {"type": "FactSet", "facts": facts},
    ]
    if notice.summary:
        body.append({"type": "TextBlock", "text": notice.summary, "wrap": True})
    if options:
        body.append({"type": "FactSet", "facts": options})
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
        "actions": [
            {"type": "Action.OpenUrl", "title": action.capitalize(), "url": url}
            for action, url in notice.links.items()
        ],
    }
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


__all__ = [
    "HEADLINES",
    "Notice",
    "Option",
    "email_message",
    "slack_body",
    "teams_body",
    "webhook_body",
]
