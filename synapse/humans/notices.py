"""What a notification says, and how each channel writes it: an e-mail (plain text and HTML),
a generic JSON webhook, a Slack incoming-webhook message (Block Kit) and a Microsoft Teams
incoming-webhook message (an Adaptive Card)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

#: Subjects and titles, by kind of notification, for a decision (need_human).
HEADLINES = {
    "notify": "A decision waits for you",
    "remind": "Reminder: a decision still waits for you",
    "escalate": "Escalated to you: a decision nobody took",
}
#: The same for information asked for (need_info): nothing is decided there.
INFO_HEADLINES = {
    "notify": "Information is asked of you",
    "remind": "Reminder: information is still asked of you",
    "escalate": "Escalated to you: information nobody gave",
}


def shown(value: Any) -> str:
    """A value as a person reads it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


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
    #: need_info: the value suggested for each field that has one.
    suggested: dict[str, Any] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        titles = INFO_HEADLINES if self.question == "need_info" else HEADLINES
        return titles.get(self.kind, titles["notify"])

    @property
    def due_label(self) -> str:
        """ "Decide before" a decision, "Answer before" a question for information."""
        return "Answer before" if self.question == "need_info" else "Decide before"

    @property
    def reason_line(self) -> str:
        """The question (need_info), or the reason with its code (need_human)."""
        if self.question == "need_info":
            return f"Question: {self.reason}" if self.reason else "Information is asked for."
        return (
            f"Reason: {self.reason_code}: {self.reason}"
            if self.reason
            else (f"Reason: {self.reason_code}")
        )

    def missing_lines(self) -> list[str]:
        """Each field asked for: why, and the suggested value if there is one."""
        out = []
        for name, why in self.missing:
            line = f"{name}: {why}" if why else name
            if name in self.suggested:
                line += f" (suggested: {shown(self.suggested[name])})"
            out.append(line)
        return out

    def option_line(self, option: Option) -> str:
        confidence = (
            f" (confidence {option.confidence:g}%)" if option.confidence is not None else ""
        )
        return f"{option.field} = {shown(option.value)}{confidence}"

    @property
    def deadline_text(self) -> str:
        return datetime.fromtimestamp(self.deadline, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def lines(self) -> list[str]:
        """The body as plain text lines."""
        out = [
            f"{self.headline} (level {self.level}).",
            "",
            f"Task {self.task_id} ({self.task_type}) with {self.partner}.",
            self.reason_line,
        ]
        if self.summary:
            out.append(f"Summary: {self.summary}")
        out.append(f"{self.due_label} {self.deadline_text}.")
        if self.options:
            out += ["", "Options:"]
            for option in self.options:
                out.append(f"- {self.option_line(option)}")
                if option.pros_cons:
                    out.append(f"  {option.pros_cons}")
        if self.missing:
            out += ["", "Information asked for:"]
            out += [f"- {line}" for line in self.missing_lines()]
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
        f"<li><b>{html.escape(o.field)}</b> = <code>{html.escape(shown(o.value))}</code>"
        + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
        + (f"<br>{html.escape(o.pros_cons)}" if o.pros_cons else "")
        + "</li>"
        for o in notice.options
    ) + "".join(f"<li>{html.escape(line)}</li>" for line in notice.missing_lines())
    buttons = " ".join(
        f'<a href="{html.escape(url)}">{html.escape(action.capitalize())}</a>'
        for action, url in notice.links.items()
    )
    message.add_alternative(
        f"<p><b>{html.escape(notice.headline)}</b> (level {notice.level})</p>"
        f"<p>Task <code>{html.escape(notice.task_id)}</code> ({html.escape(notice.task_type)})"
        f" with {html.escape(notice.partner)}.<br>{html.escape(notice.reason_line)}"
        f"<br>{notice.due_label} {notice.deadline_text}.</p>"
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
        "missing_fields": [
            {"field": name, "reason": why}
            | ({"suggested_value": notice.suggested[name]} if name in notice.suggested else {})
            for name, why in notice.missing
        ],
        "links": dict(notice.links),
    }


def _mrkdwn(text: str) -> str:
    # Slack's escaping: &, < and > only (https://api.slack.com/reference/surfaces/formatting).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(notice: Notice) -> dict[str, Any]:
    """A Slack incoming-webhook message: `text` (the fallback) and Block Kit `blocks`."""
    facts = "\n".join(
        f"*{_mrkdwn(o.field)}*: `{_mrkdwn(shown(o.value))}`"
        + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
        + (f" — {_mrkdwn(o.pros_cons)}" if o.pros_cons else "")
        for o in notice.options
    ) or "\n".join(f"• {_mrkdwn(line)}" for line in notice.missing_lines())
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": notice.headline[:150]}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": (
                    f"*Task* `{_mrkdwn(notice.task_id)}` ({_mrkdwn(notice.task_type)}) with "
                    f"{_mrkdwn(notice.partner)}\n{_mrkdwn(notice.reason_line)}\n"
                    f"*{notice.due_label}*: {notice.deadline_text}"
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
        {"title": "Reason", "value": notice.reason_line.partition(": ")[2] or notice.reason_line},
        {"title": notice.due_label, "value": notice.deadline_text},
        {"title": "Level", "value": str(notice.level)},
    ]
    options = [
        {
            "title": o.field,
            "value": shown(o.value)
            + (f" ({o.confidence:g}%)" if o.confidence is not None else "")
            + (f" — {o.pros_cons}" if o.pros_cons else ""),
        }
        for o in notice.options
    ] + [
        {"title": line.partition(":")[0], "value": line.partition(":")[2].strip() or "asked for"}
        for line in notice.missing_lines()
    ]
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
