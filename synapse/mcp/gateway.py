"""The partners an MCP client may delegate to, and the tasks delegated: Synapse peers through
one requester `Peer` (signed callbacks, its store), A2A agents through an `A2AClient` each.

`Gateway` is what the MCP tools call; it knows nothing of MCP. A partner is named by its agent
id (Synapse) or by the name it was given (A2A: `NAME=URL`, else its card's name).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from synapse.a2a import A2AClient, A2AError
from synapse.mcp.tracking import Delegation
from synapse.p2p.engine import TaskKey
from synapse.runtime.sender import DeliveryError
from synapse.transport.peer import Peer
from synapse.types import Priority, SynapseException

#: How long `list_partners` waits for each partner's answer before calling it unreachable.
PROBE_TIMEOUT = 3.0


class GatewayError(SynapseException):
    """A tool call that cannot be carried out, said in one line for the MCP client."""


@dataclass(slots=True)
class A2APartner:
    """An A2A agent by URL, discovered on first use."""

    name: str
    url: str
    client: A2AClient


class Gateway:
    """Delegates tasks to Synapse peers (`peer`) and A2A agents (`a2a`), and follows them."""

    def __init__(self, peer: Peer | None = None, a2a: Iterable[A2APartner] = ()) -> None:
        self.peer = peer
        self.a2a: dict[str, A2APartner] = {p.name: p for p in a2a}
        self._tasks: dict[str, Delegation] = {}

    # --- partners -------------------------------------------------------------------------

    def partner_names(self) -> list[str]:
        return self._synapse_names() + list(self.a2a)

    async def partners(self) -> list[dict[str, Any]]:
        """Every partner, with what it can do and whether it answers now (probed at once)."""
        probes = [self._probe_synapse(name) for name in self._synapse_names()]
        probes += [self._probe_a2a(partner) for partner in self.a2a.values()]
        return list(await asyncio.gather(*probes))

    def _synapse_names(self) -> list[str]:
        return [p.agent_id for p in self.peer.partners] if self.peer is not None else []

    async def _probe_synapse(self, name: str) -> dict[str, Any]:
        assert self.peer is not None
        out: dict[str, Any] = {
            "name": name,
            "protocol": "synapse",
            "endpoint": self.peer.partners[name].endpoint,
            "reachable": False,
            "capabilities": [],
        }
        try:
            answer = await asyncio.wait_for(self.peer.capabilities(name), PROBE_TIMEOUT)
        except (SynapseException, TimeoutError, OSError) as exc:
            out["error"] = _one_line(exc)
            return out
        out["reachable"] = True
        out["capabilities"] = [msgspec.to_builtins(c) for c in answer.capabilities]
        return out

    async def _probe_a2a(self, partner: A2APartner) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": partner.name,
            "protocol": "a2a",
            "endpoint": partner.url,
            "reachable": False,
            "capabilities": [],
        }
        try:
            card = await asyncio.wait_for(partner.client.discover(), PROBE_TIMEOUT)
        except (A2AError, TimeoutError, OSError) as exc:
            out["error"] = _one_line(exc)
            return out
        out["reachable"] = True
        out["description"] = card.description
        out["capabilities"] = [
            {"name": s.id, "description": s.description or s.name} for s in card.skills
        ]
        return out

    # --- tasks ------------------------------------------------------------------------------

    async def delegate(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None,
        *,
        deadline: datetime | None = None,
        priority: Priority = Priority.NORMAL,
        owner: str | None = None,
    ) -> Delegation:
        """Start a task at `partner` for `owner`; the delegation follows it."""
        if partner in self.a2a:
            client = self.a2a[partner].client
            try:
                a2a_handle = await client.send(dict(payload or {}), task_type=task_type)
            except A2AError as exc:
                raise GatewayError(f"{partner} refused or could not be reached: {exc}") from exc
            task = Delegation(a2a_handle, partner=partner, task_type=task_type, owner=owner)
        elif self.peer is not None and partner in self.peer.partners:
            try:
                handle = await self.peer.submit(
                    partner, task_type, payload, priority=priority, deadline=deadline
                )
            except (SynapseException, ValueError) as exc:
                raise GatewayError(f"cannot request a task of {partner}: {exc}") from exc
            task = Delegation(handle, partner=partner, task_type=task_type, owner=owner)
        else:
            known = ", ".join(self.partner_names()) or "none"
            raise GatewayError(f"unknown partner {partner!r} (known: {known})")
        self._tasks[task.task_id] = task
        return task

    def get(self, task_id: str, *, owner: str | None = None) -> Delegation:
        """The task by id: followed here, or a Synapse task from the store. Another
        principal's task is not found, as if it did not exist."""
        task = self._tasks.get(task_id)
        if task is not None:
            if task.owner is not None and task.owner != owner:
                raise GatewayError(f"no task {task_id!r} delegated through this server")
            return task
        if self.peer is not None and _started(self.peer):
            handle = self.peer.protocol.handle(TaskKey(self.peer.agent_id, task_id))
            if handle is not None:
                rec = handle.record
                follow = not rec.state.is_final
                task = Delegation(
                    handle, partner=rec.partner, task_type=rec.task.type, follow=follow
                )
                self._tasks[task_id] = task
                return task
        raise GatewayError(f"no task {task_id!r} delegated through this server")

    def tasks(self, *, owner: str | None = None) -> list[Delegation]:
        """Every task followed here and every Synapse task this requester keeps, but
        those of other principals."""
        if self.peer is not None and _started(self.peer):
            prefix = f"{self.peer.agent_id}/"
            for key in self.peer.protocol.list_tasks():
                task_id = key.removeprefix(prefix)
                if key.startswith(prefix) and task_id not in self._tasks:
                    with contextlib.suppress(GatewayError):
                        self.get(task_id)
        return [t for t in self._tasks.values() if t.owner is None or t.owner == owner]

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            await task.close()
        for partner in self.a2a.values():
            await partner.client.close()


def _started(peer: Peer) -> bool:
    try:
        peer.protocol  # noqa: B018 - raises until the peer is started
    except SynapseException:
        return False
    return True


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {PROBE_TIMEOUT:g} s"
    if isinstance(exc, DeliveryError):
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return str(cause) or type(cause).__name__
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


__all__ = ["A2APartner", "Gateway", "GatewayError"]
