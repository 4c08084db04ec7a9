"""A router's A2A partners: a routed task sent as an A2A message, followed to its end (its
questions asked of the original requester, its progress relayed), stopped with the original
task, and followed again after the router restarts (the sub-task is noted with the original
task: `ExecutionContext.note`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import aiohttp

from synapse.logs import get_logger
from synapse.router.a2a_members import A2AMember, a2a_declined, a2a_message, percent
from synapse.router.outcomes import Declined, Routed
from synapse.router.pool import Member
from synapse.router.relay import Relay
from synapse.types import ErrorCode, MissingField, Reason

if TYPE_CHECKING:
    from synapse.a2a.client.core import A2ATaskHandle

log = get_logger("synapse.router")

#: The note an original task keeps of its A2A sub-task (partner, remote task id, part).
A2A_NOTE: Final = "routed_a2a"


class A2ARouting:
    """The `Router`'s methods for its A2A partners (a base of `Router`)."""

    _a2a: dict[str, A2AMember]

    def _commit(self, member: Member, relay: Relay, part: int) -> None:
        raise NotImplementedError

    def _checked(self, member: Member, task_type: str, routed: Routed) -> Routed:
        raise NotImplementedError

    async def _attempt_a2a(
        self, member: Member, relay: Relay, task_type: str, payload: Mapping[str, Any], part: int
    ) -> Routed | Declined:
        from synapse.a2a.errors import A2AError

        client = self._a2a[member.name].client
        if client is None:
            return Declined(
                member.name, ErrorCode.AGENT_NOT_READY.value, "no card", unreachable=True
            )
        try:
            handle = await client.send(message=a2a_message(relay, task_type, payload))
        except A2AError as exc:
            unreachable = isinstance(exc.__cause__, aiohttp.ClientConnectionError | TimeoutError)
            return Declined(
                member.name,
                ErrorCode.AGENT_NOT_READY.value if unreachable else f"a2a:{exc.code}",
                exc.message,
                unreachable=True,  # an agent that errs on a new message is not used again now
            )
        if handle.task_id:  # kept with the original task: a restarted router follows it again
            await relay.ctx.note(A2A_NOTE, partner=member.name, task_id=handle.task_id, part=part)
        return await self._watch_a2a(member, relay, handle, task_type, part)

    async def _resume_a2a(
        self, member: Member, relay: Relay, task_id: str, task_type: str, part: int
    ) -> Routed | None:
        """Follow again the A2A sub-task a router started before its restart (None: the
        agent no longer has it, or cannot be asked now)."""
        from synapse.a2a.errors import A2AError

        client = self._a2a[member.name].client
        if client is None:
            return None
        try:
            handle = await client.attach(task_id)
        except A2AError as exc:
            log.warning("route_a2a_resume_failed", task_id=relay.task_id, error=exc.message)
            return None
        log.info("route_a2a_resumed", task_id=relay.task_id, partner=member.name, remote=task_id)
        followed = await self._watch_a2a(member, relay, handle, task_type, part)
        return followed if isinstance(followed, Routed) else None

    async def _watch_a2a(
        self, member: Member, relay: Relay, handle: A2ATaskHandle, task_type: str, part: int
    ) -> Routed | Declined:
        try:
            return await self._follow_a2a(member, relay, handle, task_type, part)
        except asyncio.CancelledError:
            await self._stop_a2a(handle, relay)
            raise
        finally:
            await handle.close()

    async def _follow_a2a(
        self, member: Member, relay: Relay, handle: A2ATaskHandle, task_type: str, part: int
    ) -> Routed | Declined:
        from synapse.a2a import wire

        accepted = False
        answered: set[str] = set()
        async for event in handle:
            if not accepted:
                if event.state == wire.REJECTED:
                    return a2a_declined(member.name, event.text, event.data)
                accepted = True
                self._commit(member, relay, part)
            if event.state == wire.WORKING and event.kind == "status_update":
                data = event.data if isinstance(event.data, dict) else {}
                await relay.progress(
                    percent(data.get("progress")), event.text, data.get("intermediate_result")
                )
            elif event.state == wire.INPUT_REQUIRED:
                question = handle.status_message
                marker = question.message_id if question is not None else ""
                if marker in answered:
                    continue
                answered.add(marker)
                await self._answer_a2a(relay, handle, event.text, event.data, question)
        outcome = await handle
        routed = Routed(
            member.name, outcome.state, outcome.result, outcome.error, (), handle.task_id
        )
        return self._checked(member, task_type, routed)

    async def _answer_a2a(
        self, relay: Relay, handle: A2ATaskHandle, text: str, data: Any, question: Any
    ) -> None:
        from synapse.a2a import mapping

        metadata = question.metadata if question is not None else None
        needs = mapping.meta_value(metadata, mapping.NEEDS_KEY, mapping.LEGACY_NEEDS_KEY)
        data = data if isinstance(data, dict) else {}
        if needs == "human_decision":
            reason = data.get("reason") if isinstance(data.get("reason"), dict) else {}
            decision = await relay.need_human(
                Reason(code=str(reason.get("code") or "a2a_input_required"), message=text)
            )
            await handle.approve(decision.decision.approved_fields, notes=decision.notes)
            return
        listed = data.get("missing_fields")
        fields: list[MissingField] = []
        if isinstance(listed, list):
            fields = [
                MissingField(
                    field=str(f["field"]),
                    reason=str(f.get("reason") or ""),
                    suggested_value=f.get("suggested_value"),
                    alternatives=list(alternatives)
                    if isinstance(alternatives := f.get("alternatives"), list)
                    else [],
                )
                for f in listed
                if isinstance(f, dict) and f.get("field")
            ]
        if fields:
            answer = await relay.need_info(fields, question=text)
            await handle.provide_info(answer)
            return
        # Another agent's free-text question: one field, `answer`, sent back as text.
        answer = await relay.need_info(
            [MissingField(field="answer", reason=text or "the agent asks for input")],
            question=text,
        )
        await handle.reply(str(answer.get("answer", "")))

    async def _stop_a2a(self, handle: A2ATaskHandle, relay: Relay) -> None:
        from synapse.a2a.errors import A2AError

        if handle.settled:
            return
        rejected = relay.human_rejection()
        with contextlib.suppress(A2AError, TimeoutError):
            if rejected is not None:
                await asyncio.wait_for(handle.reject(rejected), 10)
            else:
                await asyncio.wait_for(handle.cancel("the original task was cancelled"), 10)


__all__ = ["A2A_NOTE", "A2ARouting"]
