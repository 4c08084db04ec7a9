"""Who is told of a question, through what, when it escalates, and what happens if nobody
answers: the configuration of `synapse.humans`, from Python or from the TOML file.

    [humans]
    public_url = "https://agents.example.com"   # where the links in notifications point
    link_secret_file = "links.secret"           # HMAC key of the links (or link_secret)

    [[humans.reviewer]]
    id = "alice"
    email = "alice@example.com"
    role = "art-director"

    [[humans.channel]]
    name = "mail"
    kind = "email"                              # email, webhook, slack, teams
    smtp_host = "smtp.example.com"
    smtp_port = 587                             # STARTTLS, then login
    username = "synapse"
    password_file = "smtp.password"
    sender = "synapse@example.com"

    [[humans.channel]]
    name = "design-room"
    kind = "slack"
    url = "https://hooks.slack.com/services/…"

    [[notify]]                                  # a route: the first that matches a question
    name = "portraits"
    task_types = ["portrait"]                   # any of these (absent: any task type)
    partners = ["agent-e"]                      # any of these (absent: any partner)
    questions = ["need_human"]                  # need_human, need_info (absent: both)
    reason_codes = ["low_confidence"]           # need_human.reason.code (absent: any)
    min_escalation_level = 1                    # need_human.escalation_level at least this
    decide_within = "1h"                        # when the question sets no deadline
    reminders = [0.5, 0.9]                      # at these fractions of the time to the deadline
    on_timeout = "reject"                       # reject, approve_default, fail, protocol
    timeout_margin = "30s"                      # acts this long before the deadline
    quorum = 2                                  # approvals needed (of the reviewers notified)
    schema_file = "portrait.schema.json"        # checks the approved fields (or schema = {…})

    [[notify.level]]                            # level 1, then 2, … (escalation)
    reviewers = ["alice", "bob", "carol"]
    channels = ["mail", "design-room"]
    within = "10m"                              # then the next level is told

A route's `role = "lead"` asks instead for one approval by a reviewer of that role.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from synapse._distribution import install
from synapse.p2p.durations import parse_duration
from synapse.types.errors import SynapseException, unknown_key

ChannelKind = Literal["email", "webhook", "slack", "teams"]
CHANNEL_KINDS: Final = ("email", "webhook", "slack", "teams")
QuestionKind = Literal["need_human", "need_info"]
QUESTIONS: Final = ("need_human", "need_info")
TimeoutAction = Literal["reject", "approve_default", "fail", "protocol"]
TIMEOUT_ACTIONS: Final = ("reject", "approve_default", "fail", "protocol")
#: When a question sets no deadline and its route no `decide_within`.
DEFAULT_DECIDE_WITHIN: Final = 24 * 3600.0


class HumansConfigError(SynapseException, ValueError):
    """The humans configuration is wrong; the message says where."""


@dataclass(frozen=True, slots=True)
class Person:
    id: str
    name: str = ""
    email: str = ""
    role: str = ""


@dataclass(frozen=True, slots=True)
class Channel:
    """Where notifications go: e-mail to the reviewers of a level, or one webhook."""

    name: str
    kind: ChannelKind
    #: Webhooks: the URL POSTed to.
    url: str = ""
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 587
    #: Upgrade the connection with STARTTLS before logging in (as port 587 expects).
    starttls: bool = True
    username: str = ""
    password: str = ""
    sender: str = "synapse@localhost"
    #: A CA bundle to check the SMTP server's certificate with (the system's by default).
    ca_file: str = ""
    #: Seconds one attempt may take.
    timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Level:
    """One escalation level: who is told, through what, and for how long before the next."""

    reviewers: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    #: Seconds this level has to answer before the next is told (None: until the deadline).
    within: float | None = None


@dataclass(frozen=True, slots=True)
class NotifyRoute:
    """Which questions it takes, and the policy for them (see the module's example)."""

    name: str
    levels: tuple[Level, ...]
    task_types: frozenset[str] = frozenset()
    partners: frozenset[str] = frozenset()
    questions: frozenset[str] = frozenset(QUESTIONS)
    reason_codes: frozenset[str] = frozenset()
    min_escalation_level: int = 0
    decide_within: float = DEFAULT_DECIDE_WITHIN
    reminders: tuple[float, ...] = ()
    on_timeout: TimeoutAction = "protocol"
    #: Seconds before the deadline the time-out acts (None: a tenth of the window, at most
    #: 60): the executor fails the task at the deadline itself.
    timeout_margin: float | None = None
    quorum: int = 1
    role: str = ""
    schema: Mapping[str, Any] | None = None

    def matches(
        self, *, task_type: str, partner: str, question: str, reason_code: str, level: int
    ) -> bool:
        return (
            (not self.task_types or task_type in self.task_types)
            and (not self.partners or partner in self.partners)
            and question in self.questions
            and (not self.reason_codes or reason_code in self.reason_codes)
            and level >= self.min_escalation_level
        )


@dataclass(frozen=True, slots=True)
class HumansConfig:
    """Everything `enable_humans` needs."""

    #: The HMAC key of the links (keep it secret: it makes decisions).
    link_secret: bytes
    routes: tuple[NotifyRoute, ...]
    reviewers: Mapping[str, Person] = field(default_factory=dict)
    channels: Mapping[str, Channel] = field(default_factory=dict)
    #: The origin reviewers reach this peer at (None: the peer's own endpoint's origin).
    public_url: str | None = None
    #: Where the link pages are served on the peer's app.
    path: str = "/humans"

    def __post_init__(self) -> None:
        if len(self.link_secret) < 16:
            raise HumansConfigError("the link secret must be at least 16 bytes")
        for route in self.routes:
            _check_route(self, route)

    def route_for(
        self, *, task_type: str, partner: str, question: str, reason_code: str, level: int
    ) -> NotifyRoute | None:
        for route in self.routes:
            if route.matches(
                task_type=task_type,
                partner=partner,
                question=question,
                reason_code=reason_code,
                level=level,
            ):
                return route
        return None


def _check_route(config: HumansConfig, route: NotifyRoute) -> None:
    where = f"[[notify]] {route.name!r}"
    if not route.levels:
        raise HumansConfigError(f"{where}: needs at least one level ([[notify.level]])")
    for number, level in enumerate(route.levels, 1):
        for reviewer in level.reviewers:
            if reviewer not in config.reviewers:
                raise HumansConfigError(f"{where} level {number}: unknown reviewer {reviewer!r}")
        for channel in level.channels:
            if channel not in config.channels:
                raise HumansConfigError(f"{where} level {number}: unknown channel {channel!r}")
        if not level.channels:
            raise HumansConfigError(f"{where} level {number}: needs a channel")
    if route.on_timeout not in TIMEOUT_ACTIONS:
        raise HumansConfigError(f"{where}: on_timeout must be one of {', '.join(TIMEOUT_ACTIONS)}")
    if not all(0 < f < 1 for f in route.reminders):
        raise HumansConfigError(f"{where}: reminders are fractions between 0 and 1")
    if route.quorum < 1:
        raise HumansConfigError(f"{where}: quorum must be at least 1")
    if route.schema is not None:
        try:
            import jsonschema
        except ImportError as exc:  # pragma: no cover - the humans extra has it
            raise HumansConfigError(
                f"{where}: a schema needs jsonschema ({install('humans')})"
            ) from exc
        try:
            jsonschema.Draft202012Validator.check_schema(dict(route.schema))
        except jsonschema.SchemaError as exc:
            raise HumansConfigError(f"{where}: bad schema: {exc.message}") from exc


# --- from TOML ----------------------------------------------------------------------------------


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise HumansConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _secret(table: Mapping[str, Any], key: str, base: Path, where: str) -> str:
    if key in table:
        value = table[key]
        if not isinstance(value, str):
            raise HumansConfigError(f"{where}: {key} must be a string")
        return value
    file_key = f"{key}_file"
    if file_key in table:
        path = base / Path(str(table[file_key])).expanduser()
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise HumansConfigError(f"{where}: cannot read {path}: {exc.strerror}") from exc
    return ""


def _known(table: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise HumansConfigError(unknown_key(where, unknown[0], keys))


def _duration(value: Any, where: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise HumansConfigError(f"{where}: {exc}") from exc


_CHANNEL_KEYS = (
    "name",
    "kind",
    "url",
    "smtp_host",
    "smtp_port",
    "starttls",
    "username",
    "password",
    "password_file",
    "sender",
    "ca_file",
    "timeout",
)
_ROUTE_KEYS = (
    "name",
    "task_types",
    "partners",
    "questions",
    "reason_codes",
    "min_escalation_level",
    "decide_within",
    "reminders",
    "on_timeout",
    "timeout_margin",
    "quorum",
    "role",
    "schema",
    "schema_file",
    "level",
)


def _channel(raw: Mapping[str, Any], base: Path, index: int) -> Channel:
    where = f"[[humans.channel]] #{index + 1}"
    _known(raw, _CHANNEL_KEYS, where)
    name, kind = raw.get("name"), raw.get("kind")
    if not isinstance(name, str) or not name:
        raise HumansConfigError(f"{where}: needs a name")
    if kind not in CHANNEL_KINDS:
        raise HumansConfigError(f"{where} ({name}): kind must be one of {', '.join(CHANNEL_KINDS)}")
    url = raw.get("url", "")
    if kind != "email" and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise HumansConfigError(f"{where} ({name}): a {kind} channel needs an http(s) url")
    port = raw.get("smtp_port", 587)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise HumansConfigError(f"{where} ({name}): smtp_port must be a port number")
    return Channel(
        name=name,
        kind=kind,
        url=str(url),
        smtp_host=str(raw.get("smtp_host", "127.0.0.1")),
        smtp_port=port,
        starttls=bool(raw.get("starttls", True)),
        username=str(raw.get("username", "")),
        password=_secret(raw, "password", base, where),
        sender=str(raw.get("sender", "synapse@localhost")),
        ca_file=str(base / raw["ca_file"]) if raw.get("ca_file") else "",
        timeout=_duration(raw.get("timeout", 10.0), where),
    )


def _route(raw: Mapping[str, Any], base: Path, index: int) -> NotifyRoute:
    name = raw.get("name") or f"route-{index + 1}"
    where = f"[[notify]] {name!r}"
    _known(raw, _ROUTE_KEYS, where)
    levels_raw = raw.get("level", [])
    if not isinstance(levels_raw, list) or not all(isinstance(x, dict) for x in levels_raw):
        raise HumansConfigError(f"{where}: `level` must be an array of tables ([[notify.level]])")
    levels = []
    for number, level in enumerate(levels_raw, 1):
        _known(level, ("reviewers", "channels", "within"), f"{where} level {number}")
        within = level.get("within")
        levels.append(
            Level(
                reviewers=_strings(level.get("reviewers"), f"{where} level {number}: reviewers"),
                channels=_strings(level.get("channels"), f"{where} level {number}: channels"),
                within=_duration(within, where) if within is not None else None,
            )
        )
    questions = _strings(raw.get("questions"), f"{where}: questions") or QUESTIONS
    if not set(questions) <= set(QUESTIONS):
        raise HumansConfigError(f"{where}: questions are need_human and need_info")
    reminders = raw.get("reminders", [])
    if not isinstance(reminders, list) or not all(
        isinstance(f, int | float) and not isinstance(f, bool) for f in reminders
    ):
        raise HumansConfigError(f"{where}: reminders must be a list of fractions")
    schema = raw.get("schema")
    if "schema_file" in raw:
        path = base / Path(str(raw["schema_file"])).expanduser()
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HumansConfigError(f"{where}: cannot read the schema {path}: {exc}") from exc
    if schema is not None and not isinstance(schema, dict):
        raise HumansConfigError(f"{where}: schema must be a table (a JSON Schema object)")
    for key in ("quorum", "min_escalation_level"):
        if key in raw and (not isinstance(raw[key], int) or isinstance(raw[key], bool)):
            raise HumansConfigError(f"{where}: {key} must be an integer")
    return NotifyRoute(
        name=str(name),
        levels=tuple(levels),
        task_types=frozenset(_strings(raw.get("task_types"), f"{where}: task_types")),
        partners=frozenset(_strings(raw.get("partners"), f"{where}: partners")),
        questions=frozenset(questions),
        reason_codes=frozenset(_strings(raw.get("reason_codes"), f"{where}: reason_codes")),
        min_escalation_level=int(raw.get("min_escalation_level", 0)),
        decide_within=_duration(raw.get("decide_within", DEFAULT_DECIDE_WITHIN), where),
        reminders=tuple(float(f) for f in reminders),
        on_timeout=raw.get("on_timeout", "protocol"),
        timeout_margin=(
            _duration(raw["timeout_margin"], where) if "timeout_margin" in raw else None
        ),
        quorum=int(raw.get("quorum", 1)),
        role=str(raw.get("role", "")),
        schema=schema,
    )


def humans_config_from_toml(
    humans: Mapping[str, Any], notify: Sequence[Mapping[str, Any]], *, base: Path
) -> HumansConfig:
    """The configuration of a TOML file's `[humans]` table and `[[notify]]` routes
    (`base`: the directory the file's relative paths start from)."""
    where = "[humans]"
    _known(
        humans,
        ("public_url", "link_secret", "link_secret_file", "path", "reviewer", "channel"),
        where,
    )
    secret = _secret(humans, "link_secret", base, where)
    if not secret:
        raise HumansConfigError(f"{where}: needs link_secret or link_secret_file")
    reviewers: dict[str, Person] = {}
    for index, raw in enumerate(humans.get("reviewer", [])):
        at = f"[[humans.reviewer]] #{index + 1}"
        _known(raw, ("id", "name", "email", "role"), at)
        if not isinstance(raw.get("id"), str) or not raw["id"]:
            raise HumansConfigError(f"{at}: needs an id")
        reviewers[raw["id"]] = Person(
            raw["id"], str(raw.get("name", "")), str(raw.get("email", "")), str(raw.get("role", ""))
        )
    channels = {}
    for index, raw in enumerate(humans.get("channel", [])):
        channel = _channel(raw, base, index)
        channels[channel.name] = channel
    public_url = humans.get("public_url")
    if public_url is not None and not (
        isinstance(public_url, str) and public_url.startswith(("http://", "https://"))
    ):
        raise HumansConfigError(f"{where}: public_url must be an http(s) URL")
    return HumansConfig(
        link_secret=secret.encode(),
        routes=tuple(_route(raw, base, i) for i, raw in enumerate(notify)),
        reviewers=reviewers,
        channels=channels,
        public_url=public_url,
        path=str(humans.get("path", "/humans")),
    )


__all__ = [
    "CHANNEL_KINDS",
    "QUESTIONS",
    "TIMEOUT_ACTIONS",
    "Channel",
    "ChannelKind",
    "HumansConfig",
    "HumansConfigError",
    "Level",
    "NotifyRoute",
    "Person",
    "QuestionKind",
    "TimeoutAction",
    "humans_config_from_toml",
]
