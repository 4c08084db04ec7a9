"""Human decisions where the people are: notify reviewers by e-mail and webhooks (Slack,
Teams, any JSON endpoint) when a task of ours waits on `need_human` or `need_info`; remind,
escalate and time out by policy; take the decision from a signed link; keep each step in the
task's hash-chained audit trail. See `docs/humans.md`."""

from synapse.humans.config import (
    Channel,
    HumansConfig,
    HumansConfigError,
    Level,
    NotifyRoute,
    Person,
    humans_config_from_toml,
)
from synapse.humans.links import LinkRefused, LinkSigner
from synapse.humans.service import Humans, enable_humans

__all__ = [
    "Channel",
    "Humans",
    "HumansConfig",
    "HumansConfigError",
    "Level",
    "LinkRefused",
    "LinkSigner",
    "NotifyRoute",
    "Person",
    "enable_humans",
    "humans_config_from_toml",
]
